#!/usr/bin/env bash
# Install what the image targets need, when missing (Debian/Ubuntu, root): docker.io, buildah,
# mmdebstrap, docker-compose (v1: bookworm has no compose v2 plugin), busybox-static (the deploy
# tests' stand-in image, tests/deploy/test_deploy_standin.py), then make sure a Docker
# engine runs (scripts/docker-up.sh: dockerd --bridge=none --iptables=false).
# Usage: images/bin/image-tools.sh        (idempotent; prints nothing to install when all present)
set -euo pipefail
cd "$(dirname "$0")/../.."

missing=()
for pair in dockerd:docker.io buildah:buildah mmdebstrap:mmdebstrap docker-compose:docker-compose \
    busybox:busybox-static; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "error: missing ${missing[*]}; install them (apt-get install ${missing[*]}) as root" >&2
    exit 1
  fi
  echo ">> installing ${missing[*]} (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    "${missing[@]}" >/dev/null
fi
scripts/docker-up.sh
