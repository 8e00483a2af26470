#!/usr/bin/env bash
# Build one specpair image reproducibly with buildah and load it into Docker (same image ID).
#
# Usage: scripts/image-build.sh ROLE PROFILE [TAG]
#   ROLE     drafter | target
#   PROFILE  cpu (linux/amd64) | rtx3090 (drafter, linux/amd64, CUDA) | gb10 (target, linux/arm64)
#   TAG      image name:tag (default specpair-ROLE:PROFILE)
# Environment (the Makefile passes these; defaults in brackets):
#   BUILDAH_ROOT     buildah storage (vfs) directory [/var/lib/specpair/buildah]; a fresh
#                    directory gives a build that shares nothing with earlier ones
#   CA_BUNDLE        extra CA bundle for pip, mounted into RUN steps only [none]
#   WHEELHOUSE       local wheel directory, hash-checked like downloads [none]
#   PIP_CACHE        pip download cache mounted into RUN steps [build/cache/pip]
#   OVERLAY_EXCLUDE  overlay patch ids to leave out (target only; power tests) [none]
#   PUSH             1: push the image to the Docker daemon [1]
#   IID_FILE         write the image ID here [build/images/ROLE-PROFILE.iid]
# The same commit, lock and arguments give the same image ID, whatever the store or cache.
set -euo pipefail
cd "$(dirname "$0")/.."

role=${1:?usage: scripts/image-build.sh drafter|target cpu|rtx3090|gb10 [TAG]}
profile=${2:?usage: scripts/image-build.sh drafter|target cpu|rtx3090|gb10 [TAG]}
tag=${3:-specpair-$role:$profile}
case "$role/$profile" in
  drafter/cpu|drafter/rtx3090) arch=amd64 ;;
  target/cpu) arch=amd64 ;;
  target/gb10) arch=arm64 ;;
  *) echo "error: no image '$role' for profile '$profile' (drafter: cpu|rtx3090; target: cpu|gb10)" >&2
     exit 2 ;;
esac
# shellcheck disable=SC1091
source images/versions.lock

root=${BUILDAH_ROOT:-/var/lib/specpair/buildah}
pip_cache=${PIP_CACHE:-build/cache/pip}
iid_file=${IID_FILE:-build/images/$role-$profile.iid}
command -v buildah >/dev/null || { echo "error: buildah missing (apt-get install buildah)" >&2; exit 1; }

# 1. Base rootfs (byte-reproducible, checked against images/lock/base-ARCH.txt).
base=build/images/base-$arch.tar
scripts/image-base.sh "$arch" "$base"

# 2. Build context: the tracked files only (others' uncommitted work never lands in an image).
ctx=build/images/ctx-$role-$profile
rm -rf "$ctx"
mkdir -p "$ctx/build/images" "$pip_cache" "$(dirname "$iid_file")"
git ls-files -z -- pyproject.toml README.md src tests images/lock overlays \
  | xargs -0 cp --parents -t "$ctx"
ln "$base" "$ctx/$base" 2>/dev/null || cp "$base" "$ctx/$base"
revision=$(git rev-parse HEAD)
git diff --quiet HEAD -- pyproject.toml README.md src tests images overlays || revision="$revision-dirty"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
overlay_id=none
if [ "$role" = target ]; then
  overlay_id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["overlay_id"])' \
    "overlays/vllm/$VLLM_VERSION/manifest.json")
fi

# 3. RUN-only mounts (never in a layer): CA bundle, wheelhouse, pip cache.
empty=build/images/empty
mkdir -p "$empty"
ca=${CA_BUNDLE:-/dev/null}
[ -r "$ca" ] || { echo "error: CA_BUNDLE=$ca is not a readable file" >&2; exit 1; }
wheels=${WHEELHOUSE:-$empty}
[ -d "$wheels" ] || { echo "error: WHEELHOUSE=$wheels is not a directory" >&2; exit 1; }

echo ">> buildah: $tag (profile $profile, linux/$arch, store $root)"
start=$(date +%s)
buildah --root "$root" --runroot "$root.run" --storage-driver vfs bud \
  --file "images/$role/Containerfile" --tag "localhost/$tag" --iidfile "$iid_file" \
  --platform "linux/$arch" --isolation chroot --network host --layers \
  --timestamp "$SOURCE_DATE_EPOCH" \
  --build-arg PROFILE="$profile" --build-arg BASE_TAR="$base" \
  --build-arg SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" \
  --build-arg VLLM_VERSION="$VLLM_VERSION" --build-arg OVERLAY_ID="$overlay_id" \
  --build-arg OVERLAY_EXCLUDE="${OVERLAY_EXCLUDE:-}" \
  --build-arg SOURCE_URL="https://github.com/specpair/specpair" \
  --build-arg REVISION="$revision" --build-arg VERSION="$version" \
  -v "$(realpath "$ca"):/run/specpair/ca.pem:ro" \
  -v "$(realpath "$wheels"):/run/specpair/wheels:ro" \
  -v "$(realpath "$pip_cache"):/run/specpair/pip" \
  "$ctx"
iid=$(cat "$iid_file")
echo ">> built $tag in $(( $(date +%s) - start ))s: image ID sha256:${iid#sha256:}"

if [ "${PUSH:-1}" = 1 ]; then
  scripts/docker-up.sh >/dev/null
  buildah --root "$root" --runroot "$root.run" --storage-driver vfs push --quiet \
    "localhost/$tag" "docker-daemon:$tag"
  loaded=$(docker image inspect --format '{{.Id}}' "$tag")
  if [ "${loaded#sha256:}" != "${iid#sha256:}" ]; then
    echo "error: docker loaded $tag as $loaded, buildah built sha256:${iid#sha256:}" >&2
    exit 1
  fi
  echo ">> loaded into docker: $tag = $loaded ($(docker image inspect --format '{{.Size}}' "$tag" \
    | awk '{printf "%.2f GB", $1/1e9}'))"
fi
