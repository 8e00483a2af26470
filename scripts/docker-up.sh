#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine; start one if none does.
#
# - Installs docker.io with apt when no `dockerd` is on PATH (needs root).
# - Starts dockerd with `--bridge=none --iptables=false` (docs/facts.md section 5: no bridge, no
#   NAT; every container and build uses `--network host` or `--network none`), logging to
#   $SPECPAIR_DOCKERD_LOG (default /var/log/specpair-dockerd.log).
# - Waits until `docker info` answers (at most $SPECPAIR_DOCKERD_WAIT_S seconds, default 60).
# An engine that already runs is left alone, whatever its flags.
#
# Usage: scripts/docker-up.sh        (idempotent; exit 0 once `docker info` answers)
set -euo pipefail

log=${SPECPAIR_DOCKERD_LOG:-/var/log/specpair-dockerd.log}
wait_s=${SPECPAIR_DOCKERD_WAIT_S:-60}

engine_answers() { docker info >/dev/null 2>&1; }

if command -v docker >/dev/null && engine_answers; then
  echo ">> docker engine already running"
  exit 0
fi

if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "error: no dockerd on PATH; install docker.io (needs root and apt-get)" >&2
    exit 1
  fi
  echo ">> installing docker.io (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi

if pgrep -x dockerd >/dev/null; then
  echo ">> dockerd is running but not answering yet; waiting"
else
  echo ">> starting dockerd --bridge=none --iptables=false (log: $log)"
  mkdir -p "$(dirname "$log")"
  # setsid: the daemon outlives this script and the make/CI process group that ran it.
  setsid dockerd --bridge=none --iptables=false --ip-masq=false >>"$log" 2>&1 </dev/null &
fi

for _ in $(seq 1 "$wait_s"); do
  if engine_answers; then
    echo ">> docker engine up: $(docker version --format '{{.Server.Version}}')"
    exit 0
  fi
  sleep 1
done
echo "error: dockerd did not answer within ${wait_s}s; last lines of $log:" >&2
tail -n 20 "$log" >&2 || true
exit 1
