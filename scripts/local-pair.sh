#!/usr/bin/env bash
# The local CPU pair (compose/local-cpu.yml): drafter + vLLM target, host networking on 127.0.0.1.
#
# Usage: scripts/local-pair.sh up     build the missing images, start the pair, wait for health,
#                                     send one real completion, print vLLM's acceptance figures
#        scripts/local-pair.sh down   stop and remove the pair
# Environment: SPECPAIR_TP [1]: 2 runs the target as production does, two tensor-parallel ranks
#   as two containers, rank 1 headless (compose/local-cpu-tp2.yml over compose/local-cpu.yml;
#   one core a rank: slower than TP = 1 on a 2-core box, the production shape), with
#   SPECPAIR_MASTER_PORT [7361] their rendezvous; SPECPAIR_TARGET_PORT [8360], SPECPAIR_DRAFTER_PORT [7360],
#   SPECPAIR_METRICS_PORT [9360], SPECPAIR_DEPTH [3], UP_TIMEOUT_S [300],
#   SPECPAIR_PROJECT [specpair-local] (the compose project: another name, other ports and
#   another SPECPAIR_KEY_FILE run a second pair beside the first, as tests/images/
#   test_pair_restart.py does), SPECPAIR_KEY_FILE [build/up/specpair.key], SPECPAIR_OMP_CPUS
#   [the CPUs this script may run on: the TP = 1 target's OpenMP threads, one bound to each;
#   nobind leaves them free], SPECPAIR_DRAFTER_CPUS [the CPUs this script may run
#   on]; image build
#   variables as images/bin/image-build.sh (CA_BUNDLE, WHEELHOUSE).
# Every step prints its time when it ends, and a line every 10 s while it runs silent; `up`
# ends with the time of each step.
set -euo pipefail
cd "$(dirname "$0")/.."

cmd=${1:?usage: scripts/local-pair.sh up|down}
project=${SPECPAIR_PROJECT:-specpair-local}
tp=${SPECPAIR_TP:-1}
case "$tp" in
  1) compose_files=(--file compose/local-cpu.yml); services=(drafter target) ;;
  2) compose_files=(--file compose/local-cpu.yml --file compose/local-cpu-tp2.yml)
     services=(drafter target target-worker) ;;
  *) echo "error: SPECPAIR_TP='$tp': expected 1 or 2 (the target's tensor-parallel ranks)" >&2
     exit 2 ;;
esac
export SPECPAIR_KEY_FILE=${SPECPAIR_KEY_FILE:-$PWD/build/up/specpair.key}
export SPECPAIR_TARGET_PORT=${SPECPAIR_TARGET_PORT:-8360}
export SPECPAIR_DRAFTER_PORT=${SPECPAIR_DRAFTER_PORT:-7360}
export SPECPAIR_METRICS_PORT=${SPECPAIR_METRICS_PORT:-9360}
export SPECPAIR_DEPTH=${SPECPAIR_DEPTH:-3}
# the TP = 1 target's OpenMP threads, one bound to each CPU this script may run on (the
# containers run on the same CPUs: no cpuset); `nobind` leaves them unbound. The list is
# specpair.vllm.cpu_env.omp_cpus's, written out: this host python3 has no specpair to import
own_cpus=$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')
export SPECPAIR_OMP_CPUS=${SPECPAIR_OMP_CPUS:-$own_cpus}
# the drafter's --cpus: every CPU this script may run on, not the target's first alone (held
# there it starves while the target steps without it: src/specpair/vllm/cpu_env.py)
export SPECPAIR_DRAFTER_CPUS=${SPECPAIR_DRAFTER_CPUS:-$own_cpus}
# compose/local-cpu.yml names the images by the one tag scheme (images/bin/image-tag.sh).
SPECPAIR_VERSION=$(images/bin/image-tag.sh --version)
export SPECPAIR_VERSION
compose() { docker-compose --project-name "$project" "${compose_files[@]}" "$@"; }

# step NAME CMD...: run CMD (stderr merged into stdout), passing its output through; after 10 s
# without a line, print how long the step has run, again every 10 s; then NAME's time.
steps=()
step() {
  local name=$1 t0=$SECONDS rc
  shift
  set +e
  "$@" 2>&1 | while :; do
    IFS= read -r -t 10 line; rc=$?
    if [ "$rc" = 0 ]; then
      printf '%s\n' "$line"
    elif [ "$rc" -gt 128 ]; then  # 10 s of silence (a partial line is printed as it is)
      [ -z "$line" ] || printf '%s\n' "$line"
      echo "   .. $name: $((SECONDS - t0))s"
    else
      [ -z "$line" ] || printf '%s\n' "$line"
      break
    fi
  done
  rc=${PIPESTATUS[0]}
  set -e
  steps+=("$name $((SECONDS - t0))s")
  if [ "$rc" != 0 ]; then
    echo "error: $name failed (exit $rc) after $((SECONDS - t0))s" >&2
    exit "$rc"
  fi
  echo ">> $name: done in $((SECONDS - t0))s"
}

case "$cmd" in
  down)
    if ! command -v docker-compose >/dev/null || ! docker info >/dev/null 2>&1; then
      echo ">> no docker engine or docker-compose: nothing to stop"
      exit 0
    fi
    [ -f "$SPECPAIR_KEY_FILE" ] || SPECPAIR_KEY_FILE=/dev/null  # compose needs a value to parse
    # the worker's file too, whatever TP the pair was started with: down removes every rank
    compose_files=(--file compose/local-cpu.yml --file compose/local-cpu-tp2.yml)
    step "stop the pair" compose down --timeout 10
    exit 0 ;;
  up) ;;
  *) echo "error: unknown command '$cmd' (up|down)" >&2; exit 2 ;;
esac
t_up=$SECONDS

step "image tools" images/bin/image-tools.sh
for role in drafter target; do
  tag=$(images/bin/image-tag.sh "$role" cpu)
  if docker image inspect "$tag" >/dev/null 2>&1; then
    echo ">> $tag: in Docker already"
  else
    echo ">> $tag missing: building it"
    step "build $tag" images/bin/image-build.sh "$role" cpu
  fi
done

if [ ! -s "$SPECPAIR_KEY_FILE" ]; then
  mkdir -p "$(dirname "$SPECPAIR_KEY_FILE")"
  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SPECPAIR_KEY_FILE")
  echo ">> wrote a new wire key: $SPECPAIR_KEY_FILE"
fi
if [ -n "$(find "$SPECPAIR_KEY_FILE" -perm /077)" ]; then  # the drafter and target refuse it
  chmod 600 "$SPECPAIR_KEY_FILE"
  echo ">> $SPECPAIR_KEY_FILE was readable by others: now mode 0600"
fi

echo ">> starting the pair (drafter :$SPECPAIR_DRAFTER_PORT, target :$SPECPAIR_TARGET_PORT," \
  "tensor parallelism $tp; compose waits for the drafter's /healthz before it starts the target)"
t_pair=$(date +%s.%N)
step "start the pair" compose up --detach --remove-orphans
fail() {
  compose ps
  compose logs --no-color --tail 40
  echo "error: $1; the pair is left as it is for inspection (make down stops it)" >&2
  exit 1
}
# Both services restart unless stopped (compose/local-cpu.yml): a service that restarts while
# the pair comes up is crash-looping, a failure like one that exits.
# The containers, looked up once (a restart keeps its container; docker-compose is slow to ask).
declare -A cid=()
for svc in "${services[@]}"; do cid[$svc]=$(compose ps -q "$svc"); done
restarts() { docker inspect --format '{{.RestartCount}}' "${cid[$1]}" 2>/dev/null || echo 0; }
health() { docker inspect --format '{{.State.Health.Status}}' "${cid[$1]}" 2>/dev/null || echo gone; }
declare -A restarts0=()
for svc in "${services[@]}"; do restarts0[$svc]=$(restarts "$svc"); done
# The health wait: its figures count from the start of the wait (and of the pair's start),
# however many probes it took.
t_wait=$SECONDS
deadline=$(( SECONDS + ${UP_TIMEOUT_S:-300} ))
next=$(( SECONDS + 10 ))
until python3 scripts/local_pair_report.py wait --port "$SPECPAIR_TARGET_PORT" --timeout 4 \
      --since "$t_pair" 2>/dev/null; do
  for svc in "${services[@]}"; do
    state=$(docker inspect --format '{{.State.Status}}' "${cid[$svc]}" 2>/dev/null || true)
    [ "$state" = running ] || fail "the $svc container is ${state:-gone}"
    n=$(restarts "$svc")
    [ "$n" -le "${restarts0[$svc]}" ] || fail "the $svc container restarted $((n - restarts0[$svc])) time(s)"
  done
  [ "$SECONDS" -lt "$deadline" ] || fail "the target was not healthy within ${UP_TIMEOUT_S:-300}s"
  if [ "$SECONDS" -ge "$next" ]; then
    echo "   .. waiting for the target's /health: $((SECONDS - t_wait))s (containers: drafter" \
      "$(health drafter), target $(health target))"
    next=$(( SECONDS + 10 ))
  fi
done
echo ">> waited $((SECONDS - t_wait))s for the target's /health (the figure above counts from" \
  "the start of the pair)"
steps+=("target health $((SECONDS - t_wait))s")
step "one completion" python3 scripts/local_pair_report.py complete \
  --port "$SPECPAIR_TARGET_PORT" --drafter-metrics-port "$SPECPAIR_METRICS_PORT"
summary=$(printf '%s, ' "${steps[@]}")
echo ">> step times: ${summary%, }; total $((SECONDS - t_up))s"
echo ">> the pair is up (target at tensor parallelism $tp):" \
  "http://127.0.0.1:$SPECPAIR_TARGET_PORT/v1 (model \"specpair-trained\"); make down stops it"
