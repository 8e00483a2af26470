#!/usr/bin/env bash
# `make test`: the Python suite; with IMAGES=1 (the default) the cpu images' two builds each
# (`make image-verify`) run beside it, then the image checks (`make image-checks`) and the deploy
# sequence (`make deploy-test`). The builds are mostly disk work (buildah's vfs store copies a
# rootfs a layer, and removes it) and the suite mostly CPU work: side by side each takes 1.3-1.8x
# its time alone, together less than one after the other (README.md, `make test`). The
# stand-in deploy tests (tests/deploy/test_deploy_standin.py: Docker, no specpair image, mostly
# Ansible's CPU) leave the suite then and run beside the deploy sequence, whose health and join
# waits leave CPU idle, instead of lengthening the suite the builds wait for. Each part's time
# is printed at the end.
# Exit: the first failing part's status (every part still runs once the builds started: the
# suite's failure does not leave the builds behind).
# Environment: IMAGES (1), MAKE (make), PY (.venv/bin/python), IMAGE_TEST_GB (20).
set -uo pipefail
cd "$(dirname "$0")/.."
make=${MAKE:-make}
py=${PY:-.venv/bin/python}
declare -a times
rc=0
t0=$(date +%s)

took() { times+=("$1 $(( $(date +%s) - $2 )) s"); }

if [ "${IMAGES:-1}" = 1 ]; then
  scripts/disk-check.sh "${IMAGE_TEST_GB:-20}" "make test (its image part)" build /var/lib/docker \
    || exit 1
  mkdir -p build
  log=build/image-verify.log
  echo ">> the cpu images, each built twice (make image-verify), beside the Python suite; log: $log"
  ( s=$(date +%s); "$make" --no-print-directory image-verify > "$log" 2>&1; v=$?
    echo "$(( $(date +%s) - s ))" > build/image-verify.seconds; exit $v ) &
  verify=$!
fi

standin=tests/deploy/test_deploy_standin.py
declare -a suite_args=()
[ "${IMAGES:-1}" != 1 ] || suite_args=(--ignore="$standin")  # run beside the deploy sequence
s=$(date +%s)
"$py" -m pytest --durations=25 "${suite_args[@]}" || rc=$?
took "python suite" "$s"

if [ "${IMAGES:-1}" = 1 ]; then
  echo ">> waiting for the image builds (log: $log)"
  v=0; wait "$verify" || v=$?
  cat "$log"
  times+=("image builds (beside the suite) $(cat build/image-verify.seconds 2>/dev/null || echo '?') s")
  [ "$rc" != 0 ] || rc=$v
  if [ "$v" = 0 ]; then
    s=$(date +%s)
    "$make" --no-print-directory image-checks || { v=$?; [ "$rc" != 0 ] || rc=$v; }
    took "image checks" "$s"
  fi
  # the stand-in's tests need no specpair image: they run even when the images failed
  s=$(date +%s)
  slog=build/deploy-standin.log
  echo ">> the stand-in deploy tests ($standin) beside the deploy sequence; log: $slog"
  ( s=$(date +%s); "$py" -m pytest -v --durations=5 "$standin" > "$slog" 2>&1; w=$?
    echo "$(( $(date +%s) - s ))" > build/deploy-standin.seconds; exit $w ) &
  standin_pid=$!
  if [ "$v" = 0 ]; then
    "$make" --no-print-directory deploy-test || { v=$?; [ "$rc" != 0 ] || rc=$v; }
  fi
  w=0; wait "$standin_pid" || w=$?
  cat "$slog"
  [ "$rc" != 0 ] || rc=$w
  took "deploy sequence" "$s"
  times+=("stand-in deploy tests (beside it) $(cat build/deploy-standin.seconds 2>/dev/null || echo '?') s")
fi

took "total" "$t0"
echo ">> step times: $(IFS=';'; echo "${times[*]}" | sed 's/;/; /g')"
exit "$rc"
