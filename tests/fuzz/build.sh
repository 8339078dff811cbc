#!/usr/bin/env bash
# Builds the libFuzzer targets with clang, address and undefined-behaviour sanitizers, outside the
# source tree:
#
#   tests/fuzz/build.sh [BUILDDIR] [NAME...]      (default BUILDDIR: _build-fuzz; default: every target)
#
# BUILDDIR is configured once with CC=clang, -fsanitize=fuzzer-no-link,address,undefined and the C
# library's malloc (AddressSanitizer replaces it; jemalloc would be linked for nothing), so the
# library (src/libagw.a) carries the coverage instrumentation; each driver tests/fuzz/fuzz_NAME.c is
# then linked with -fsanitize=fuzzer into BUILDDIR/fuzz_NAME. Run them with tests/fuzz/run.sh, or by
# hand (see tests/fuzz/README.md). CC overrides the compiler (it must support -fsanitize=fuzzer).
set -euo pipefail

src=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$src/_build-fuzz}
[ $# -gt 0 ] && shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for d in "$src"/tests/fuzz/corpus/*/; do
        names+=("$(basename "$d")")
    done
fi

CC=${CC:-clang}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all"
CFLAGS="-g -O1 -fno-omit-frame-pointer $SAN -fsanitize=fuzzer-no-link"
PKGS="evhtp libevent libevent_openssl libevent_pthreads openssl jansson"

[ -x "$src/configure" ] || (cd "$src" && ./autogen.sh >/dev/null)
if [ ! -f "$out/Makefile" ]; then
    echo "==> configuring $out (CC=$CC)"
    (cd "$out" && "$src/configure" CC="$CC" CFLAGS="$CFLAGS" --without-jemalloc >/dev/null)
fi
make -C "$out" -j"$(nproc 2>/dev/null || echo 2)" src/libagw.a >/dev/null

deps_cflags=$(pkg-config --cflags $PKGS | sed 's|-I/|-isystem /|g')
deps_libs=$(pkg-config --libs $PKGS)
for name in "${names[@]}"; do
    echo "==> fuzz_$name"
    # shellcheck disable=SC2086
    "$CC" $CFLAGS -fsanitize=fuzzer -std=c11 -Wall -Wextra -I"$src/include" -I"$out" $deps_cflags \
        "$src/tests/fuzz/fuzz_$name.c" "$out/src/libagw.a" $deps_libs -lpthread -o "$out/fuzz_$name"
done
