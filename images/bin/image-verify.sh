#!/usr/bin/env bash
# Prove the images are reproducible: build each twice, each time in a FRESH buildah store (no
# shared layers, no build cache; only the wheel cache is shared, and every wheel is
# hash-checked), and fail unless the image IDs (config digests, which name every layer's
# uncompressed digest) and the manifest digests match. The base rootfs is rebuilt too and must
# match its locked sha256. On success the first build's images are loaded into Docker.
# The roles build side by side (each role's two builds one after the other in its own emptied
# store; on 2 cores a build is mostly one core's work: unpacking wheels, then committing), each
# role's output to its own log, printed whole when it ends, with a progress line a minute.
# Disk: a vfs store holds a full rootfs copy per layer (target ~3.5 GB, more while committing):
# build 1 goes to Docker under the tag TAG-unverified and its store is removed before build 2
# starts; TAG moves to it only when every role's two builds match.
#
# Usage: images/bin/image-verify.sh PROFILE ROLE...     e.g. images/bin/image-verify.sh cpu drafter target
# Environment: as images/bin/image-build.sh (CA_BUNDLE, WHEELHOUSE, WHEEL_CACHE); VERIFY_DIR (default
# build/images/verify) holds the store while a build runs, and the IDs, digests and times after.
set -euo pipefail
cd "$(dirname "$0")/../.."

profile=${1:?usage: images/bin/image-verify.sh PROFILE ROLE...}
shift
[ $# -gt 0 ] || { echo "usage: images/bin/image-verify.sh PROFILE ROLE..." >&2; exit 2; }
dir=${VERIFY_DIR:-build/images/verify}
source images/versions.lock

# The base: rebuild from scratch (a kept tarball would prove nothing) and compare with the lock.
for role in "$@"; do
  case "$role/$profile" in target/gb10) arch=arm64 ;; *) arch=amd64 ;; esac
done
rm -f "build/images/base-$arch.tar"
images/bin/image-base.sh "$arch" "build/images/base-$arch.tar"

rm -rf "$dir"
mkdir -p "$dir"
scripts/docker-up.sh >/dev/null
roles=("$@")
# TAG: the one tag scheme (images/bin/image-tag.sh), as `make image` gives it.
declare -A tags
for role in "$@"; do tags[$role]=$(images/bin/image-tag.sh "$role" "$profile"); done
vdir=$(realpath "$dir")
# On every exit: the stores and the builds still running go, and so do the TAG-unverified
# names (TAG itself, once moved, stays).
cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  wait 2>/dev/null || true
  for role in "${roles[@]}"; do
    rm -rf "$vdir/store-$role" "$vdir/store-$role.run"
    docker rmi "${tags[$role]}-unverified" >/dev/null 2>&1 || true
  done
}
trap cleanup EXIT

# One role: build 1 (pushed to Docker as TAG-unverified), build 2, each in a fresh store.
verify_role() {
  local role=$1 store="$vdir/store-$1" n s
  for n in 1 2; do
    echo ">> [$role/$profile] build $n of 2 in a fresh store $store"
    echo "build $n of 2" > "$dir/$role.step"
    rm -rf "$store" "$store.run"
    s=$(date +%s)
    # The second build reuses the first one's context snapshot and revision: same inputs, even
    # when the working tree moves meanwhile (a shared checkout).
    BUILDAH_ROOT=$store PUSH=0 IID_FILE="$dir/$role-$n.iid" \
      REUSE_CTX=$(( n - 1 )) images/bin/image-build.sh "$role" "$profile" "${tags[$role]}"
    echo "$(( $(date +%s) - s ))" > "$dir/$role-$n.seconds"
    buildah --root "$store" --runroot "$store.run" --storage-driver vfs images --digests \
      --format '{{.Digest}}' "localhost/${tags[$role]}" > "$dir/$role-$n.digest"
    if [ $n = 1 ]; then
      buildah --root "$store" --runroot "$store.run" --storage-driver vfs push --quiet \
        "localhost/${tags[$role]}" "docker-daemon:${tags[$role]}-unverified"
    fi
  done
  rm -rf "$store" "$store.run"
  echo "done" > "$dir/$role.step"
}

declare -A pids
t0=$(date +%s)
for role in "$@"; do
  echo ">> [$role/$profile] building twice (log: $dir/$role.log)"
  verify_role "$role" > "$dir/$role.log" 2>&1 &
  pids[$role]=$!
done
fail=0
left=("$@")
while [ ${#left[@]} -gt 0 ]; do
  still=()
  for role in "${left[@]}"; do
    if kill -0 "${pids[$role]}" 2>/dev/null; then
      still+=("$role")
      continue
    fi
    rc=0; wait "${pids[$role]}" || rc=$?
    sed "s|^|[$role] |" "$dir/$role.log"
    echo ">> [$role/$profile] builds ended (exit $rc) after $(( $(date +%s) - t0 )) s"
    [ $rc = 0 ] || fail=1
  done
  left=("${still[@]}")
  if [ ${#left[@]} -gt 0 ]; then
    sleep 5
    if (( ( $(date +%s) - t0 ) % 60 < 5 )); then
      line=""
      for role in "${left[@]}"; do line="$line $role: $(cat "$dir/$role.step" 2>/dev/null);"; done
      echo ">> $(( $(date +%s) - t0 )) s: still building:$line"
    fi
  fi
done
if [ $fail = 1 ]; then
  echo "error: an image build failed (its log above)" >&2
  exit 1
fi

summary=()
for role in "$@"; do
  id1=$(cat "$dir/$role-1.iid"); id2=$(cat "$dir/$role-2.iid")
  d1=$(cat "$dir/$role-1.digest"); d2=$(cat "$dir/$role-2.digest")
  line="$role/$profile: ID $id1 vs $id2; manifest $d1 vs $d2;"
  line="$line build $(cat "$dir/$role-1.seconds")s / $(cat "$dir/$role-2.seconds")s"
  if [ "$id1" = "$id2" ] && [ "$d1" = "$d2" ]; then
    summary+=("SAME    $line")
  else
    summary+=("DIFFER  $line")
    fail=1
  fi
done

echo ">> reproducibility (profile $profile):"
printf '   %s\n' "${summary[@]}"
if [ $fail = 1 ]; then
  echo "error: two builds from the same inputs differ (see above); not loading them" >&2
  exit 1
fi
for role in "$@"; do
  tmp="${tags[$role]}-unverified"
  loaded=$(docker image inspect --format '{{.Id}}' "$tmp")
  iid=$(cat "$dir/$role-1.iid")
  if [ "${loaded#sha256:}" != "${iid#sha256:}" ]; then
    echo "error: docker loaded $tmp as $loaded, buildah built $iid" >&2
    exit 1
  fi
  docker tag "$tmp" "${tags[$role]}"
  echo ">> loaded ${tags[$role]} = $loaded"
done
