#!/bin/sh
# Runs every cargo-fuzz target (or the TARGETs named) for SECONDS each, with coverage guidance.
#
#   fuzz/run.sh SECONDS [TARGET...]
#
# Builds the instrumented targets first (`cargo +nightly fuzz build -O`: every dependency again, with
# sanitizer coverage; it took 88 minutes at nice 19 on the shared 2-core machine). Set FUZZ_BIN_DIR to a
# directory of targets already built that way to skip the build.
#
# Each target starts from a copy of fuzz/corpus/<target>/ (the committed corpus is not grown), and any
# input that crashes, leaks, runs out of memory or times out is written to fuzz/regressions/<target>/,
# where the unit test snapdrain::fuzzing::tests::every_fuzz_target_holds_on_its_corpus_and_seeded_mutations
# replays it on every CI run. Exits 1 when any target found one; the others still run.
set -eu

usage="usage: fuzz/run.sh SECONDS [TARGET...]"
secs=${1:?$usage}
case $secs in
'' | *[!0-9]*) echo "$usage (SECONDS is a whole number)" >&2; exit 2 ;;
esac
shift
cd "$(dirname "$0")"

targets=${*:-$(cargo +nightly fuzz list)}
if [ -z "${FUZZ_BIN_DIR:-}" ]; then
	# shellcheck disable=SC2086 # one word per target
	cargo +nightly fuzz build -O $targets
	FUZZ_BIN_DIR=target/$(rustc -vV | sed -n 's/^host: //p')/release
fi

found=""
for t in $targets; do
	bin=$FUZZ_BIN_DIR/$t
	[ -x "$bin" ] || { echo "no built target $bin" >&2; exit 2; }
	mkdir -p "regressions/$t"
	work=$(mktemp -d)
	cp corpus/"$t"/* "$work"/ 2>/dev/null || true
	echo "== $t: ${secs}s"
	if ! "$bin" "$work" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
		-artifact_prefix="regressions/$t/" -print_final_stats=1; then
		found="$found $t"
	fi
	rm -rf "$work"
done

if [ -n "$found" ]; then
	echo "crashing inputs found for:$found (see fuzz/regressions/<target>/)" >&2
	exit 1
fi
echo "no crash in $secs s per target"
