#!/usr/bin/env bash
# Install the proxies orchard-rec is compared with, each into its own venv under the bench cache
# (reused when present). Package index only; their lightest configurations are set in bench/run.py.
set -euo pipefail
CACHE=${ORCHARD_BENCH_CACHE:-$HOME/.cache/orchard-rec/bench}
mkdir -p "$CACHE"
if [ ! -x "$CACHE/litellm/bin/litellm" ]; then
  python3 -m venv "$CACHE/litellm" && "$CACHE/litellm/bin/pip" install -q "litellm[proxy]==1.108.7"
fi
if [ ! -x "$CACHE/rllm/bin/rllm-model-gateway" ]; then
  python3 -m venv "$CACHE/rllm" && "$CACHE/rllm/bin/pip" install -q "rllm-model-gateway==0.1.0"
fi
echo "competitors in $CACHE"
