#!/usr/bin/env bash
# The load generators in C that `tfperf load` drives and its benchmarks compare with (issue 49): h2load (Debian's
# nghttp2-client) sends the closed loops through sockets at a tenth of the CPU a request of tfperf's Python client,
# CPU the server it shares the machine with keeps; wrk is benchmarks/load_client_cost.py's reference. Installed only
# where apt-get can (root on Debian or Ubuntu, as in CI); elsewhere `tfperf load` uses its Python client and says so.
set -euo pipefail
missing=()
command -v h2load >/dev/null 2>&1 || missing+=(nghttp2-client)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
((${#missing[@]})) || exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
else
  echo "install_load_clients.sh: ${missing[*]} missing and no root apt-get: tfperf load sends through sockets with" \
       "its Python client (apt-get install nghttp2-client wrk)" >&2
fi
