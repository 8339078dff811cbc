#!/usr/bin/env bash
# Instructions per run, per thread: the gateway runs under valgrind's callgrind while the load
# generator plays short runs through it (the benchmark's "short" scenario: 10 events of 100 bytes
# per run, each event its own write(), bearer auth on, threads of 10 runs), and the instructions
# each thread executed over those runs are divided by their number. Unlike CPU time on a shared
# machine, the count is the same from one run to the next: it shows a change of a few per cent that
# timed pairs cannot. See doc/benchmarks.md ("How to reproduce").
#
# usage: bench/instructions.sh [--build DIR] [--runs N] [--warmup N] [--history on|off|both]
#                              [--query Q] [--top K] [--concurrency C]
#   BUILD (env) or --build: a configured and built tree (default: <srcdir>/_build-bench); the script
#   builds nothing. --runs N (5000) are counted after --warmup N (500) that are not. --history
#   (both): the gateway with thread history on (a fresh embedded store in the temporary directory),
#   off, or one of each. --query: the demo agent's knobs for each run (default
#   "events=10&size=100&ids=run&write_each=1"). --top K (0): also the K functions with the most
#   instructions of their own in each thread. --concurrency C (20): the runs at once; for paced
#   queries (delay_ms) use a few (4): under valgrind the gateway runs many times slower, and a loop
#   that falls behind the streams' pacing reads several events at once, which the benchmark's paced
#   load does not make it do (doc/benchmarks.md has the paced query's counts, taken with 4).
# Read the counts for what they are: callgrind counts each iteration of `rep movsb`/`rep stosb` as an
# instruction (large memcpy()/memset() look far costlier than they run), and valgrind's CPU has no
# SHA extensions (OpenSSL's SHA-256 takes its longer path). The kernel's work is not counted at all:
# about half of the loop's CPU time in this scenario.
# Needs valgrind (Debian: apt-get install valgrind), python3. Everything runs on 127.0.0.1 with
# ephemeral ports, in a temporary directory; every process started here is stopped on exit, and the
# load is bounded in time.
set -u

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$SRC/_build-bench}
RUNS=5000
WARMUP=500
HISTORY=both
QUERY="events=10&size=100&ids=run&write_each=1"
TOP=0
CONC=20

ME=bench/instructions.sh
# shellcheck source=bench/lib.sh
. "$SRC/bench/lib.sh"

while [ $# -gt 0 ]; do
    case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --history) HISTORY=$2; shift 2 ;;
    --query) QUERY=$2; shift 2 ;;
    --top) TOP=$2; shift 2 ;;
    --concurrency) CONC=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option: $1 (see --help)" ;;
    esac
done
case "$HISTORY" in on | off) MODES=$HISTORY ;; both) MODES="off on" ;; *) die "--history: on, off or both" ;; esac
case "$RUNS$WARMUP$TOP$CONC" in *[!0-9]*) die "--runs, --warmup, --top and --concurrency take numbers" ;; esac
[ "$RUNS" -gt 0 ] || die "--runs must be at least 1"
if ! command -v valgrind >/dev/null || ! command -v callgrind_control >/dev/null; then
    die "valgrind is needed (Debian: apt-get install valgrind)"
fi
GW=$BUILD/src/agui-gateway
DEMO=$BUILD/src/agui-demo-agent
LOAD=$BUILD/bench/agw-load
for b in "$GW" "$DEMO" "$LOAD"; do
    [ -x "$b" ] || die "$b is not built (make, then make bench/agw-load, in $BUILD)"
done

bench_tmp instr

TOKEN=bench-instructions-token-0123456789
TOKEN_SHA=$(printf %s "$TOKEN" | "$GW" hash-token) || die "hash-token failed"

# count MODE: one gateway under callgrind; prints "MODE THREAD ROLE INSTRUCTIONS_PER_RUN".
count() {
    local mode=$1 dir=$T/$1 hist gp dp port url f role total
    mkdir -p "$dir"
    "$DEMO" --listen 127.0.0.1:0 --port-file "$dir/demo.port" --log-level warn >"$dir/demo.log" 2>&1 &
    dp=$!
    PIDS+=("$dp")
    wait_file "$dir/demo.port" 10 || die "the demo agent did not start: $(cat "$dir/demo.log")"
    if [ "$mode" = on ]; then
        hist='"history": {"enabled": true}, "store": {"kind": "embedded", "path": "'"$dir/store"'"},'
    else
        hist='"history": {"enabled": false},'
    fi
    cat >"$dir/gw.json" <<EOF
{"listen": [{"address": "127.0.0.1", "port": 0}],
 "auth": {"keys": [{"id": "bench", "sha256": "$TOKEN_SHA", "agents": ["*"]}]},
 "log": {"level": "warn", "access": "off"}, $hist "workers": 1,
 "agents": {"short": {"upstreams": ["http://127.0.0.1:$(head -n1 "$dir/demo.port")/agent?$QUERY"]}}}
EOF
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$dir/cg.%p" \
        "$GW" -c "$dir/gw.json" --port-file "$dir/gw.port" >"$dir/gw.log" 2>&1 &
    gp=$!
    PIDS+=("$gp")
    wait_file "$dir/gw.port" 60 || die "the gateway did not start under valgrind: $(tail -5 "$dir/gw.log")"
    port=$(head -n1 "$dir/gw.port")
    url=http://127.0.0.1:$port/v1/ag-ui/agents/short/runs
    if [ "$WARMUP" -gt 0 ]; then
        "$LOAD" --url "$url" --header "Authorization: Bearer $TOKEN" --concurrency "$CONC" \
            --runs "$WARMUP" --runs-per-thread 10 --duration 300 >"$dir/warmup.json" ||
            die "the warm-up load failed"
    fi
    callgrind_control -z "$gp" >/dev/null 2>&1 || die "callgrind_control -z failed"
    "$LOAD" --url "$url" --header "Authorization: Bearer $TOKEN" --concurrency "$CONC" --runs "$RUNS" \
        --runs-per-thread 10 --duration 900 >"$dir/load.json" || die "the load failed"
    python3 - "$dir/load.json" "$RUNS" <<'EOF' || die "not every counted run succeeded"
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if d["runs_ok"] == int(sys.argv[2]) and d["runs_failed"] == 0 else 1)
EOF
    # The store's writer takes what the runs recorded within a commit interval: wait for its queue.
    for ((i = 0; i < 100; i++)); do
        q=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^agw_history_queue_bytes/ {print $2}')
        [ "${q:-0}" = 0 ] && break
        sleep 0.2
    done
    sleep 1
    callgrind_control -d "$gp" >/dev/null 2>&1 || die "callgrind_control -d failed"
    kill "$gp" "$dp"
    wait "$gp" "$dp" 2>/dev/null
    for f in "$dir"/cg.*.1-*; do
        [ -e "$f" ] || die "callgrind wrote no dump"
        total=$(awk '/^summary:/ {print $2}' "$f")
        [ "${total:-0}" -gt 0 ] || continue
        if grep -q 'writer_main' "$f"; then
            role="the store's writer"
        elif grep -q 'agw_loop_run' "$f"; then
            role="the event loop"
        else
            role="another thread"
        fi
        echo "$mode ${f##*-} $role $((total / RUNS))"
        if [ "$TOP" -gt 0 ]; then
            callgrind_annotate --threshold=100 "$f" 2>/dev/null |
                awk -v runs="$RUNS" -v top="$TOP" -v total="$total" '
                    /^ *[0-9,]+ +\( *[0-9.]+%\) / && n < top {
                        v = $1; gsub(",", "", v)
                        if (v + 0 >= total * 0.99) next # main() and its callers: the whole thread
                        line = $0; sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, "", line)
                        printf "    %8.0f  %s\n", v / runs, line; n++ }' >"$dir/top.${f##*-}"
        fi
    done >"$dir/counts"
    cat "$dir/counts"
}

echo "bench/instructions.sh: $RUNS short runs ($QUERY) after $WARMUP, build $BUILD" >&2
for m in $MODES; do
    count "$m" >"$T/counts.$m" || exit 1
done
echo
echo "| history | thread | instructions per run |"
echo "|---|---|---|"
for m in $MODES; do
    while read -r mode _ role; do
        n=${role##* }
        echo "| $mode | ${role% *} | $(printf "%'d" "$n" 2>/dev/null || echo "$n") |"
    done <"$T/counts.$m"
done
if [ "$TOP" -gt 0 ]; then
    for m in $MODES; do
        for f in "$T/$m"/top.*; do
            [ -e "$f" ] || continue
            echo
            echo "history $m, thread ${f##*.}: the $TOP functions with the most instructions of their own, per run"
            cat "$f"
        done
    done
fi
