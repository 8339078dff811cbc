#!/usr/bin/env bash
# Replays every fuzz corpus (tests/fuzz/corpus/NAME/) through its driver, built against the library
# without libFuzzer as tests/fuzz/replay_NAME: each input that once mattered stays a regression test.
# In a build without sanitizers the replays run under valgrind when it is installed, so that a
# use-after-free or a leak that does not crash fails here too.
: "${AGW_BUILDDIR:?run through make check}" "${AGW_SRCDIR:?run through make check}"
VG=()
if command -v valgrind >/dev/null 2>&1 && [ -z "${AGW_SANITIZED:-}" ]; then
    VG=(valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect)
fi
n=0
failed=0
for dir in "$AGW_SRCDIR"/tests/fuzz/corpus/*/; do
    name=$(basename "$dir")
    n=$((n + 1))
    if out=$("${VG[@]}" "$AGW_BUILDDIR/tests/fuzz/replay_$name" "$dir" 2>&1); then
        echo "ok: $name corpus ($out)${VG:+ (valgrind: no error, no leak)}"
        continue
    fi
    failed=$((failed + 1))
    echo "FAIL: $name corpus:"
    printf '%s\n' "$out" | tail -n 40
    # Which inputs: each one again on its own.
    for f in "$dir"*; do
        "${VG[@]}" "$AGW_BUILDDIR/tests/fuzz/replay_$name" "$f" >/dev/null 2>&1 ||
            echo "FAIL: $name: tests/fuzz/corpus/$name/$(basename "$f")"
    done
done
echo "$((n - failed)) passed, $failed failed"
[ $failed -eq 0 ]
