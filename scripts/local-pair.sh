#!/usr/bin/env bash
# The local CPU pair (compose/local-cpu.yml): drafter + vLLM target, host networking on 127.0.0.1.
#
# Usage: scripts/local-pair.sh up     build the missing images, start the pair, wait for health,
#                                     send one real completion, print vLLM's acceptance figures
#        scripts/local-pair.sh down   stop and remove the pair
# Environment: SPECPAIR_TARGET_PORT [8360], SPECPAIR_DRAFTER_PORT [7360],
#   SPECPAIR_METRICS_PORT [9360], SPECPAIR_DEPTH [3], UP_TIMEOUT_S [300]; image build variables
#   as scripts/image-build.sh (CA_BUNDLE, WHEELHOUSE).
set -euo pipefail
cd "$(dirname "$0")/.."

cmd=${1:?usage: scripts/local-pair.sh up|down}
project=specpair-local
compose_file=compose/local-cpu.yml
export SPECPAIR_KEY_FILE=${SPECPAIR_KEY_FILE:-$PWD/build/up/specpair.key}
export SPECPAIR_TARGET_PORT=${SPECPAIR_TARGET_PORT:-8360}
export SPECPAIR_DRAFTER_PORT=${SPECPAIR_DRAFTER_PORT:-7360}
export SPECPAIR_METRICS_PORT=${SPECPAIR_METRICS_PORT:-9360}
export SPECPAIR_DEPTH=${SPECPAIR_DEPTH:-3}
# compose/local-cpu.yml names the images by the one tag scheme (scripts/image-tag.sh).
SPECPAIR_VERSION=$(scripts/image-tag.sh --version)
export SPECPAIR_VERSION
compose() { docker-compose --project-name "$project" --file "$compose_file" "$@"; }

case "$cmd" in
  down)
    if ! command -v docker-compose >/dev/null || ! docker info >/dev/null 2>&1; then
      echo ">> no docker engine or docker-compose: nothing to stop"
      exit 0
    fi
    [ -f "$SPECPAIR_KEY_FILE" ] || SPECPAIR_KEY_FILE=/dev/null  # compose needs a value to parse
    compose down --timeout 10
    exit 0 ;;
  up) ;;
  *) echo "error: unknown command '$cmd' (up|down)" >&2; exit 2 ;;
esac

scripts/image-tools.sh
for role in drafter target; do
  tag=$(scripts/image-tag.sh "$role" cpu)
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    echo ">> $tag missing: building it"
    scripts/image-build.sh "$role" cpu
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

echo ">> starting the pair (drafter :$SPECPAIR_DRAFTER_PORT, target :$SPECPAIR_TARGET_PORT)"
compose up --detach
fail() {
  compose ps
  compose logs --no-color --tail 40
  echo "error: $1; the pair is left as it is for inspection (make down stops it)" >&2
  exit 1
}
# Both services restart unless stopped (compose/local-cpu.yml): a service that restarts while
# the pair comes up is crash-looping, a failure like one that exits.
restarts() { docker inspect --format '{{.RestartCount}}' "$(compose ps -q "$1")" 2>/dev/null || echo 0; }
declare -A restarts0=([drafter]=$(restarts drafter) [target]=$(restarts target))
deadline=$(( $(date +%s) + ${UP_TIMEOUT_S:-300} ))
until python3 scripts/local_pair_report.py wait --port "$SPECPAIR_TARGET_PORT" --timeout 4 \
      2>/dev/null; do
  for svc in drafter target; do
    state=$(docker inspect --format '{{.State.Status}}' "$(compose ps -q "$svc")" 2>/dev/null || true)
    [ "$state" = running ] || fail "the $svc container is ${state:-gone}"
    n=$(restarts "$svc")
    [ "$n" -le "${restarts0[$svc]}" ] || fail "the $svc container restarted $((n - restarts0[$svc])) time(s)"
  done
  [ "$(date +%s)" -lt "$deadline" ] || fail "the target was not healthy within ${UP_TIMEOUT_S:-300}s"
done
python3 scripts/local_pair_report.py complete --port "$SPECPAIR_TARGET_PORT" \
  --drafter-metrics-port "$SPECPAIR_METRICS_PORT"
echo ">> the pair is up: http://127.0.0.1:$SPECPAIR_TARGET_PORT/v1 (model \"tiny\"); make down stops it"
