#!/usr/bin/env bash
# Build one specpair image reproducibly with buildah and load it into Docker (same image ID).
#
# Usage: images/bin/image-build.sh ROLE PROFILE [TAG]
#   ROLE     drafter | target
#   PROFILE  cpu (linux/amd64) | rtx3090 (drafter, linux/amd64, CUDA) | gb10 (target, linux/arm64)
#   TAG      image name:tag (default: images/bin/image-tag.sh ROLE PROFILE, i.e.
#            specpair-ROLE:PROFILE-VERSION, the one tag scheme compose and Ansible name)
# Environment (the Makefile passes these; defaults in brackets):
#   BUILDAH_ROOT     buildah storage (vfs) directory [/var/lib/specpair/buildah]; a fresh
#                    directory gives a build that shares nothing with earlier ones
#   CA_BUNDLE        extra CA bundle pip must trust for the downloads [none]
#   WHEELHOUSE       local wheel directory offered to the download, hash-checked [none]
#   WHEEL_CACHE      where the locked wheels are downloaded (kept between builds)
#                    [build/cache/wheels/PROFILE-ROLE]
#   PY               Python whose pip downloads and that makes the tiny model pair (needs torch)
#                    [.venv/bin/python, else python3]
#   OVERLAY_EXCLUDE  overlay patch ids to leave out (target only; power tests) [none]
#   PUSH             1: push the image to the Docker daemon [1]
#   IID_FILE         write the image ID here [build/images/ROLE-PROFILE.iid]
#   REUSE_CTX        1: build from the context the previous build of this image left [0]
#   LAYERS           1: keep per-step layers as a build cache (buildah --layers) [0]; with vfs
#                    every kept step copies the whole rootfs, so a cold build is much faster without
# Disk: vfs keeps a full copy of the rootfs per layer (target: ~3.5 GB). Once an image is in Docker
# the store's copy serves nothing (without LAYERS=1 it caches nothing), so after a push it is
# removed from the store, with any untagged images earlier builds left there.
# The locked wheels are downloaded on the host first (`pip download --require-hashes`, for the
# image's platform; files already in WHEEL_CACHE are re-hashed, not fetched), then mounted into the
# build, which installs them with --no-index: nothing in the build talks to an index (buildah's
# chroot isolation only offers --network host), and the CA bundle never goes near it. (pip's
# HTTP cache cannot help: the proxy in front of the registries strips the caching headers.)
# The tiny model pair is made here on the build host (`specpair models make-tiny`, from the
# context's own src/) and copied in: the files are architecture-independent (the same seed gives
# bit-identical files), and torch cannot compute inside an emulated arm64 build (oneDNN's
# xbyak_aarch64 cannot read MIDR_EL1 under qemu and the step dies with exit 139).
# The trained pair the default commands serve is not made here: it is the committed models/trained
# (docs/models.md), copied into the context with the other tracked files.
# linux/arm64 (gb10) on another architecture runs under qemu: images/bin/arm64-emulation.sh sets it
# up (or names what is missing) first.
# The same commit, lock and arguments give the same image ID, whatever the store or cache.
set -euo pipefail
cd "$(dirname "$0")/../.."

role=${1:?usage: images/bin/image-build.sh drafter|target cpu|rtx3090|gb10 [TAG]}
profile=${2:?usage: images/bin/image-build.sh drafter|target cpu|rtx3090|gb10 [TAG]}
# The Containerfile stage that ends each image: the rtx3090 drafter's own last stage (`cuda`)
# only changes the default command to its hardware (--device cuda).
case "$role/$profile" in
  drafter/cpu) arch=amd64 stage=drafter ;;
  drafter/rtx3090) arch=amd64 stage=cuda ;;
  target/cpu) arch=amd64 stage=target ;;
  target/gb10) arch=arm64 stage=target ;;
  *) echo "error: no image '$role' for profile '$profile' (drafter: cpu|rtx3090; target: cpu|gb10)" >&2
     exit 2 ;;
esac
tag=${3:-$(images/bin/image-tag.sh "$role" "$profile")}
# shellcheck disable=SC1091
source images/versions.lock

root=${BUILDAH_ROOT:-/var/lib/specpair/buildah}
wheel_cache=${WHEEL_CACHE:-build/cache/wheels/$profile-$role}
py=${PY:-.venv/bin/python}
[ -x "$py" ] || py=python3
iid_file=${IID_FILE:-build/images/$role-$profile.iid}
command -v buildah >/dev/null || { echo "error: buildah missing (apt-get install buildah)" >&2; exit 1; }

[ "$arch" = amd64 ] || images/bin/arm64-emulation.sh

# 1. Base rootfs (byte-reproducible, checked against images/lock/base-ARCH.txt).
base=build/images/base-$arch.tar
images/bin/image-base.sh "$arch" "$base"

# 2. Build context: the tracked files only (others' uncommitted work never lands in an image),
#    with the revision they came from. REUSE_CTX=1 builds again from the context (and revision)
#    the previous build of this image left, as images/bin/image-verify.sh does for its second build.
slug=${tag//[:\/]/-}  # per tag: builds of different tags never share a context or wheel set
ctx=build/images/ctx-$slug
mkdir -p "$wheel_cache" "$(dirname "$iid_file")"
if [ "${REUSE_CTX:-0}" = 1 ] && [ -s "$ctx/.revision" ]; then
  echo ">> reusing the build context $ctx"
else
  rm -rf "$ctx"
  mkdir -p "$ctx/build/images"
  git ls-files -z -- pyproject.toml README.md src tests images/lock images/Containerfile overlays \
    models/trained \
    | xargs -0 cp --parents -t "$ctx"
  ln "$base" "$ctx/$base" 2>/dev/null || cp "$base" "$ctx/$base"
  # The tiny pair from the snapshot's own source (see above: no torch compute in the build).
  PYTHONPATH="$(realpath "$ctx/src")" "$py" -m specpair models make-tiny --out "$ctx/models" \
    --seed 0 >/dev/null \
    || { echo "error: $py -m specpair models make-tiny failed (PY must have torch: make venv)" >&2
         exit 1; }
  chmod -R u=rwX,go=rX "$ctx/models"
  revision=$(git rev-parse HEAD)
  git diff --quiet HEAD -- pyproject.toml README.md src tests images overlays models/trained \
    || revision="$revision-dirty"
  echo "$revision" > "$ctx/.revision"
fi
revision=$(cat "$ctx/.revision")
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
overlay_id=none
if [ "$role" = target ]; then
  overlay_id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["overlay_id"])' \
    "overlays/vllm/$VLLM_VERSION/manifest.json")
fi

# 3. The locked wheels, downloaded (or re-checked) on the host for the image's platform.
case "$arch" in amd64) machine=x86_64 ;; arm64) machine=aarch64 ;; esac
dl=(--isolated --disable-pip-version-check --no-input --progress-bar off --no-deps
    --require-hashes --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311
    --index-url https://pypi.org/simple -d "$wheel_cache" -r "images/lock/$profile-$role.txt")
for m in $(seq 39 -1 5); do dl+=(--platform "manylinux_2_${m}_$machine"); done
dl+=(--platform "manylinux2014_$machine" --platform "manylinux1_$machine" --platform "linux_$machine")
if [ -n "${CA_BUNDLE:-}" ]; then
  [ -r "$CA_BUNDLE" ] || { echo "error: CA_BUNDLE=$CA_BUNDLE is not a readable file" >&2; exit 1; }
  dl+=(--cert "$CA_BUNDLE")
fi
if [ -n "${WHEELHOUSE:-}" ]; then
  [ -d "$WHEELHOUSE" ] || { echo "error: WHEELHOUSE=$WHEELHOUSE is not a directory" >&2; exit 1; }
  dl+=(--find-links "$WHEELHOUSE")
fi
echo ">> locked wheels for $profile-$role (linux/$arch) -> $wheel_cache"
s=$(date +%s)
PIP_CONFIG_FILE=/dev/null "$py" -m pip download --quiet "${dl[@]}"
# Only the locked files are offered to the build (an older lock's leftovers are not).
offer=build/images/wheels-$slug
rm -rf "$offer"; mkdir -p "$offer"
"$py" - "$wheel_cache" "$offer" "images/lock/$profile-$role.txt" <<'PY'
import hashlib, os, sys
from pathlib import Path
cache, offer, lock = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
want = {line.split("--hash=sha256:")[1].strip() for line in lock.read_text().replace("\\\n", " ").splitlines()
        if "--hash=sha256:" in line}
for f in sorted(cache.glob("*.whl")):
    if hashlib.sha256(f.read_bytes()).hexdigest() in want:
        os.link(f, offer / f.name)
got = len(list(offer.glob("*.whl")))
if got != len(want):
    sys.exit(f"error: {got} of {len(want)} locked wheels in {cache}")
PY
echo ">> $(ls "$offer" | wc -l) wheels ready ($(du -sh "$offer" | cut -f1)) in $(( $(date +%s) - s ))s"

# Exactly the ARGs the role's stages of images/Containerfile declare (buildah warns "build args
# were not consumed" about any other): the target alone records the vLLM release and the overlay.
build_args=(--build-arg PROFILE="$profile" --build-arg ROLE="$role" --build-arg BASE_TAR="$base"
            --build-arg SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH"
            --build-arg SOURCE_URL="https://github.com/specpair/specpair"
            --build-arg REVISION="$revision" --build-arg VERSION="$version")
# Intel OpenMP preloaded in the cpu target (src/specpair/vllm/cpu_env.py); none on gb10.
target_ld_preload=
if [ "$profile" = cpu ]; then target_ld_preload=/opt/venv/lib/libiomp5.so; fi
if [ "$role" = target ]; then
  build_args+=(--build-arg VLLM_VERSION="$VLLM_VERSION" --build-arg OVERLAY_ID="$overlay_id"
               --build-arg OVERLAY_EXCLUDE="${OVERLAY_EXCLUDE:-}"
               --build-arg TARGET_LD_PRELOAD="$target_ld_preload")
fi

echo ">> buildah: $tag (profile $profile, linux/$arch, store $root)"
start=$(date +%s)
buildah --root "$root" --runroot "$root.run" --storage-driver vfs bud \
  --file "$ctx/images/Containerfile" --tag "localhost/$tag" --iidfile "$iid_file" \
  --target "$stage" --platform "linux/$arch" --isolation chroot --network host --layers="${LAYERS:-0}" \
  --timestamp "$SOURCE_DATE_EPOCH" "${build_args[@]}" \
  -v "$(realpath "$offer"):/run/specpair/wheels:ro" \
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
  if [ "${LAYERS:-0}" != 1 ]; then
    buildah --root "$root" --runroot "$root.run" --storage-driver vfs rmi "localhost/$tag" >/dev/null
    buildah --root "$root" --runroot "$root.run" --storage-driver vfs rmi --prune >/dev/null
    echo ">> store $root: $(du -sh "$root" | cut -f1) after removing the pushed image"
  fi
fi
