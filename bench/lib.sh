# Shared by the bench scripts that start their own gateway and agent (bench/instructions.sh,
# bench/pairs.sh, bench/run.sh); sourced, not run. The script sets ME (its name, for messages) before sourcing.

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

metric() { # PORT NAME -> the value of a gateway's /metrics series (empty when absent)
    curl -s -m 5 "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {print $2; exit}'
}

# history_settle PORT: the store's writer thread works after the load: waits (10 s at most) for its
# queue to empty, then for the commit that follows (one per 200 ms at most), so that the recording's
# CPU is counted in the run that caused it. With history off, no queue: the same 0.3 s pause.
history_settle() {
    local q
    for _ in $(seq 100); do
        q=$(metric "$1" agw_history_queue_bytes)
        [ -z "$q" ] || [ "$q" = 0 ] && break
        sleep 0.1
    done
    sleep 0.3
}
