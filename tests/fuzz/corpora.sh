#!/usr/bin/env bash
# Replays every fuzz corpus through its driver (built against the library, without libFuzzer).
: "${AGW_BUILDDIR:?run through make check}" "${AGW_SRCDIR:?run through make check}"
st=0
n=0
for name in sse http1; do
    out=$("$AGW_BUILDDIR/tests/fuzz/replay_$name" "$AGW_SRCDIR/tests/fuzz/corpus/$name" 2>&1)
    rc=$?
    n=$((n + 1))
    if [ $rc -eq 0 ]; then echo "ok: $name corpus ($out)"; else echo "FAIL: $name corpus: $out"; st=1; fi
done
echo "$((n - st)) passed, $st failed"
exit $st
