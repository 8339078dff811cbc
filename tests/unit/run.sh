#!/bin/sh
# Runs one criterion test binary. Criterion runs each test in a child process and ignores a child's
# LeakSanitizer report when its assertions passed, so in sanitized builds the reports go to files in a
# temporary folder and any report fails the test binary.
dir=$(mktemp -d "${TMPDIR:-/tmp}/agw-unit.XXXXXX") || exit 99
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}log_path=$dir/asan"
LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}log_path=$dir/lsan"
UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}log_path=$dir/ubsan:print_stacktrace=1"
export ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
"$@" --jobs 2
status=$?
for f in "$dir"/*; do
    [ -s "$f" ] || continue
    echo "sanitizer report ($f):"
    cat "$f"
    status=1
done
rm -rf "$dir"
exit $status
