#!/usr/bin/env bash
# The benchmark: the same scenarios against the demo agent directly, through nginx, through HAProxy
# and through the gateway, alternating the order every round, in one run; prints a markdown table of
# medians with the gateway's ratio to the best of nginx and HAProxy, and the goals, and writes them
# (plus the raw per-run JSON lines) under the build directory. See doc/benchmarks.md.
#
# usage: bench/run.sh [--quick] [--rounds K] [--seconds S] [--build DIR] [--only SCENARIOS]
#                     [--targets TARGETS] [--streams-10k N] [--batched] [--no-pin] [--workers N]
#                     [--stall] [--writer-apart] [--runs-per-thread K] [--warm-seconds W]
#   BUILD (env) or --build: a configured and built tree (default: <srcdir>/_build-bench); the script
#   builds nothing. NGINX, HAPROXY (env): the binaries (default /usr/sbin/nginx, /usr/sbin/haproxy).
#   --only "short short-new throughput paced paced2k idle2k idle10k" (or "": none) and
#   --targets "direct nginx haproxy gateway gateway-nohist" select a subset (default: all but
#   gateway-nohist; the order of --targets is the first round's; it rotates every round). gateway
#   records thread history (an embedded store in the temporary directory, fresh at each start);
#   gateway-nohist is the same gateway with "history": {"enabled": false}, on its own port: with
#   both, the table gives the cost of recording. --stall: afterwards, the loop-stall pass: for K
#   rounds, a fresh gateway with AGW_LOOP_PROBE_MS=1, history on, then off, takes the short and the
#   throughput load at once for S seconds; its longest event-loop lateness and its agw_history_*
#   series are read from /metrics, and every lateness of 1 ms or more from its log, beside those of
#   a bare event loop with the same probe on the same CPU (bench/agw-probe: the machine's own
#   pauses) (the probe costs CPU: no CPU figures from this pass).
#   --writer-apart (with pinning and --workers 1): the store's writer thread of a gateway recording
#   history runs on CPU 0 with the load generator and the agent, its event loop alone on CPU 1 (by
#   default the whole gateway is on CPU 1, the writer taking turns with the loop).
#   --rounds K (3); --seconds S (5): a timed scenario starts runs
#   for S seconds, then lets the ones under way finish. --quick: 1 round of 2 s, 500 streams for
#   paced2k and idle2k, 1,000 for idle10k. --streams-10k N: the streams of idle10k (default 10,000
#   when the descriptor limit holds two per stream in one proxy, else 9,000). --batched: the demo
#   agent writes as many events per write as it has (the default is one event per chunk and write,
#   as an agent streaming model tokens does). With 2+ CPUs and taskset, the proxy runs on CPU 1 and
#   the load generator and agent on CPU 0, for every proxy alike (--no-pin: leave it to the scheduler).
#   --workers N (1): the gateway's event loops, nginx's worker processes, HAProxy's threads.
#   --runs-per-thread K (10): each load connection moves to a new threadId every K runs, as a
#   conversation of K turns does (a thread then holds K runs of messages); 0: one thread per
#   connection for the whole run (a thread that grows by a message per run, the store's worst case).
#   --warm-seconds W (2): before each timed round of short, short-new, throughput and paced, every
#   proxy takes W seconds of that scenario's load, not recorded (paced2k: of the short load), with
#   ids of its own (agw-load --id-prefix): the gateway, restarted for each round so that its store
#   starts empty, is measured as nginx and HAProxy are, which run on from round to round: warm, not
#   in the first seconds of its caches, its store's pages and its writer's memory. 0: the runs of
#   2026-11-30 and before (200 short runs into a restarted gateway, nothing into the others).
# Needs bash, python3 (the table), curl, nginx and HAProxy for those targets. Everything runs on
# 127.0.0.1 with ephemeral ports, in a temporary directory; every process started here is stopped on
# exit, and every load run is bounded in time.
set -u

SRC=$(cd "$(dirname "$0")/.." && pwd)
ME=bench/run.sh
# shellcheck source=bench/lib.sh
. "$SRC/bench/lib.sh" # metric, history_settle (its own wait_file, below, takes a pattern)
BUILD=${BUILD:-$SRC/_build-bench}
NGINX=${NGINX:-/usr/sbin/nginx}
HAPROXY=${HAPROXY:-/usr/sbin/haproxy}
QUICK=0
ROUNDS=""
SECS=""
ALL_SCENARIOS="short short-new throughput paced paced2k idle2k idle10k"
ONLY=$ALL_SCENARIOS
TARGETS="direct nginx haproxy gateway"
N_10K=""
BATCHED=0
PIN=1
# The gateway's worker event loops (--workers); nginx gets as many worker processes and HAProxy as
# many threads, so that CPU figures compare like with like.
WORKERS=1
STALL=0
WRITER_APART=0
RUNS_PER_THREAD=10
WARM=2

while [ $# -gt 0 ]; do
    case "$1" in
    --quick) QUICK=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    --seconds) SECS=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --targets) TARGETS=$2; shift ;;
    --streams-10k) N_10K=$2; shift ;;
    --batched) BATCHED=1 ;;
    --no-pin) PIN=0 ;;
    --workers) WORKERS=$2; shift ;;
    --stall) STALL=1 ;;
    --writer-apart) WRITER_APART=1 ;;
    --runs-per-thread) RUNS_PER_THREAD=$2; shift ;;
    --warm-seconds) WARM=$2; shift ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "bench/run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$WARM" in '' | *[!0-9]*) echo "bench/run.sh: --warm-seconds takes a whole number" >&2; exit 2 ;; esac
for s in $ONLY; do
    case " $ALL_SCENARIOS " in *" $s "*) ;; *) echo "bench/run.sh: unknown scenario '$s'" >&2; exit 2 ;; esac
done
for t in $TARGETS; do
    case "$t" in direct | nginx | haproxy | gateway | gateway-nohist) ;; *) echo "bench/run.sh: unknown target '$t'" >&2; exit 2 ;; esac
done
if [ "$WRITER_APART" = 1 ] && [ "$WORKERS" != 1 ]; then
    echo "bench/run.sh: --writer-apart needs --workers 1 (the writer is told from the loops by being the second thread)" >&2
    exit 2
fi
if [ "$QUICK" = 1 ]; then
    ROUNDS=${ROUNDS:-1} SECS=${SECS:-2} N_P2K=500 N_2K=500 N_10K=${N_10K:-1000}
else
    ROUNDS=${ROUNDS:-3} SECS=${SECS:-5} N_P2K=2000 N_2K=2000
fi
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "bench/run.sh: no build directory (BUILD=...)" >&2; exit 2; }
LOAD=$BUILD/bench/agw-load
DEMO=$BUILD/src/agui-demo-agent
GW=$BUILD/src/agui-gateway
PROBE=$BUILD/bench/agw-probe
for f in "$LOAD" "$DEMO" "$GW" "$PROBE"; do
    [ -x "$f" ] || { echo "bench/run.sh: $f is not built (make -C $BUILD)" >&2; exit 2; }
done
has_target() { case " $TARGETS " in *" $1 "*) return 0 ;; esac; return 1; }
has_target nginx && { [ -x "$NGINX" ] || { echo "bench/run.sh: no nginx at $NGINX (NGINX=...)" >&2; exit 2; }; }
has_target haproxy && { [ -x "$HAPROXY" ] || { echo "bench/run.sh: no HAProxy at $HAPROXY (HAPROXY=...)" >&2; exit 2; }; }
for c in python3 curl; do
    command -v "$c" >/dev/null || { echo "bench/run.sh: needs $c" >&2; exit 2; }
done
# Pinning: left to the scheduler, the proxy sometimes shares a core with the load generator and the
# agent and sometimes not, which moves per-event latency by hundreds of µs between runs and between
# the proxies. Pinned, every proxy gets the same core to itself.
PEERS_CPU=()
PROXY_CPU=()
if [ "$PIN" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    PEERS_CPU=(taskset -c 0)
    PROXY_CPU=(taskset -c 1)
fi
if [ "$WRITER_APART" = 1 ] && [ "${#PROXY_CPU[@]}" = 0 ]; then
    echo "bench/run.sh: --writer-apart needs pinning (2+ CPUs, taskset, no --no-pin)" >&2
    exit 2
fi

# Descriptors: a relayed stream holds two in the proxy (client and upstream), one in the load
# generator and one in the agent. Every process started here gets the hard limit.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
[ "$NOFILE" = unlimited ] && NOFILE=1048576
if [ -z "$N_10K" ]; then
    N_10K=10000
    if [ $((2 * N_10K + 256)) -gt "$NOFILE" ]; then
        N_10K=9000
        echo "bench/run.sh: the descriptor limit is $NOFILE per process: 10,000 streams need 20,000+ in a proxy; idle10k runs $N_10K streams" >&2
    fi
fi
for n in "$N_2K" "$N_P2K" "$N_10K"; do
    if [ $((2 * n + 256)) -gt "$NOFILE" ]; then
        echo "bench/run.sh: warning: ulimit -n is $NOFILE; $n streams through a proxy need $((2 * n + 256))" >&2
    fi
done
MAXCONN=$((N_10K > N_2K ? N_10K : N_2K))
MAXCONN=$((MAXCONN + 500))

T=$(mktemp -d "${TMPDIR:-/tmp}/agw-bench.XXXXXX")
OUTDIR=$BUILD/bench-results
mkdir -p "$OUTDIR"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RAW=$OUTDIR/raw-$STAMP.jsonl
RESULT=$OUTDIR/results-$STAMP.md
: >"$RAW"

DEMO_PID="" NGINX_PID="" HA_PID="" GW_PID="" GWN_PID="" STALL_PID="" REF_PID="" LOAD_PID="" LOAD2_PID=""

stop() { # PID: TERM, 10 s, then KILL
    local p=$1
    [ -n "$p" ] || return 0
    kill -TERM "$p" 2>/dev/null || return 0
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    return 0
}

cleanup() {
    stop "$LOAD_PID"
    stop "$LOAD2_PID"
    stop "$STALL_PID"
    stop "$REF_PID"
    stop "$GW_PID"
    stop "$GWN_PID"
    stop "$HA_PID"
    stop "$NGINX_PID"
    stop "$DEMO_PID"
    # the gateways' logs (warnings and errors only), kept when not empty
    local f
    for f in "$T"/gw.log "$T"/gwn.log "$T"/stall.log "$T"/stalln.log; do
        [ -s "$f" ] && cp "$f" "$OUTDIR/log-$STAMP-${f##*/}" &&
            echo "bench: the gateway wrote to its log: $OUTDIR/log-$STAMP-${f##*/}" >&2
    done
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_file() { # FILE PATTERN SECONDS
    for _ in $(seq $(($3 * 10))); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Bearer auth is on, as users run the gateway: a random token, its digest from hash-token. The load
# generator sends it to every target (nginx and HAProxy pass it on; the agent ignores it).
TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
TOKEN_SHA=$(printf %s "$TOKEN" | "$GW" hash-token) || { echo "bench/run.sh: hash-token failed" >&2; exit 1; }

# ---- scenarios: demo agent query, load generator arguments ---------------------------------------
W="&write_each=1"
[ "$BATCHED" = 1 ] && W=""
# ids=run: every run's message and tool-call ids are new (-<runId> appended), as a model's are. The
# load generator keeps one thread per connection and sends the same first message every run: with
# the demo agent's default ids every run would extend one assistant message (same id) instead of
# adding one, a thread no real agent makes.
W="&ids=run$W"
P2K_EVENTS=$((SECS * 50)) # an event every 20 ms for S seconds
scenario_query() {
    case "$1" in
    short | short-new) echo "events=10&size=100$W" ;;
    throughput) echo "events=2000&size=200$W" ;;
    paced) echo "events=500&size=100&delay_ms=1&ts=1$W" ;;
    paced2k) echo "events=$P2K_EVENTS&size=100&delay_ms=20&ts=1$W" ;;
    idle2k | idle10k) echo "stall=1$W" ;;
    esac
}
# Threads: a conversation of RUNS_PER_THREAD runs per thread id (0: one per connection).
RPT=""
[ "$RUNS_PER_THREAD" != 0 ] && RPT="--runs-per-thread $RUNS_PER_THREAD"
scenario_args() {
    case "$1" in
    short) echo "--concurrency 100 --seconds $SECS $RPT" ;;
    short-new) echo "--concurrency 100 --seconds $SECS --new-conn $RPT" ;;
    throughput | paced) echo "--concurrency 50 --seconds $SECS $RPT" ;;
    paced2k) echo "--concurrency $N_P2K --runs $N_P2K" ;;
    idle2k) echo "--concurrency $N_2K --hold" ;;
    idle10k) echo "--concurrency $N_10K --hold" ;;
    esac
}
is_idle() { case "$1" in idle*) return 0 ;; esac; return 1; }

# ---- peers -------------------------------------------------------------------------------------
start_demo() {
    rm -f "$T/demo.port"
    "${PEERS_CPU[@]}" "$DEMO" --listen 127.0.0.1:0 --port-file "$T/demo.port" --log-level warn >"$T/demo.log" 2>&1 &
    DEMO_PID=$!
    wait_file "$T/demo.port" . 10 || { cat "$T/demo.log" >&2; exit 1; }
    DEMO_PORT=$(head -n1 "$T/demo.port")
}

demo_active() { # streams the agent still has open
    local v
    v=$(curl -s -m 5 "http://127.0.0.1:$DEMO_PORT/_demo/stats" | sed -n 's/.*"active_streams":\([0-9]*\).*/\1/p')
    echo "${v:-?}"
}

start_nginx() {
    NGINX_PORT=$(free_port)
    mkdir -p "$T/nginx"
    sed -e "s|@DIR@|$T/nginx|g" -e "s|@PORT@|$NGINX_PORT|g" -e "s|@UPSTREAM_PORT@|$DEMO_PORT|g" \
        -e "s|@WORKERS@|$WORKERS|g" -e "s|@NOFILE@|$NOFILE|g" -e "s|@WORKER_CONNECTIONS@|$((NOFILE - 100))|g" \
        "$SRC/bench/nginx.conf.in" >"$T/nginx/nginx.conf"
    "${PROXY_CPU[@]}" "$NGINX" -p "$T/nginx" -c "$T/nginx/nginx.conf" -e "$T/nginx/nginx-error.log" \
        >"$T/nginx/stdout.log" 2>&1 &
    NGINX_PID=$!
    for _ in $(seq 100); do
        NGINX_WORKER=$(pgrep -P "$NGINX_PID" | tr '\n' ' ')
        [ -n "$NGINX_WORKER" ] && curl -s -o /dev/null -m 1 "http://127.0.0.1:$NGINX_PORT/healthz" && return 0
        sleep 0.1
    done
    echo "bench/run.sh: nginx did not start" >&2
    cat "$T/nginx/nginx-error.log" "$T/nginx/stdout.log" >&2
    exit 1
}

start_haproxy() {
    HA_PORT=$(free_port)
    mkdir -p "$T/haproxy"
    sed -e "s|@DIR@|$T/haproxy|g" -e "s|@PORT@|$HA_PORT|g" -e "s|@UPSTREAM_PORT@|$DEMO_PORT|g" \
        -e "s|@THREADS@|$WORKERS|g" -e "s|@MAXCONN@|$MAXCONN|g" \
        "$SRC/bench/haproxy.cfg.in" >"$T/haproxy/haproxy.cfg"
    "${PROXY_CPU[@]}" "$HAPROXY" -db -f "$T/haproxy/haproxy.cfg" >"$T/haproxy/haproxy.log" 2>&1 &
    HA_PID=$!
    for _ in $(seq 100); do
        kill -0 "$HA_PID" 2>/dev/null || break
        curl -s -o /dev/null -m 1 "http://127.0.0.1:$HA_PORT/healthz" && return 0
        sleep 0.1
    done
    echo "bench/run.sh: HAProxy did not start" >&2
    cat "$T/haproxy/haproxy.log" >&2
    exit 1
}

# gateway_config HISTORY(on|off) STORE_DIR: the gateway's configuration, on stdout. History on is
# the default users get (an embedded store); it is spelled out here so that the table says what ran.
gateway_config() {
    local s first=1
    echo '{'
    echo '  "listen": [ { "address": "127.0.0.1", "port": 0 } ],'
    echo '  "auth": { "keys": [ { "id": "bench", "sha256": "'"$TOKEN_SHA"'", "agents": ["*"] } ] },'
    echo '  "log": { "level": "warn", "access": "off" },'
    if [ "$1" = on ]; then
        echo '  "history": { "enabled": true },'
        echo '  "store": { "kind": "embedded", "path": "'"$2"'" },'
    else
        echo '  "history": { "enabled": false },'
    fi
    echo "  \"workers\": $WORKERS,"
    echo '  "agents": {'
    for s in $ALL_SCENARIOS; do
        [ "$first" = 1 ] || echo ','
        first=0
        printf '    "%s": { "upstreams": ["http://127.0.0.1:%s/agent?%s"] }' \
            "$s" "$DEMO_PORT" "$(scenario_query "$s")"
    done
    echo
    echo '  }'
    echo '}'
}

# launch_gateway NAME HISTORY [VAR=VALUE...]: a gateway with files $T/NAME.*, a fresh store
# $T/NAME.store when HISTORY is on, the environment given; sets LAUNCHED_PID and LAUNCHED_PORT.
launch_gateway() {
    local name=$1 hist=$2
    shift 2
    rm -rf "$T/$name.store" "$T/$name.port"
    gateway_config "$hist" "$T/$name.store" >"$T/$name.json"
    env "$@" "${PROXY_CPU[@]}" "$GW" -c "$T/$name.json" --port-file "$T/$name.port" >>"$T/$name.log" 2>&1 &
    LAUNCHED_PID=$!
    wait_file "$T/$name.port" . 10 || {
        echo "bench/run.sh: the gateway ($name) did not start" >&2
        cat "$T/$name.log" >&2
        exit 1
    }
    LAUNCHED_PORT=$(head -n1 "$T/$name.port")
    if [ "$WRITER_APART" = 1 ] && [ "$hist" = on ]; then
        # with one worker the gateway's threads are its loop (the main thread) and the store's
        # writer, started before the port file is written
        local task
        for task in /proc/"$LAUNCHED_PID"/task/*; do
            task=${task##*/}
            [ "$task" = "$LAUNCHED_PID" ] || taskset -p -c 0 "$task" >/dev/null ||
                echo "bench/run.sh: cannot move thread $task of the gateway ($name)" >&2
        done
    fi
}

start_gateway() {
    launch_gateway gw on
    GW_PID=$LAUNCHED_PID GW_PORT=$LAUNCHED_PORT
}

start_gateway_nohist() {
    launch_gateway gwn off
    GWN_PID=$LAUNCHED_PID GWN_PORT=$LAUNCHED_PORT
}

is_gateway() { case "$1" in gateway | gateway-nohist) return 0 ;; esac; return 1; }

target_port() { # TARGET -> its port
    case "$1" in
    nginx) echo "$NGINX_PORT" ;;
    haproxy) echo "$HA_PORT" ;;
    gateway) echo "$GW_PORT" ;;
    gateway-nohist) echo "$GWN_PORT" ;;
    *) echo "$DEMO_PORT" ;;
    esac
}

# restart_target TARGET: a fresh proxy process (the memory scenarios measure from a clean heap; a
# gateway also gets a fresh store)
restart_target() {
    case "$1" in
    nginx) stop "$NGINX_PID"; NGINX_PID=""; start_nginx ;;
    haproxy) stop "$HA_PID"; HA_PID=""; start_haproxy ;;
    gateway) stop "$GW_PID"; GW_PID=""; start_gateway ;;
    gateway-nohist) stop "$GWN_PID"; GWN_PID=""; start_gateway_nohist ;;
    esac
}

target_url() { # TARGET SCENARIO
    case "$1" in
    direct) echo "http://127.0.0.1:$DEMO_PORT/agent?$(scenario_query "$2")" ;;
    nginx) echo "http://127.0.0.1:$NGINX_PORT/agent?$(scenario_query "$2")" ;;
    haproxy) echo "http://127.0.0.1:$HA_PORT/agent?$(scenario_query "$2")" ;;
    gateway) echo "http://127.0.0.1:$GW_PORT/v1/ag-ui/agents/$2/runs" ;;
    gateway-nohist) echo "http://127.0.0.1:$GWN_PORT/v1/ag-ui/agents/$2/runs" ;;
    esac
}

# The processes whose CPU and memory are the proxy's: none for direct, nginx's workers (the master
# only supervises; its RSS and CPU do not move), the HAProxy process, the gateway process.
proxy_pids() {
    case "$1" in
    direct) echo "" ;;
    nginx) echo "$NGINX_WORKER" ;;
    haproxy) echo "$HA_PID" ;;
    gateway) echo "$GW_PID" ;;
    gateway-nohist) echo "$GWN_PID" ;;
    esac
}

# cpu_ms PIDS -> CPU time in ms, summed over every thread of these processes: the scheduler's
# nanosecond account (se.sum_exec_runtime in /proc/PID/task/TID/sched) when the kernel exposes it,
# else utime+stime from /proc/PID/stat, whose 10 ms ticks would measure a round's ~0.3 CPU-s to
# about 3 %.
cpu_ms() {
    local p v
    for p in "$@"; do
        v=$(cat /proc/"$p"/task/*/sched 2>/dev/null | awk '/^se.sum_exec_runtime/ {s += $3; n++} END {if (n) printf "%.6f", s}')
        if [ -z "$v" ]; then
            v=$(cut -d')' -f2- "/proc/$p/stat" 2>/dev/null | awk -v hz="$HZ" '{print ($12 + $13) * 1000 / hz}')
        fi
        echo "${v:-0}"
    done | awk '{s += $1} END {printf "%.6f", s}'
}

# cpu_ms_main PIDS -> the same for the processes' main threads only: the gateway's with one worker
# is its event loop, the rest is the store's writer thread.
cpu_ms_main() {
    local p
    for p in "$@"; do
        awk '/^se.sum_exec_runtime/ {printf "%.6f\n", $3}' "/proc/$p/task/$p/sched" 2>/dev/null
    done | awk '{s += $1} END {printf "%.6f", s}'
}

rss_kib() { # PIDS -> VmRSS summed, KiB
    local p sum=0 v
    for p in "$@"; do
        v=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null)
        sum=$((sum + ${v:-0}))
    done
    echo "$sum"
}

HZ=$(getconf CLK_TCK)
AUTH=(--header "Authorization: Bearer $TOKEN")

# metric PORT NAME, history_settle PORT: bench/lib.sh

# run_one SCENARIO TARGET ROUND: one load run; appends one JSON line to $RAW.
run_one() {
    local s=$1 tgt=$2 round=$3 url pids c0 c1 m0 m1 d0 d1 r0 r1 out rc bound nstreams="" left
    if is_idle "$s"; then
        restart_target "$tgt"
        nstreams=$(scenario_args "$s" | awk '{print $2}')
    elif is_gateway "$tgt"; then
        # a fresh gateway, so that every round starts with an empty store (the load generator
        # reuses a thread per connection: left running, threads would grow round after round)
        restart_target "$tgt"
        warm_up "$tgt" "$s"
        history_settle "$(target_port "$tgt")"
    elif [ "$tgt" != direct ]; then # nginx, HAProxy: warmed as the gateway is (the agent needs none)
        warm_up "$tgt" "$s"
    fi
    url=$(target_url "$tgt" "$s")
    pids=$(proxy_pids "$tgt")
    bound=$([ "$QUICK" = 1 ] && echo 90 || echo 240)
    r0=$(rss_kib $pids)
    c0=$(cpu_ms $pids)
    m0=$(cpu_ms_main $pids)
    d0=$(cpu_ms "$DEMO_PID")
    if is_idle "$s"; then
        # shellcheck disable=SC2046
        "${PEERS_CPU[@]}" "$LOAD" --url "$url" $(scenario_args "$s") "${AUTH[@]}" --duration "$bound" \
            --label "$s/$tgt" >"$T/load.out" 2>"$T/load.err" &
        LOAD_PID=$!
        if wait_file "$T/load.err" '^ready' "$bound"; then
            sleep 2 # let the proxy settle (lazy frees, timers)
            r1=$(rss_kib $pids)
        else
            r1=""
            echo "bench/run.sh: $s/$tgt: the streams did not all open" >&2
        fi
        kill -TERM "$LOAD_PID" 2>/dev/null
        wait "$LOAD_PID"
        rc=$?
        LOAD_PID=""
    else
        # shellcheck disable=SC2046
        timeout $((bound + 30)) "${PEERS_CPU[@]}" "$LOAD" --url "$url" $(scenario_args "$s") "${AUTH[@]}" \
            --duration "$bound" --label "$s/$tgt" >"$T/load.out" 2>"$T/load.err"
        rc=$?
        is_gateway "$tgt" && history_settle "$(target_port "$tgt")"
        r1=$(rss_kib $pids)
    fi
    c1=$(cpu_ms $pids)
    m1=$(cpu_ms_main $pids)
    d1=$(cpu_ms "$DEMO_PID")
    out=$(head -n1 "$T/load.out")
    [ -n "$out" ] || out='{}'
    [ "$rc" = 0 ] || echo "bench/run.sh: $s/$tgt round $round: load exit $rc: $(head -c 300 "$T/load.err")" >&2
    python3 - "$s" "$tgt" "$round" "$rc" "${pids:-}" "$c0" "$c1" "$m0" "$m1" "$d0" "$d1" "$r0" "${r1:-}" \
        "$nstreams" "$out" >>"$RAW" <<'PY'
import json, sys
s, tgt, rnd, rc, pids, c0, c1, m0, m1, d0, d1, r0, r1, nstreams, out = sys.argv[1:]
o = json.loads(out)
rec = {"scenario": s, "target": tgt, "round": int(rnd), "exit": int(rc), "load": o,
       "proxy_cpu_s": (float(c1) - float(c0)) / 1000 if pids else None,
       "proxy_main_thread_cpu_s": (float(m1) - float(m0)) / 1000 if pids else None,
       "upstream_cpu_s": (float(d1) - float(d0)) / 1000,
       "rss_before_kib": int(r0) if pids else None,
       "rss_after_kib": int(r1) if pids and r1 else None}
if nstreams:
    rec["streams"] = int(nstreams)
    if pids and r1:
        rec["kib_per_stream"] = (int(r1) - int(r0)) / int(nstreams)
print(json.dumps(rec))
PY
    printf '  %-10s %-8s round %s: exit %s, %s\n' "$s" "$tgt" "$round" "$rc" \
        "$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); o=r["load"]
print("runs %s ok/%s failed, %s events, %.0f ev/s, lat p99 %s us, ttfe p50 %s us, proxy cpu %s s%s" % (o.get("runs_ok"), o.get("runs_failed"), o.get("events"), o.get("events_per_s", 0), o.get("latency_us", {}).get("p99"), o.get("ttfe_us", {}).get("p50"), "%.3f" % r["proxy_cpu_s"] if r["proxy_cpu_s"] is not None else "n/a", (", %.2f KiB/stream" % r["kib_per_stream"]) if "kib_per_stream" in r else ""))' "$(tail -n1 "$RAW")")" >&2
    if [ -n "$nstreams" ]; then
        # the next run starts with the agent's streams of this one gone (a proxy closes its
        # upstream connections once it has seen the clients go)
        for _ in $(seq 300); do
            left=$(demo_active)
            [ "$left" = 0 ] && break
            sleep 0.1
        done
        if [ "$left" != 0 ]; then
            echo "bench/run.sh: $s/$tgt: the agent still has $left streams open 30 s after the clients went; restarting $tgt" >&2
            restart_target "$tgt"
        fi
    fi
}

# warm_up TARGET [SCENARIO]: load not recorded. With SCENARIO (before a timed round) and
# --warm-seconds W > 0: W seconds of the scenario's own load (paced2k: the short one), its ids apart
# from the timed load's. Otherwise the old warm-up, 200 short runs: every target once at the start,
# and before a timed round a restarted gateway alone.
warm_up() {
    local s=${2:-} args
    if [ -n "$s" ] && [ "$WARM" != 0 ]; then
        [ "$s" = paced2k ] && s=short
        args=$(scenario_args "$s" | sed "s/--seconds [0-9]*/--seconds $WARM/")
        # shellcheck disable=SC2086 # args is a list of options
        timeout $((WARM + 90)) "${PEERS_CPU[@]}" "$LOAD" --url "$(target_url "$1" "$s")" $args "${AUTH[@]}" \
            --id-prefix warm --duration $((WARM + 60)) >/dev/null 2>&1 ||
            echo "bench/run.sh: warm-up ($s, ${WARM} s) against $1 failed" >&2
        return 0
    fi
    [ -n "$s" ] && ! is_gateway "$1" && return 0
    timeout 30 "${PEERS_CPU[@]}" "$LOAD" --url "$(target_url "$1" short)" "${AUTH[@]}" --concurrency 10 \
        --runs 200 --duration 20 >/dev/null 2>&1 || echo "bench/run.sh: warm-up against $1 failed" >&2
}

# ---- the loop-stall pass (--stall) ---------------------------------------------------------------
# stall_one TARGET ROUND: a fresh gateway (history on for gateway, off for gateway-nohist) with the
# loop probe every 1 ms, idle for S seconds (the machine's own timer lateness), then the short and the
# throughput load at once; the probe's maximum (it only grows) is read every 0.25 s. Beside the
# gateway, on its CPU, a bare event loop with the same probe (bench/agw-probe), the reference: both
# keep every lateness of 1 ms or more with its time (the gateway logs them when it stops), so that a
# lateness of the gateway's loop can be told from one of the machine's (the reference late at the
# same moment). Appends one JSON line (scenario "stall") with the maximum when idle, its steps under
# load, its parts (less the waits for a CPU; of that, the most the loop can have run:
# agw_event_loop_busy_lag_seconds_max), both probes' latenesses and the load's window (monotonic
# clock), the agw_history_* series at the end, and what each thread read from and wrote to storage
# during the load, to $RAW.
#
# thread_io PID -> JSON {"loop": [read_bytes, write_bytes], "others": [...]}: the kernel's storage
# accounting (/proc/PID/task/TID/io) of the event loops (every thread but the store's writer) and of
# the writer (the thread named agw-store): bytes read from and dirtied for storage.
thread_io() {
    python3 - "$1" <<'PY'
import json, os, sys
pid = sys.argv[1]
io = {"loop": [0, 0], "others": [0, 0]}
for tid in os.listdir(f"/proc/{pid}/task"):
    try:
        kv = dict(l.split(": ") for l in open(f"/proc/{pid}/task/{tid}/io").read().split("\n") if l)
        comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
    except OSError:
        continue
    k = "others" if comm == "agw-store" else "loop"
    io[k][0] += int(kv["read_bytes"])
    io[k][1] += int(kv["write_bytes"])
print(json.dumps(io))
PY
}

stall_one() {
    local tgt=$1 round=$2 name=stall hist=on port base bound rc1 rc2 m idle idle_self idle_busy t0 series="" io0 io1
    local m0 m1
    [ "$tgt" = gateway-nohist ] && name=stalln hist=off
    "${PROXY_CPU[@]}" "$PROBE" --report-ms 1 >"$T/ref.out" 2>&1 &
    REF_PID=$!
    launch_gateway "$name" "$hist" AGW_LOOP_PROBE_MS=1 AGW_LOOP_PROBE_REPORT_MS=1
    STALL_PID=$LAUNCHED_PID port=$LAUNCHED_PORT
    base="http://127.0.0.1:$port/v1/ag-ui/agents"
    bound=$([ "$QUICK" = 1 ] && echo 90 || echo 240)
    sleep "$SECS"
    idle=$(metric "$port" agw_event_loop_lag_seconds_max)
    idle_self=$(metric "$port" agw_event_loop_self_lag_seconds_max)
    idle_busy=$(metric "$port" agw_event_loop_busy_lag_seconds_max)
    io0=$(thread_io "$STALL_PID")
    m0=$(mono)
    t0=$(date +%s.%N)
    # shellcheck disable=SC2046
    timeout $((bound + 30)) "${PEERS_CPU[@]}" "$LOAD" --url "$base/throughput/runs" \
        $(scenario_args throughput) "${AUTH[@]}" --duration "$bound" --label "stall-throughput/$tgt" \
        >"$T/stall-tp.out" 2>"$T/stall-tp.err" &
    LOAD_PID=$!
    # shellcheck disable=SC2046
    timeout $((bound + 30)) "${PEERS_CPU[@]}" "$LOAD" --url "$base/short/runs" \
        $(scenario_args short) "${AUTH[@]}" --duration "$bound" --label "stall-short/$tgt" \
        >"$T/stall-short.out" 2>"$T/stall-short.err" &
    LOAD2_PID=$!
    while kill -0 "$LOAD_PID" 2>/dev/null || kill -0 "$LOAD2_PID" 2>/dev/null; do
        sleep 0.25
        series="$series $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN {printf "%.2f", a - b}'):$(metric "$port" agw_event_loop_lag_seconds_max)"
    done
    wait "$LOAD_PID"
    rc1=$?
    wait "$LOAD2_PID"
    rc2=$?
    LOAD_PID="" LOAD2_PID=""
    m1=$(mono)
    history_settle "$port"
    io1=$(thread_io "$STALL_PID")
    m=$(curl -s -m 5 "http://127.0.0.1:$port/metrics" | grep -E '^agw_(event_loop_((self|busy)_)?lag|history_)')
    stop "$STALL_PID"
    STALL_PID=""
    stop "$REF_PID"
    REF_PID=""
    # the latenesses the gateway logged when it stopped: read here, not left for the log's reader
    grep 'loop probe: late' "$T/$name.log" >"$T/gw-probe.out"
    sed -i '/loop probe: /d' "$T/$name.log"
    [ "$rc1" = 0 ] || echo "bench/run.sh: stall/$tgt round $round: throughput load exit $rc1: $(head -c 300 "$T/stall-tp.err")" >&2
    [ "$rc2" = 0 ] || echo "bench/run.sh: stall/$tgt round $round: short load exit $rc2: $(head -c 300 "$T/stall-short.err")" >&2
    python3 - "$tgt" "$round" "$rc1" "$rc2" "$(head -n1 "$T/stall-tp.out")" \
        "$(head -n1 "$T/stall-short.out")" "$m" "${idle:-}" "$series" "$io0" "$io1" "${idle_self:-}" "${idle_busy:-}" \
        "$m0" "$m1" "$T/gw-probe.out" "$T/ref.out" >>"$RAW" <<'PY'
import json, re, sys
tgt, rnd, rc1, rc2, tp, short, m, idle, series, io0, io1, idle_self, idle_busy, m0, m1, gwp, refp = sys.argv[1:]
LINE = re.compile(r"loop probe: late ([0-9.]+) ms at ([0-9.]+) s; own ([0-9.]+) ms, running ([0-9.]+) ms")
def lateness(path):  # [[at s, late ms, own ms, running ms], ...]
    out = []
    for line in open(path, errors="replace"):
        g = LINE.search(line)
        if g:
            out.append([float(g.group(2)), float(g.group(1)), float(g.group(3)), float(g.group(4))])
    return out
io0, io1 = json.loads(io0 or "{}"), json.loads(io1 or "{}")
io = {k: [b - a for a, b in zip(io0[k], io1[k])] for k in io1 if k in io0}
metrics = {}
for line in m.splitlines():
    k, _, v = line.partition(" ")
    metrics[k] = float(v)
steps, last = [], None  # (seconds into the load, the maximum so far) where it grew
for pt in series.split():
    t, _, v = pt.partition(":")
    if v and v != last:
        steps.append([float(t), float(v)])
        last = v
print(json.dumps({"scenario": "stall", "target": tgt, "round": int(rnd),
                  "exit": int(rc1) or int(rc2), "load": json.loads(tp or "{}"),
                  "load_short": json.loads(short or "{}"), "metrics": metrics,
                  "lag_idle_s": float(idle) if idle else None, "lag_steps": steps,
                  "lag_self_idle_s": float(idle_self) if idle_self else None,
                  "lag_busy_idle_s": float(idle_busy) if idle_busy else None,
                  "storage_io": io, "load_window": [float(m0), float(m1)],
                  "probe_gateway": lateness(gwp), "probe_reference": lateness(refp)}))
PY
    printf '  %-10s %-14s round %s: exit %s/%s, %s\n' stall "$tgt" "$round" "$rc1" "$rc2" \
        "$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); m=r["metrics"]; a=r["load"]; b=r["load_short"]
lag, idle = m.get("agw_event_loop_lag_seconds_max"), r["lag_idle_s"]
own, own_idle = m.get("agw_event_loop_self_lag_seconds_max"), r.get("lag_self_idle_s")
busy, busy_idle = m.get("agw_event_loop_busy_lag_seconds_max"), r.get("lag_busy_idle_s")
ms = lambda v: "%.2f" % (v * 1e3) if v is not None else "n/a"
print("events %s + %s, runs failed %s + %s, loop lag max idle %s ms, under load %s ms (less its waits for a CPU: idle %s, under load %s; of that running: idle %s, under load %s) (steps %s), history records %s, dropped %s, commits %s, commit max %s ms"
      % (a.get("events"), b.get("events"), a.get("runs_failed"), b.get("runs_failed"),
         ms(idle), ms(lag), ms(own_idle), ms(own), ms(busy_idle), ms(busy),
         " ".join("%.2fs:%.2fms" % (t, v * 1e3) for t, v in r["lag_steps"]),
         m.get("agw_history_records_total", "n/a"), m.get("agw_history_dropped_total", "n/a"),
         m.get("agw_history_commits_total", "n/a"),
         "%.1f" % (m["agw_history_commit_seconds_max"] * 1e3) if "agw_history_commit_seconds_max" in m else "n/a"))' \
            "$(tail -n1 "$RAW")")" >&2
}

# the monotonic clock (CLOCK_MONOTONIC, the probes' clock), in seconds
mono() { python3 -c 'import time; print("%.6f" % time.monotonic())'; }

# ---- the run -------------------------------------------------------------------------------------
STORE_FS=$(df -PT "$T" 2>/dev/null | awk 'NR == 2 {print $2 " (" $1 ")"}')
echo "bench: build $BUILD, rounds $ROUNDS, ${SECS} s per timed run, quick $QUICK, writes $([ "$BATCHED" = 1 ] && echo batched || echo 'one event each'), threads of $([ "$RUNS_PER_THREAD" = 0 ] && echo 'one per connection' || echo "$RUNS_PER_THREAD runs"), idle10k $N_10K streams, warm-up $([ "$WARM" = 0 ] && echo "200 short runs (gateways)" || echo "${WARM} s of each round's load"), tmp $T on $STORE_FS" >&2
start_demo
has_target nginx && start_nginx
has_target haproxy && start_haproxy
has_target gateway && start_gateway
has_target gateway-nohist && start_gateway_nohist

# warm-up (not recorded): every target once with short runs
for tgt in $TARGETS; do
    warm_up "$tgt"
done

set -- $TARGETS
NT=$#
for s in $ONLY; do
    echo "scenario $s: $(scenario_args "$s"), upstream query $(scenario_query "$s")" >&2
    for round in $(seq "$ROUNDS"); do
        # rotate the order every round so no target always runs first (or right after another)
        set -- $TARGETS
        shift_by=$(((round - 1) % NT))
        order="$*"
        for _ in $(seq "$shift_by"); do
            set -- $order
            first=$1; shift
            order="$* $first"
        done
        for tgt in $order; do
            run_one "$s" "$tgt" "$round"
        done
    done
done

if [ "$STALL" = 1 ]; then
    echo "loop-stall pass: short and throughput at once, AGW_LOOP_PROBE_MS=1, history on and off" >&2
    for round in $(seq "$ROUNDS"); do
        if [ $((round % 2)) = 1 ]; then order="gateway gateway-nohist"; else order="gateway-nohist gateway"; fi
        for tgt in $order; do
            stall_one "$tgt" "$round"
        done
    done
fi

NGV=$("$NGINX" -v 2>&1 | sed 's/.*\///')
HAV=$("$HAPROXY" -v 2>/dev/null | head -n1 | awk '{print $3}')
python3 "$SRC/bench/report.py" --raw "$RAW" --rounds "$ROUNDS" --seconds "$SECS" --quick "$QUICK" \
    --cpus "$(nproc)" --pinned "${#PROXY_CPU[@]}" --nginx "$NGV" --haproxy "$HAV" --batched "$BATCHED" \
    --workers "$WORKERS" --nofile "$NOFILE" --store-fs "$STORE_FS" --writer-apart "$WRITER_APART" | tee "$RESULT"
echo "bench: results in $RESULT, raw runs in $RAW" >&2
