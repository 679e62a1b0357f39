"""deploy/ manifests validate against the Kubernetes schemas (kubernetes-validate, strict)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
def test_manifests_are_valid_kubernetes() -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "orchard-rec.yaml").read_text()) if d]
    assert {d["kind"] for d in docs} == {"Secret", "Job", "Deployment", "Service"}
    for doc in docs:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert (
        container["readinessProbe"]["httpGet"]["path"]
        == "/healthz"
        == container["livenessProbe"]["httpGet"]["path"]
    )
    job = next(d for d in docs if d["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["orchard-rec", "db", "upgrade"]
