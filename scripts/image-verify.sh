#!/usr/bin/env bash
# Prove the images are reproducible: build each twice, each time in a FRESH buildah store (no
# shared layers, no build cache; only pip's download cache is shared, and every wheel is
# hash-checked), and fail unless the image IDs (config digests, which name every layer's
# uncompressed digest) and the manifest digests match. The base rootfs is rebuilt too and must
# match its locked sha256. On success the first build's images are loaded into Docker.
#
# Usage: scripts/image-verify.sh PROFILE ROLE...     e.g. scripts/image-verify.sh cpu drafter target
# Environment: as scripts/image-build.sh (CA_BUNDLE, WHEELHOUSE, PIP_CACHE); VERIFY_DIR (default
# build/images/verify) holds the two stores; KEEP_STORE=1 keeps the first store (a warm cache).
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
for role in "$@"; do
  for n in 1 2; do
    echo ">> [$role/$profile] build $n of 2 in a fresh store $dir/store$n"
    s=$(date +%s)
    # The second build reuses the first one's context snapshot and revision: same inputs, even
    # when the working tree moves meanwhile (a shared checkout).
    BUILDAH_ROOT=$(realpath "$dir")/store$n PUSH=0 IID_FILE="$dir/$role-$n.iid" \
      REUSE_CTX=$(( n - 1 )) scripts/image-build.sh "$role" "$profile" "specpair-$role:$profile"
    echo "$(( $(date +%s) - s ))" > "$dir/$role-$n.seconds"
    buildah --root "$(realpath "$dir")/store$n" --runroot "$(realpath "$dir")/store$n.run" \
      --storage-driver vfs images --digests --format '{{.Digest}}' \
      "localhost/specpair-$role:$profile" > "$dir/$role-$n.digest"
  done
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
scripts/docker-up.sh >/dev/null
for role in "$@"; do
  buildah --root "$(realpath "$dir")/store1" --runroot "$(realpath "$dir")/store1.run" \
    --storage-driver vfs push --quiet "localhost/specpair-$role:$profile" \
    "docker-daemon:specpair-$role:$profile"
  loaded=$(docker image inspect --format '{{.Id}}' "specpair-$role:$profile")
  [ "$loaded" = "$(cat "$dir/$role-1.iid")" ] || [ "$loaded" = "sha256:$(cat "$dir/$role-1.iid")" ] \
    || { echo "error: docker loaded specpair-$role:$profile as $loaded" >&2; exit 1; }
  echo ">> loaded specpair-$role:$profile = $loaded"
done
rm -rf "$dir/store2" "$dir/store2.run"
[ "${KEEP_STORE:-0}" = 1 ] || rm -rf "$dir/store1" "$dir/store1.run"
