# Shared by the bench scripts that start their own gateway and agent (bench/instructions.sh,
# bench/pairs.sh); sourced, not run. The script sets ME (its name, for messages) before sourcing.

die() {
    echo "$ME: $*" >&2
    exit 2
}

# bench_tmp NAME: the temporary directory $T (removed on exit) and the list PIDS of the processes
# started there, each stopped on exit.
bench_tmp() {
    T=$(mktemp -d "${TMPDIR:-/tmp}/agw-$1.XXXXXX")
    PIDS=()
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}

bench_cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$T"
}

wait_file() { # FILE SECONDS: until FILE is not empty
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        [ -s "$1" ] && return 0
        sleep 0.1
    done
    return 1
}
