#!/usr/bin/env bash
# What emulated hosts need (tfperf.cluster.hosts, recipes/across_hosts.py): iproute2 (ip, tc) for namespaces and shaped
# links, and openssh-server for an sshd in each host, so that horovodrun -H reaches them as it reaches machines.
# Installed only where apt-get can (root on Debian or Ubuntu, as in CI); elsewhere the hosts recipe runs over
# loopback and says why, and the hosts tests are skipped.
set -euo pipefail
missing=()
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || missing+=(iproute2)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
((${#missing[@]})) || exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; }
else
  echo "install_hosts.sh: ${missing[*]} missing and no root apt-get: emulated hosts are not available" \
       "(the recipes run over loopback, and say so)" >&2
fi
