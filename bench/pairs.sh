#!/usr/bin/env bash
# Two builds of the gateway, alternated: the same load through build A, then B, then B, then A, and
# so on, for N pairs; prints each run's proxy CPU per million events (and apart the part of the
# store's writer thread, and the p99 per-event latency for paced loads), the medians and the median
# of the pairs' own ratios. For a change whose effect is a few per cent: on a shared machine
# the figures of one run drift from the next by more than that, and alternating pairs put the two
# builds side by side within each spell. bench/run.sh is the benchmark against nginx and HAProxy;
# this is the check of one change. See doc/benchmarks.md ("How to reproduce").
#
# usage: bench/pairs.sh --a BINARY --b BINARY [--scenario S] [--pairs N] [--seconds S]
#                       [--history on|off] [--history-a on|off] [--history-b on|off] [--build DIR]
#   --a, --b: two agui-gateway binaries (e.g. a copy of the build before a change, and the build
#   after). --scenario (throughput): short, short-new (a new client connection per run),
#   throughput or paced, as in bench/run.sh (one event per write()), or short-resend (short runs
#   whose bodies carry the thread's whole conversation, as @ag-ui/client sends it: agw-load
#   --resend). --pairs (5); --seconds (5): each run, after 1 s of warm-up (its thread and run ids
#   apart: the timed load's threads are new to the store, as in bench/run.sh). --history (on): an
#   embedded store, fresh for each run, or none; --history-a and --history-b set it for one side
#   (the cost of recording: the same binary twice, --history-a off --history-b on). BUILD (env)
#   or --build: where the demo agent and agw-load are (default: <srcdir>/_build-bench).
# With 2+ CPUs the gateway runs on CPU 1, the agent and the load on CPU 0. Everything runs on
# 127.0.0.1 with ephemeral ports in a temporary directory; every process started here is stopped
# on exit.
set -u

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$SRC/_build-bench}
A="" B="" SCENARIO=throughput PAIRS=5 SECS=5 HISTORY=on HIST_A="" HIST_B=""

ME=bench/pairs.sh
# shellcheck source=bench/lib.sh
. "$SRC/bench/lib.sh"

while [ $# -gt 0 ]; do
    case "$1" in
    --a) A=$2; shift 2 ;;
    --b) B=$2; shift 2 ;;
    --scenario) SCENARIO=$2; shift 2 ;;
    --pairs) PAIRS=$2; shift 2 ;;
    --seconds) SECS=$2; shift 2 ;;
    --history) HISTORY=$2; shift 2 ;;
    --history-a) HIST_A=$2; shift 2 ;;
    --history-b) HIST_B=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option: $1 (see --help)" ;;
    esac
done
[ -x "$A" ] && [ -x "$B" ] || die "--a and --b name two agui-gateway binaries"
case "$PAIRS$SECS" in *[!0-9]*) die "--pairs and --seconds take numbers" ;; esac
[ "$PAIRS" -gt 0 ] && [ "$SECS" -gt 0 ] || die "--pairs and --seconds must be at least 1"
HIST_A=${HIST_A:-$HISTORY} HIST_B=${HIST_B:-$HISTORY}
for h in "$HISTORY" "$HIST_A" "$HIST_B"; do
    case "$h" in on | off) ;; *) die "--history, --history-a, --history-b: on or off" ;; esac
done
# bench/run.sh's scenarios: fresh message ids in every run, a new thread every 10 runs of a
# connection (before 2026-11-29 throughput and paced ran here without either: every run of a
# connection extended one message of one thread, a load no agent makes, and cheaper to record)
case "$SCENARIO" in
short) QUERY="events=10&size=100" LOADARGS="--concurrency 100" ;;
short-new) QUERY="events=10&size=100" LOADARGS="--concurrency 100 --new-conn" ;;
short-resend) QUERY="events=10&size=100" LOADARGS="--concurrency 100 --resend" ;;
throughput) QUERY="events=2000&size=200" LOADARGS="--concurrency 50" ;;
paced) QUERY="events=500&size=100&delay_ms=1&ts=1" LOADARGS="--concurrency 50" ;;
*) die "--scenario: short, short-new, short-resend, throughput or paced" ;;
esac
QUERY="$QUERY&ids=run&write_each=1" LOADARGS="$LOADARGS --runs-per-thread 10"
DEMO=$BUILD/src/agui-demo-agent
LOAD=$BUILD/bench/agw-load
for f in "$DEMO" "$LOAD"; do
    [ -x "$f" ] || die "$f is not built (make, then make bench/agw-load, in $BUILD)"
done
GW_CPU=() LOAD_CPU=()
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
    GW_CPU=(taskset -c 1) LOAD_CPU=(taskset -c 0)
fi

bench_tmp pairs

"${LOAD_CPU[@]}" "$DEMO" --listen 127.0.0.1:0 --port-file "$T/demo.port" --log-level warn \
    >"$T/demo.log" 2>&1 &
PIDS+=($!)
wait_file "$T/demo.port" 10 || die "the demo agent did not start: $(cat "$T/demo.log")"
TOKEN=bench-pairs-token-0123456789abcdef
TOKEN_SHA=$(printf %s "$TOKEN" | "$A" hash-token) || die "hash-token failed"

# writer_ticks PID: the CPU ticks of the store's writer thread (named agw-store); 0 without one.
writer_ticks() {
    local t n=0
    for t in /proc/"$1"/task/*; do
        [ "$(cat "$t/comm" 2>/dev/null)" = agw-store ] && n=$(awk '{print $14 + $15}' "$t/stat")
    done
    echo "$n"
}

# one NAME BINARY HISTORY: a fresh gateway, 1 s of warm-up, the timed load; prints "NAME CPU P99
# WRITER".
one() {
    local name=$1 bin=$2 gp port url c0 c1 w0 w1 hist
    rm -rf "$T/store" "$T/gw.port"
    if [ "$3" = on ]; then
        hist='"history": {"enabled": true}, "store": {"kind": "embedded", "path": "'"$T/store"'"},'
    else
        hist='"history": {"enabled": false},'
    fi
    cat >"$T/gw.json" <<EOF
{"listen": [{"address": "127.0.0.1", "port": 0}],
 "auth": {"keys": [{"id": "bench", "sha256": "$TOKEN_SHA", "agents": ["*"]}]},
 "log": {"level": "warn", "access": "off"}, $hist "workers": 1,
 "agents": {"a": {"upstreams": ["http://127.0.0.1:$(head -n1 "$T/demo.port")/agent?$QUERY"]}}}
EOF
    "${GW_CPU[@]}" "$bin" -c "$T/gw.json" --port-file "$T/gw.port" >"$T/gw.log" 2>&1 &
    gp=$!
    PIDS+=("$gp")
    wait_file "$T/gw.port" 10 || die "the gateway ($bin) did not start: $(tail -5 "$T/gw.log")"
    port=$(head -n1 "$T/gw.port")
    url=http://127.0.0.1:$port/v1/ag-ui/agents/a/runs
    # shellcheck disable=SC2086 # LOADARGS is a list of options
    "${LOAD_CPU[@]}" "$LOAD" --url "$url" --header "Authorization: Bearer $TOKEN" $LOADARGS \
        --seconds 1 --duration 60 --id-prefix warm >/dev/null || die "the warm-up load failed"
    history_settle "$port"
    c0=$(awk '{print $14 + $15}' "/proc/$gp/stat")
    w0=$(writer_ticks "$gp")
    # shellcheck disable=SC2086
    "${LOAD_CPU[@]}" "$LOAD" --url "$url" --header "Authorization: Bearer $TOKEN" $LOADARGS \
        --seconds "$SECS" --duration $((SECS + 60)) >"$T/load.json" || die "the load failed"
    history_settle "$port" # the writer's work on this load counted with it, as bench/run.sh does
    c1=$(awk '{print $14 + $15}' "/proc/$gp/stat")
    w1=$(writer_ticks "$gp")
    kill "$gp"
    wait "$gp" 2>/dev/null
    python3 - "$T/load.json" "$c0" "$c1" "$name" "$(getconf CLK_TCK)" "$w0" "$w1" <<'EOF' || die "the load's figures are unreadable"
import json, sys
d = json.load(open(sys.argv[1]))
if d["runs_failed"] != 0:
    sys.exit("runs failed: %d" % d["runs_failed"])
hz = int(sys.argv[5])
cpu = (int(sys.argv[3]) - int(sys.argv[2])) / hz
writer = (int(sys.argv[7]) - int(sys.argv[6])) / hz
print(sys.argv[4], "%.3f" % (cpu / d["events"] * 1e6), d.get("latency_us", {}).get("p99", 0),
      "%.3f" % (writer / d["events"] * 1e6))
EOF
}

echo "bench/pairs.sh: $SCENARIO, $PAIRS pairs of $SECS s; A = $A (history $HIST_A), B = $B (history $HIST_B)" >&2
for ((i = 1; i <= PAIRS; i++)); do
    if [ $((i % 2)) = 1 ]; then
        one A "$A" "$HIST_A" && one B "$B" "$HIST_B"
    else
        one B "$B" "$HIST_B" && one A "$A" "$HIST_A"
    fi
done | tee "$T/runs" |
    awk '{printf "  %s  %8.3f s per million events (the writer %.3f)  p99 %s us\n", $1, $2, $4, $3}'
python3 - "$T/runs" "$SCENARIO" <<'EOF'
import statistics, sys
runs = [l.split() for l in open(sys.argv[1]) if l.strip()]
cpu = {k: [float(r[1]) for r in runs if r[0] == k] for k in "AB"}
p99 = {k: [float(r[2]) for r in runs if r[0] == k] for k in "AB"}
wr = {k: [float(r[3]) for r in runs if r[0] == k] for k in "AB"}
if not cpu["A"] or len(cpu["A"]) != len(cpu["B"]):
    sys.exit("bench/pairs.sh: runs missing")
ma, mb = statistics.median(cpu["A"]), statistics.median(cpu["B"])
pairs = ", ".join("%.2f/%.2f" % ab for ab in zip(cpu["A"], cpu["B"]))
print("proxy CPU s per million events, A/B per pair: %s" % pairs)
print("medians: A %.3f, B %.3f (B/A %+.1f %%); B lower in %d of %d pairs"
      % (ma, mb, (mb / ma - 1) * 100, sum(b < a for a, b in zip(cpu["A"], cpu["B"])), len(cpu["A"])))
# Each pair's own ratio, taken in one spell: when the machine moves between spells (totals in two
# groups), the ratio of the medians compares runs of different spells; the median ratio does not.
ratios = sorted(b / a for a, b in zip(cpu["A"], cpu["B"]) if a > 0)
if ratios:
    print("B/A per pair: median %+.1f %% (from %+.1f to %+.1f %%)"
          % ((statistics.median(ratios) - 1) * 100, (ratios[0] - 1) * 100, (ratios[-1] - 1) * 100))
if any(wr["A"] + wr["B"]):
    print("the store's writer alone, medians: A %.3f, B %.3f; A/B per pair: %s"
          % (statistics.median(wr["A"]), statistics.median(wr["B"]),
             ", ".join("%.3f/%.3f" % ab for ab in zip(wr["A"], wr["B"]))))
if sys.argv[2] == "paced":
    print("p99 per-event latency medians: A %.0f us, B %.0f us"
          % (statistics.median(p99["A"]), statistics.median(p99["B"])))
EOF
