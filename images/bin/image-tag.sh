#!/usr/bin/env bash
# The one tag scheme of the specpair images: specpair-ROLE:PROFILE[-VARIANT]-VERSION, VERSION
# being pyproject.toml's `version` (its only home). `make image` tags what it builds with it;
# compose/*.yml (image: specpair-ROLE:PROFILE-${SPECPAIR_VERSION}), the gates, the local pair,
# the deploy tests and the Ansible images role (which tags a staged image by its own labels the
# same way) all name images by it.
#
# Usage: images/bin/image-tag.sh ROLE PROFILE [VARIANT]    e.g. drafter rtx3090 -> specpair-drafter:rtx3090-0.1.0
#        images/bin/image-tag.sh --version                 the VERSION alone (SPECPAIR_VERSION for compose)
#   ROLE/PROFILE pairs: drafter cpu|rtx3090, target cpu|gb10. VARIANT: [a-z0-9]+ (e.g. nofix).
set -euo pipefail
cd "$(dirname "$0")/../.."

version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' pyproject.toml | head -n1)
[[ "$version" =~ ^[0-9A-Za-z][0-9A-Za-z.+_-]*$ ]] \
  || { echo "error: no usable version = \"...\" in pyproject.toml (got '$version')" >&2; exit 1; }
version=${version//+/_}  # a Docker tag has no '+'
if [ "${1:-}" = --version ]; then echo "$version"; exit 0; fi

usage="usage: images/bin/image-tag.sh drafter|target cpu|rtx3090|gb10 [VARIANT] | --version"
role=${1:?$usage}
profile=${2:?$usage}
variant=${3:-}
case "$role/$profile" in
  drafter/cpu|drafter/rtx3090|target/cpu|target/gb10) ;;
  *) echo "error: no image '$role' for profile '$profile' (drafter: cpu|rtx3090; target: cpu|gb10)" >&2
     exit 2 ;;
esac
if [ -n "$variant" ] && ! [[ "$variant" =~ ^[a-z0-9]+$ ]]; then
  echo "error: VARIANT must be [a-z0-9]+, got '$variant'" >&2; exit 2
fi
echo "specpair-$role:$profile${variant:+-$variant}-$version"
