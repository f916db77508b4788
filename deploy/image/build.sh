#!/usr/bin/env bash
# Builds the snapdrain image: a statically linked release binary (built here on the host, so the image
# build itself needs no network) on `scratch`, with the CA bundle, user 65532 and OCI labels.
#
#   deploy/image/build.sh [TAG]        TAG defaults to the version the binary prints
#
# Environment:
#   IMAGE             image name (default snapdrain): the result is IMAGE:TAG
#   ENGINE            podman or docker (default: podman when installed, else docker)
#   PODMAN_STORAGE    podman's storage driver (default vfs: works without overlay support, e.g. in CI
#                     containers); pass the same `--storage-driver` to later podman commands
#   SNAPDRAIN_BINARY  a statically linked snapdrain to use instead of building one
#   CARGO_BUILD_JOBS  as for cargo (the static build compiles the whole dependency tree once more)
#   SOURCE_URL        the org.opencontainers.image.source label
set -euo pipefail
cd "$(dirname "$0")/../.."

die() { echo "build.sh: $*" >&2; exit 1; }

IMAGE=${IMAGE:-snapdrain}
SOURCE_URL=${SOURCE_URL:-https://github.com/snapdrain/snapdrain}

if [ -n "${ENGINE:-}" ]; then
  :
elif command -v podman >/dev/null 2>&1; then
  ENGINE=podman
elif command -v docker >/dev/null 2>&1; then
  ENGINE=docker
else
  die "neither podman nor docker is installed (Debian: apt-get install -y podman)"
fi

CA=/etc/ssl/certs/ca-certificates.crt
[ -s "$CA" ] || die "$CA is missing: install the ca-certificates package (the image's CA bundle comes from it)"

BIN=$(deploy/release/static-binary.sh)
# The labels say what the binary says of itself ("snapdrain 0.1.0 (revision <commit>)"), so a prebuilt
# SNAPDRAIN_BINARY is labelled with its own commit, not the checkout's.
read -r NAME VERSION _ REVISION < <("$BIN" --version) || die "$BIN --version failed"
REVISION=${REVISION%)}
[ "$NAME" = snapdrain ] && [ -n "$VERSION" ] && [ -n "$REVISION" ] \
  || die "$BIN --version does not say 'snapdrain VERSION (revision COMMIT)'"
TAG=${1:-$VERSION}
# The commit's time as the image's creation time: the same binary gives the same image.
EPOCH=$(git log -1 --format=%ct "$REVISION" 2>/dev/null || echo 0)

CONTEXT=$(mktemp -d)
trap 'rm -rf "$CONTEXT"' EXIT
cp deploy/image/Containerfile "$CONTEXT/Containerfile"
cp "$BIN" "$CONTEXT/snapdrain"
cp "$CA" "$CONTEXT/ca-certificates.crt"
chmod 0755 "$CONTEXT/snapdrain"
chmod 0644 "$CONTEXT/ca-certificates.crt"

ARGS=(--network none --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION"
  --build-arg "SOURCE=$SOURCE_URL" -f "$CONTEXT/Containerfile" -t "$IMAGE:$TAG")
case "$ENGINE" in
  podman)
    podman --storage-driver "${PODMAN_STORAGE:-vfs}" build --timestamp "$EPOCH" "${ARGS[@]}" "$CONTEXT" >&2
    ID=$(podman --storage-driver "${PODMAN_STORAGE:-vfs}" image inspect --format '{{.Id}}' "$IMAGE:$TAG")
    ;;
  docker)
    SOURCE_DATE_EPOCH=$EPOCH docker build "${ARGS[@]}" "$CONTEXT" >&2
    ID=$(docker image inspect --format '{{.Id}}' "$IMAGE:$TAG")
    ;;
  *) die "ENGINE must be podman or docker, not $ENGINE" ;;
esac
echo "build.sh: built $IMAGE:$TAG ($ID), version $VERSION, revision $REVISION" >&2
echo "$IMAGE:$TAG"
