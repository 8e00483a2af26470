#!/usr/bin/env bash
# Fail early, with numbers, when a filesystem lacks the space a long job needs.
# Usage: scripts/disk-check.sh NEED_GB WHAT PATH...   (each PATH, or its nearest existing parent)
set -euo pipefail
need=${1:?usage: scripts/disk-check.sh NEED_GB WHAT PATH...}
what=${2:?usage: scripts/disk-check.sh NEED_GB WHAT PATH...}
shift 2
for path in "$@"; do
  while [ ! -e "$path" ]; do path=$(dirname "$path"); done
  free=$(( $(df -B1 --output=avail "$path" | tail -1) / 1000000000 ))
  if [ "$free" -lt "$need" ]; then
    echo "error: $what needs about $need GB free on the filesystem of $path; it has $free GB." >&2
    echo "       make image-prune frees what earlier builds left; docker system df shows the rest." >&2
    exit 1
  fi
  echo ">> disk: $free GB free on the filesystem of $path ($what needs about $need)"
done
