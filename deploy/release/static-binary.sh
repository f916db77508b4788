#!/usr/bin/env bash
# Prints the path of a statically linked release `snapdrain` (x86_64 Linux, no `sim` feature) for the
# image and the release archive: $SNAPDRAIN_BINARY when set, else one built here. A static binary runs
# on `scratch` and on any Linux a krew user has.
#
# The build compiles the whole dependency tree for another target and profile: tens of minutes on two
# cores (README, "Container image"). CARGO_BUILD_JOBS and CARGO_TARGET_DIR are cargo's.
set -euo pipefail
cd "$(dirname "$0")/../.."

die() { echo "static-binary.sh: $*" >&2; exit 1; }
TARGET=x86_64-unknown-linux-gnu

if [ -n "${SNAPDRAIN_BINARY:-}" ]; then
  BIN=$SNAPDRAIN_BINARY
else
  REVISION=$(git rev-parse --verify --quiet HEAD 2>/dev/null || echo unknown)
  echo "static-binary.sh: cargo build --release --target $TARGET (static)" >&2
  # --target makes RUSTFLAGS apply to the binary only, not to build scripts and proc macros (which
  # cannot be static).
  SNAPDRAIN_REVISION=$REVISION RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --locked --release --target "$TARGET" -p snapdrain-cli --no-default-features \
    --bin snapdrain >&2
  BUILT=${CARGO_TARGET_DIR:-target}/$TARGET/release/snapdrain
  command -v strip >/dev/null 2>&1 || die "strip is missing: install binutils"
  # The release profile keeps line tables (backtraces with file:line when run from the build tree):
  # 450 MB statically linked. Shipped without them, symbols kept: about 75 MB.
  BIN=${BUILT}-stripped
  strip --strip-debug -o "$BIN" "$BUILT"
fi
[ -x "$BIN" ] || die "$BIN is not an executable file"
# A dynamically linked binary would not start on scratch (no loader, no libc).
if ! LC_ALL=C ldd "$BIN" 2>&1 | grep -qE 'statically linked|not a dynamic executable'; then
  die "$BIN is dynamically linked: build it with RUSTFLAGS='-C target-feature=+crt-static' --target $TARGET"
fi
echo "$BIN"
