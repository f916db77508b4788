#!/usr/bin/env bash
# The release artifacts of the kubectl plugin, for linux/amd64:
#   OUTDIR/snapdrain-linux-amd64.tar.gz         snapdrain (static), LICENSE, completions/ (bash, zsh,
#                                               fish), snapdrain.1
#   OUTDIR/snapdrain-linux-amd64.tar.gz.sha256
#   OUTDIR/snapdrain.cdx.json                   CycloneDX SBOM of the crates the binary links
# and writes the archive's sha256, the version and the download URL into the krew manifest.
#
#   deploy/release/release.sh [OUTDIR]          OUTDIR defaults to dist/
#
# Environment:
#   SNAPDRAIN_BINARY  a statically linked snapdrain to package instead of building one
#   KREW_MANIFEST     the manifest to fill (default deploy/krew/snapdrain.yaml)
#   RELEASE_URL       where the archive will be downloaded from, up to the version
#                     (default: the manifest's current URL up to /download/)
# Needs no network: the SBOM comes from Cargo.lock and the registry sources cargo already has.
set -euo pipefail
cd "$(dirname "$0")/../.."

die() { echo "release.sh: $*" >&2; exit 1; }
OUT=${1:-dist}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
MANIFEST=${KREW_MANIFEST:-deploy/krew/snapdrain.yaml}
[ -f "$MANIFEST" ] || die "no krew manifest at $MANIFEST"
[ -f LICENSE ] || die "LICENSE is missing at the repository root"
command -v python3 >/dev/null 2>&1 || die "python3 is required (the SBOM and the manifest edit)"

BIN=$(deploy/release/static-binary.sh)
read -r NAME VERSION _ REVISION < <("$BIN" --version) || die "$BIN --version failed"
REVISION=${REVISION%)}
[ "$NAME" = snapdrain ] && [ -n "$VERSION" ] || die "$BIN --version does not say 'snapdrain VERSION (revision COMMIT)'"
EPOCH=$(git log -1 --format=%ct "$REVISION" 2>/dev/null || echo 0)

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
cp "$BIN" "$STAGE/snapdrain"
cp LICENSE "$STAGE/LICENSE"
mkdir "$STAGE/completions"
# Generated from the binary's own flags, so they match it.
"$BIN" completion bash > "$STAGE/completions/snapdrain.bash"
"$BIN" completion zsh > "$STAGE/completions/_snapdrain"
"$BIN" completion fish > "$STAGE/completions/snapdrain.fish"
"$BIN" man > "$STAGE/snapdrain.1"
chmod 0755 "$STAGE/snapdrain"
chmod 0644 "$STAGE/LICENSE" "$STAGE/snapdrain.1" "$STAGE"/completions/*

ARCHIVE=snapdrain-linux-amd64.tar.gz
# Sorted names, fixed owner and times, no gzip timestamp: the same binary gives the same archive and
# the same sha256.
(cd "$STAGE" && tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" \
  -cf - snapdrain LICENSE snapdrain.1 completions) | gzip -9 -n > "$OUT/$ARCHIVE"
SHA=$(sha256sum "$OUT/$ARCHIVE" | cut -d' ' -f1)
echo "$SHA  $ARCHIVE" > "$OUT/$ARCHIVE.sha256"

cargo tree --locked --offline -p snapdrain-cli --no-default-features -e normal,no-proc-macro \
  --target x86_64-unknown-linux-gnu --prefix depth --format $'{p}\t{l}\t{r}' \
  | python3 deploy/release/sbom.py Cargo.lock "$VERSION" "$REVISION" "$EPOCH" > "$OUT/snapdrain.cdx.json"

python3 deploy/release/krew.py "$MANIFEST" "$VERSION" "$SHA" "${RELEASE_URL:-}"

echo "release.sh: $OUT/$ARCHIVE ($SHA), $OUT/snapdrain.cdx.json; $MANIFEST updated" >&2
