#!/usr/bin/env bash
# Free the disk that earlier image builds left behind, and nothing else:
#   - Docker: untagged images labelled io.specpair.role (a rebuilt tag leaves its previous image
#     untagged) that no container, running or stopped, uses; and `-unverified` tags an interrupted
#     images/bin/image-verify.sh left;
#   - the default buildah store: untagged images (a LAYERS=1 cache keeps its tagged ones).
# A release record that names a pruned image by ID can no longer roll back to it on this engine
# until the image is built or loaded again; run this on build hosts, not on a deploy host whose
# rollback images are only held by ID.
# Usage: images/bin/image-prune.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${BUILDAH_ROOT:-/var/lib/specpair/buildah}

scripts/docker-up.sh >/dev/null
before=$(df -B1 --output=avail /var/lib/docker | tail -1)
for ref in $(docker images --format '{{.Repository}}:{{.Tag}}' --filter label=io.specpair.role \
             | grep -- '-unverified$' || true); do
  docker rmi "$ref" >/dev/null
done
docker image prune --force --filter label=io.specpair.role >/dev/null
if command -v buildah >/dev/null && [ -d "$root" ]; then
  buildah --root "$root" --runroot "$root.run" --storage-driver vfs rmi --prune >/dev/null
fi
after=$(df -B1 --output=avail /var/lib/docker | tail -1)
echo ">> image-prune: $(( (after - before) / 1000000 )) MB freed; $(( after / 1000000000 )) GB free" \
  "on $(df --output=target /var/lib/docker | tail -1)"
