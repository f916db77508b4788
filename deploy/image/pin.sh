#!/usr/bin/env bash
# Pins the image the chart and the kustomize base deploy to a pushed image's digest, the same way in
# both (repository:tag@digest): deploy/helm/snapdrain/values.yaml (image.repository, image.digest) and
# deploy/kustomize/base/kustomization.yaml and deploy/kustomize/uninstall/kustomization.yaml (images:
# newName, digest).
#
#   deploy/image/pin.sh REPOSITORY DIGEST
#
# DIGEST is what the registry answered to the push, e.g.
#   podman push --digestfile /tmp/digest snapdrain:0.1.0 ghcr.io/example/snapdrain:0.1.0
#   deploy/image/pin.sh ghcr.io/example/snapdrain "$(cat /tmp/digest)"
# (the local image ID is not that digest: the registry stores compressed layers).
set -euo pipefail
cd "$(dirname "$0")/../.."

die() { echo "pin.sh: $*" >&2; exit 1; }
[ $# -eq 2 ] || die "usage: pin.sh REPOSITORY DIGEST (e.g. ghcr.io/example/snapdrain sha256:<64 hex>)"
REPO=$1
DIGEST=$2
[[ "$DIGEST" =~ ^sha256:[0-9a-f]{64}$ ]] || die "DIGEST must be sha256: and 64 lowercase hex digits, got '$DIGEST'"
[[ "$REPO" =~ ^[a-z0-9]([a-z0-9._/:-]*[a-z0-9])?$ ]] && [[ "$REPO" != *@* ]] \
  || die "REPOSITORY must be an image name without tag or digest (e.g. ghcr.io/example/snapdrain), got '$REPO'"
# A tag after the last slash (name:tag) would become part of the name.
[[ "${REPO##*/}" != *:* ]] || die "REPOSITORY must not carry a tag ('$REPO'): the tag comes from the chart's appVersion"

VALUES=deploy/helm/snapdrain/values.yaml
KUSTOMIZATION=deploy/kustomize/base/kustomization.yaml

# values.yaml: the two keys of the top-level `image:` block.
awk -v repo="$REPO" -v digest="$DIGEST" '
  /^[^ #]/ { in_image = ($0 ~ /^image:/) }
  in_image && /^  repository:/ { print "  repository: " repo; r++; next }
  in_image && /^  digest:/ { print "  digest: \"" digest "\""; d++; next }
  { print }
  END { if (r != 1 || d != 1) exit 3 }
' "$VALUES" > "$VALUES.new" || { rm -f "$VALUES.new"; die "$VALUES has no image.repository and image.digest to set"; }
mv "$VALUES.new" "$VALUES"

# Each kustomization.yaml (the base, and the uninstall Job's): the `images:` entry named snapdrain; its
# digest line is replaced or added.
for KUSTOMIZATION in deploy/kustomize/base/kustomization.yaml deploy/kustomize/uninstall/kustomization.yaml; do
  awk -v repo="$REPO" -v digest="$DIGEST" '
    /^[^ #]/ { in_images = ($0 ~ /^images:/); entry = 0 }
    in_images && /^  - name: / { entry = ($0 ~ /^  - name: snapdrain$/) }
    entry && /^    digest:/ { next }
    entry && /^    newName:/ { print "    newName: " repo; n++; next }
    entry && /^    newTag:/ { print; print "    digest: " digest; t++; next }
    { print }
    END { if (n != 1 || t != 1) exit 3 }
  ' "$KUSTOMIZATION" > "$KUSTOMIZATION.new" || { rm -f "$KUSTOMIZATION.new"; die "$KUSTOMIZATION has no images entry snapdrain with newName and newTag"; }
  mv "$KUSTOMIZATION.new" "$KUSTOMIZATION"
done

echo "pin.sh: $REPO@$DIGEST in $VALUES and the kustomize base and uninstall" >&2
