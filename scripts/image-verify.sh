#!/usr/bin/env bash
# Prove the images are reproducible: build each twice, each time in a FRESH buildah store (no
# shared layers, no build cache; only the wheel cache is shared, and every wheel is
# hash-checked), and fail unless the image IDs (config digests, which name every layer's
# uncompressed digest) and the manifest digests match. The base rootfs is rebuilt too and must
# match its locked sha256. On success the first build's images are loaded into Docker.
# Disk: a vfs store holds a full rootfs copy per layer (target ~3.5 GB, more while committing), so
# the two builds run one after the other in the same (emptied) directory: build 1 goes to Docker
# under the tag TAG-unverified and its store is removed before build 2 starts; TAG moves to it
# only when every role's two builds match.
#
# Usage: scripts/image-verify.sh PROFILE ROLE...     e.g. scripts/image-verify.sh cpu drafter target
# Environment: as scripts/image-build.sh (CA_BUNDLE, WHEELHOUSE, WHEEL_CACHE); VERIFY_DIR (default
# build/images/verify) holds the store while a build runs, and the IDs, digests and times after.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${1:?usage: scripts/image-verify.sh PROFILE ROLE...}
shift
[ $# -gt 0 ] || { echo "usage: scripts/image-verify.sh PROFILE ROLE..." >&2; exit 2; }
dir=${VERIFY_DIR:-build/images/verify}
source images/versions.lock

# The base: rebuild from scratch (a kept tarball would prove nothing) and compare with the lock.
for role in "$@"; do
  case "$role/$profile" in target/gb10) arch=arm64 ;; *) arch=amd64 ;; esac
done
rm -f "build/images/base-$arch.tar"
scripts/image-base.sh "$arch" "build/images/base-$arch.tar"

rm -rf "$dir"
mkdir -p "$dir"
summary=()
fail=0
store=$(realpath "$dir")/store
scripts/docker-up.sh >/dev/null
roles=("$@")
# TAG: the one tag scheme (scripts/image-tag.sh), as `make image` gives it.
declare -A tags
for role in "$@"; do tags[$role]=$(scripts/image-tag.sh "$role" "$profile"); done
# On every exit: the store goes, and so do the TAG-unverified names (TAG itself, once moved, stays).
cleanup() {
  rm -rf "$store" "$store.run"
  for role in "${roles[@]}"; do
    docker rmi "${tags[$role]}-unverified" >/dev/null 2>&1 || true
  done
}
trap cleanup EXIT
for role in "$@"; do
  for n in 1 2; do
    echo ">> [$role/$profile] build $n of 2 in a fresh store $store"
    rm -rf "$store" "$store.run"
    s=$(date +%s)
    # The second build reuses the first one's context snapshot and revision: same inputs, even
    # when the working tree moves meanwhile (a shared checkout).
    BUILDAH_ROOT=$store PUSH=0 IID_FILE="$dir/$role-$n.iid" \
      REUSE_CTX=$(( n - 1 )) scripts/image-build.sh "$role" "$profile" "${tags[$role]}"
    echo "$(( $(date +%s) - s ))" > "$dir/$role-$n.seconds"
    buildah --root "$store" --runroot "$store.run" --storage-driver vfs images --digests \
      --format '{{.Digest}}' "localhost/${tags[$role]}" > "$dir/$role-$n.digest"
    if [ $n = 1 ]; then
      buildah --root "$store" --runroot "$store.run" --storage-driver vfs push --quiet \
        "localhost/${tags[$role]}" "docker-daemon:${tags[$role]}-unverified"
    fi
  done
  rm -rf "$store" "$store.run"
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
