#!/usr/bin/env bash
# Run the gate suite (`pytest -m gate tests/gates`, full size) INSIDE built images.
#
# Usage: scripts/image-gates.sh [--expect-fail REGEX [--must-fail REGEX]] IMAGE...
#   For each IMAGE (e.g. specpair-target:cpu): `docker run --network none` the image's own pytest
#   over its own tests/gates, JUnit XML to build/gates/<name>.xml, then a summary (pass / fail /
#   skip with reasons). Exit 1 if any gate failed or errored.
#   --expect-fail REGEX  power check (an image built with a fix left out): exit 0 only if the suite
#                        FAILED and every failed test's id matches REGEX; any other outcome exits 1.
#   --must-fail REGEX    with --expect-fail: a failed test must match REGEX (the gate that has to
#                        catch the bug; the others may fail too, e.g. the attestation gate).
# Environment: GATES_OUT (default build/gates), SPECPAIR_GATE_SIZE (default full),
#              GATES_NETWORK (none | host; default none), GATES_SELECT (a pytest -k expression
#              narrowing the suite; default: every gate).
set -euo pipefail
cd "$(dirname "$0")/.."

expect=""
must=""
if [ "${1:-}" = --expect-fail ]; then expect=${2:?--expect-fail needs a REGEX}; shift 2; fi
if [ "${1:-}" = --must-fail ]; then must=${2:?--must-fail needs a REGEX}; shift 2; fi
[ $# -gt 0 ] || { echo "usage: scripts/image-gates.sh [--expect-fail REGEX] IMAGE..." >&2; exit 2; }
out=${GATES_OUT:-build/gates}
size=${SPECPAIR_GATE_SIZE:-full}
network=${GATES_NETWORK:-none}
case "$network" in none|host) ;; *) echo "error: GATES_NETWORK must be none or host" >&2; exit 2;; esac
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
  echo ">> gates in $image ($(docker image inspect --format '{{.Id}}' "$image" | cut -c1-19)," \
       "network $network, size $size) -> $xml"
  start=$(date +%s)
  rc=0
  docker run --rm --network "$network" --user 0 \
    -e SPECPAIR_GATE_SIZE="$size" -v "$(realpath "$out"):/gates-out" "$image" \
    pytest -m gate tests/gates -p no:cacheprovider -q -rs --junitxml="/gates-out/$name.xml" \
    ${GATES_SELECT:+-k "$GATES_SELECT"} || rc=$?
  echo ">> $image: pytest exit $rc in $(( $(date +%s) - start ))s"
  if [ ! -s "$xml" ]; then
    echo "error: no JUnit XML from $image (pytest exit $rc)" >&2
    status=1
    continue
  fi
  args=("$xml" --exit-code "$rc")
  [ -n "$expect" ] && args+=(--expect-fail "$expect")
  [ -n "$must" ] && args+=(--must-fail "$must")
  python3 scripts/image_gates_report.py "${args[@]}" || status=1
done
exit $status
