#!/usr/bin/env bash
# Run the gate suite (`pytest -m gate tests/gates`, full size) INSIDE built images.
#
# Usage: images/bin/image-gates.sh [--expect-fail REGEX [--must-fail REGEX]] IMAGE...
#        images/bin/image-gates.sh --detect     print what the GPU detection below finds, run nothing
#   For each IMAGE (e.g. specpair-target:cpu-0.1.0, images/bin/image-tag.sh): `docker run --network
#   none` the image's own pytest over its own tests/gates, JUnit XML to build/gates/<name>.xml,
#   then a summary (pass / fail / skip with reasons). Exit 1 if any gate failed or errored.
#   --expect-fail REGEX  power check (an image built with a fix left out): exit 0 only if the suite
#                        FAILED and every failed test's id matches REGEX; any other outcome exits 1.
#   --must-fail REGEX    with --expect-fail: a failed test must match REGEX (the gate that has to
#                        catch the bug; the others may fail too, e.g. the attestation gate).
# GPUs: where this host has NVIDIA devices (/dev/nvidia<N> or /proc/driver/nvidia), the gate
#   container gets them (`docker run --gpus all`) and SPECPAIR_HOST_GPUS names what was found: an
#   NVML gate that then finds no GPU FAILS (tests/gates/test_nvml_gate.py). Only a host with no
#   NVIDIA device at all lets the NVML gates skip; the report says which case it was.
# arm64 images on another architecture run under qemu (images/bin/arm64-emulation.sh first).
# Environment: GATES_OUT (default build/gates), SPECPAIR_GATE_SIZE (default full),
#              GATES_NETWORK (none | host; default none), GATES_SELECT (a pytest -k expression
#              narrowing the suite; default: every gate), GATES_TESTS (the test files or
#              directories inside the image, space-separated, each under tests/gates; default
#              tests/gates), GATES_DEVICE_ROOT (a stand-in root the GPU detection looks under,
#              for tests; default /).
#   Under qemu (gb10 on x86_64) nothing may import torch: oneDNN cannot read MIDR_EL1 and the
#   process dies. pytest imports every module it collects, before -k deselects, so there
#   GATES_TESTS must name only torch-free gate files (tests/gates/test_attestation_gate.py).
set -euo pipefail
cd "$(dirname "$0")/../.."

# This host's NVIDIA devices, space-separated ("" when none).
host_gpus() {
  local root=${GATES_DEVICE_ROOT:-} p found=()
  for p in "$root"/dev/nvidia[0-9]* "$root"/proc/driver/nvidia; do
    [ -e "$p" ] && found+=("${p#"$root"}")
  done
  echo "${found[*]}"
}
gpus=$(host_gpus)
gpu_args=()
[ -z "$gpus" ] || gpu_args=(--gpus all)
if [ "${1:-}" = --detect ]; then
  echo "SPECPAIR_HOST_GPUS=$gpus"
  echo "DOCKER_GPU_ARGS=${gpu_args[*]}"
  exit 0
fi

expect=""
must=""
if [ "${1:-}" = --expect-fail ]; then expect=${2:?--expect-fail needs a REGEX}; shift 2; fi
if [ "${1:-}" = --must-fail ]; then must=${2:?--must-fail needs a REGEX}; shift 2; fi
[ $# -gt 0 ] || { echo "usage: images/bin/image-gates.sh [--expect-fail REGEX] IMAGE..." >&2; exit 2; }
out=${GATES_OUT:-build/gates}
size=${SPECPAIR_GATE_SIZE:-full}
network=${GATES_NETWORK:-none}
case "$network" in none|host) ;; *) echo "error: GATES_NETWORK must be none or host" >&2; exit 2;; esac
read -r -a tests <<< "${GATES_TESTS:-tests/gates}"
for t in "${tests[@]}"; do
  case "$t" in
    tests/gates|tests/gates/*) [[ "$t" =~ ^[A-Za-z0-9_./-]+$ && "$t" != *..* ]] && continue ;;
  esac
  echo "error: GATES_TESTS: '$t' is not a path under tests/gates" >&2; exit 2
done
mkdir -p "$out"
scripts/docker-up.sh >/dev/null

status=0
for image in "$@"; do
  if ! docker image inspect "$image" >/dev/null 2>&1; then
    echo "error: image $image is not loaded in docker; build it with \`make image\`" >&2
    exit 1
  fi
  name=${image//[:\/]/-}
  xml=$out/$name.xml
  rm -f "$xml"
  arch=$(docker image inspect --format '{{.Architecture}}' "$image")
  [ "$arch" != arm64 ] || images/bin/arm64-emulation.sh >/dev/null
  echo ">> gates in $image ($(docker image inspect --format '{{.Id}}' "$image" | cut -c1-19)," \
       "linux/$arch, network $network, size $size," \
       "GPUs: ${gpus:+host has $gpus: --gpus all}${gpus:-none on this host}) -> $xml"
  start=$(date +%s)
  rc=0
  docker run --rm --network "$network" --user 0 "${gpu_args[@]}" \
    -e SPECPAIR_GATE_SIZE="$size" -e SPECPAIR_HOST_GPUS="$gpus" \
    -v "$(realpath "$out"):/gates-out" "$image" \
    pytest -m gate "${tests[@]}" -p no:cacheprovider -q -rs --junitxml="/gates-out/$name.xml" \
    ${GATES_SELECT:+-k "$GATES_SELECT"} || rc=$?
  echo ">> $image: pytest exit $rc in $(( $(date +%s) - start ))s"
  if [ ! -s "$xml" ]; then
    echo "error: no JUnit XML from $image (pytest exit $rc)" >&2
    status=1
    continue
  fi
  args=("$xml" --exit-code "$rc" --host-gpus "$gpus")
  [ -n "$expect" ] && args+=(--expect-fail "$expect")
  [ -n "$must" ] && args+=(--must-fail "$must")
  python3 images/bin/image_gates_report.py "${args[@]}" || status=1
done
exit $status
