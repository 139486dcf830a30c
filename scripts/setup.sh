#!/usr/bin/env bash
# Create .venv and install sluice with everything its tests and demo need.
# Idempotent: a second run only checks. Set SLUICE_SKIP_APT=1 to skip Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.sluice-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  # torch is pinned: a bare requirement would pull a multi-GB CUDA build.
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e ".[torch,ray,s3,postgres,dev]"
  touch "$stamp"
fi
# Debian tools some integration tests and benchmarks use (stress-ng for fault injection, nftables
# for per-node network egress,
# nginx as a real HTTP source, iperf3 for the network lab `sluice net bench`, prometheus to scrape
# /metrics in tests/integration/test_prometheus.py, chromium and its chromedriver for the
# dashboard's browser tests in tests/browser). Only when we are root and apt exists; tests skip
# with a clear reason when a tool is missing.
if [ "${SLUICE_SKIP_APT:-0}" != "1" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  missing=""
  for tool in stress-ng nginx iperf3 prometheus chromium; do command -v "$tool" >/dev/null || missing="$missing $tool"; done
  command -v chromedriver >/dev/null || missing="$missing chromium-driver"  # the package's name differs from its command's
  # nft counts each virtual node's network egress (agent/node_net.py); package and command differ.
  command -v nft >/dev/null || [ -x /usr/sbin/nft ] || missing="$missing nftables"
  # PostgreSQL server binaries (initdb, pg_ctl) live outside PATH on Debian; the store tests start one.
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$missing postgresql"
  if [ -n "$missing" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null) \
      || echo "warning: could not install$missing; tests that need them will skip" >&2
  fi
fi
