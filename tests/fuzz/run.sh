#!/usr/bin/env bash
# Runs the libFuzzer targets that tests/fuzz/build.sh built, each for a fixed time, on a copy of its
# checked-in seed corpus (the corpus in the source tree is never written to):
#
#   tests/fuzz/run.sh [BUILDDIR] [NAME...]     (default BUILDDIR: _build-fuzz; default: every target)
#
# AGW_FUZZ_SECONDS (default 15) is the time per target. The working corpora are BUILDDIR/corpus/NAME
# (made afresh each run), the logs BUILDDIR/fuzz_NAME.log and crash inputs BUILDDIR/crashes/NAME/.
# Exits 1 if any target crashed, after printing the report and each crash input in base64 and hex:
# add it to tests/fuzz/corpus/NAME/ (printf '%s' BASE64 | base64 -d > tests/fuzz/corpus/NAME/WHAT)
# so that `make check` replays it.
set -uo pipefail

src=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$src/_build-fuzz}
[ $# -gt 0 ] && shift
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for d in "$src"/tests/fuzz/corpus/*/; do
        names+=("$(basename "$d")")
    done
fi
secs=${AGW_FUZZ_SECONDS:-15}

st=0
summary=()
for name in "${names[@]}"; do
    bin="$out/fuzz_$name"
    work="$out/corpus/$name"
    crashes="$out/crashes/$name"
    log="$out/fuzz_$name.log"
    if [ ! -x "$bin" ]; then
        echo "FAIL: $bin is missing (tests/fuzz/build.sh $out)"
        st=1
        continue
    fi
    rm -rf "$work" "$crashes"
    mkdir -p "$work" "$crashes"
    cp "$src/tests/fuzz/corpus/$name"/* "$work"/
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2560 -print_final_stats=1 \
        -artifact_prefix="$crashes/" "$work" >"$log" 2>&1
    rc=$?
    stats=$(grep -E '^#[0-9]+.*(DONE|pulse|INITED|NEW|REDUCE)' "$log" | tail -n 1 |
        sed -E 's/.*(cov: [0-9]+).*(corp: [^ ]+).*(exec\/s: [0-9]+).*/\1 \2 \3/')
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    if [ $rc -eq 0 ]; then
        summary+=("ok:   $name: ${runs:-?} runs in ${secs}s, $stats")
        continue
    fi
    st=1
    summary+=("FAIL: $name (exit $rc): $stats")
    echo "==> fuzz_$name FAILED (exit $rc); the end of $log:"
    tail -n 60 "$log"
    for f in "$crashes"/*; do
        [ -f "$f" ] || continue
        echo "---- crash input $(basename "$f") ($(wc -c <"$f") bytes), base64:"
        base64 -w0 "$f"
        echo
        echo "---- hex:"
        od -A x -t x1z -v "$f" | head -n 40
        echo "---- replay: $bin $f    (or add it to tests/fuzz/corpus/$name/)"
    done
done
printf '%s\n' "${summary[@]}"
exit $st
