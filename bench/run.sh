#!/usr/bin/env bash
# The benchmark: the same scenarios against the demo agent directly, through nginx and through the
# gateway, alternating, in one run; prints a markdown table of medians and gateway/nginx ratios and
# writes it (plus the raw per-run JSON lines) under the build directory. See doc/benchmarks.md.
#
# usage: bench/run.sh [--quick] [--rounds K] [--build DIR] [--only SCENARIOS] [--targets TARGETS] [--no-pin]
#   BUILD (env) or --build: a configured and built tree (default: <srcdir>/_build-bench); the script
#   builds nothing. NGINX (env): the nginx binary (default /usr/sbin/nginx).
#   --only "fast paced short idle" and --targets "direct nginx gateway" select a subset.
#   With 2+ CPUs and taskset, the proxy runs on CPU 1 and the load generator and agent on CPU 0, for
#   nginx and the gateway alike (--no-pin: let the scheduler place them).
# Needs bash, python3 (the table), nginx. Everything runs on 127.0.0.1 with ephemeral ports, in a
# temporary directory; every process started here is stopped on exit, and every load run is bounded
# in time.
set -u

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$SRC/_build-bench}
NGINX=${NGINX:-/usr/sbin/nginx}
QUICK=0
ROUNDS=5
ONLY="fast paced short idle"
TARGETS="direct nginx gateway"
PIN=1

while [ $# -gt 0 ]; do
    case "$1" in
    --quick) QUICK=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --targets) TARGETS=$2; shift ;;
    --no-pin) PIN=0 ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench/run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ "$QUICK" = 1 ] && [ "$ROUNDS" = 5 ] && ROUNDS=1
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "bench/run.sh: no build directory (BUILD=...)" >&2; exit 2; }
LOAD=$BUILD/bench/agw-load
DEMO=$BUILD/src/agui-demo-agent
GW=$BUILD/src/agui-gateway
for f in "$LOAD" "$DEMO"; do
    [ -x "$f" ] || { echo "bench/run.sh: $f is not built (make -C $BUILD)" >&2; exit 2; }
done
case " $TARGETS " in
*" gateway "*) [ -x "$GW" ] || { echo "bench/run.sh: $GW is not built" >&2; exit 2; } ;;
esac
case " $TARGETS " in
*" nginx "*) [ -x "$NGINX" ] || { echo "bench/run.sh: no nginx at $NGINX (NGINX=...)" >&2; exit 2; } ;;
esac
command -v python3 >/dev/null || { echo "bench/run.sh: needs python3" >&2; exit 2; }
# Pinning: left to the scheduler, the proxy sometimes shares a core with the load generator and the
# agent and sometimes not, which moves per-event latency by hundreds of µs between runs and between
# the two proxies. Pinned, both proxies get the same core to themselves.
PEERS_CPU=()
PROXY_CPU=()
if [ "$PIN" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    PEERS_CPU=(taskset -c 0)
    PROXY_CPU=(taskset -c 1)
fi

# 2,000 streams through a proxy are 4,000+ descriptors in the proxy and 2,000 in the load generator.
ulimit -n 16384 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 8192 ]; then
    echo "bench/run.sh: warning: ulimit -n is $(ulimit -n); the 2,000-stream scenario may fail" >&2
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/agw-bench.XXXXXX")
OUTDIR=$BUILD/bench-results
mkdir -p "$OUTDIR"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RAW=$OUTDIR/raw-$STAMP.jsonl
RESULT=$OUTDIR/results-$STAMP.md
: >"$RAW"

DEMO_PID="" NGINX_PID="" GW_PID="" LOAD_PID=""

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
    stop "$GW_PID"
    stop "$NGINX_PID"
    stop "$DEMO_PID"
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_file() { # FILE PATTERN SECONDS
    local i
    for i in $(seq $(($3 * 10))); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# ---- scenarios: name, demo agent query, load generator arguments ------------------------------
if [ "$QUICK" = 1 ]; then
    Q_FAST="events=2000&size=50";          A_FAST="--concurrency 50 --runs 100"
    Q_PACED="events=200&delay_ms=1&ts=1";  A_PACED="--concurrency 20 --runs 20"
    Q_SHORT="events=5";                    A_SHORT="--concurrency 50 --runs 5000"
    N_IDLE=500
else
    Q_FAST="events=10000&size=50";         A_FAST="--concurrency 50 --runs 200"
    Q_PACED="events=500&delay_ms=1&ts=1";  A_PACED="--concurrency 20 --runs 60"
    Q_SHORT="events=5";                    A_SHORT="--concurrency 50 --runs 20000"
    N_IDLE=2000
fi
Q_IDLE="stall=1"
A_IDLE="--concurrency $N_IDLE --hold"
scenario_query() { eval "echo \$Q_$(echo "$1" | tr a-z A-Z)"; }
scenario_args() { eval "echo \$A_$(echo "$1" | tr a-z A-Z)"; }

# ---- peers -------------------------------------------------------------------------------------
start_demo() {
    rm -f "$T/demo.port"
    "${PEERS_CPU[@]}" "$DEMO" --listen 127.0.0.1:0 --port-file "$T/demo.port" --log-level warn >"$T/demo.log" 2>&1 &
    DEMO_PID=$!
    wait_file "$T/demo.port" . 10 || { cat "$T/demo.log" >&2; exit 1; }
    DEMO_PORT=$(head -n1 "$T/demo.port")
}

start_nginx() {
    NGINX_PORT=$(free_port)
    mkdir -p "$T/nginx"
    sed -e "s|@DIR@|$T/nginx|g" -e "s|@PORT@|$NGINX_PORT|g" -e "s|@UPSTREAM_PORT@|$DEMO_PORT|g" \
        "$SRC/bench/nginx.conf.in" >"$T/nginx/nginx.conf"
    "${PROXY_CPU[@]}" "$NGINX" -p "$T/nginx" -c "$T/nginx/nginx.conf" -e "$T/nginx/nginx-error.log" \
        >"$T/nginx/stdout.log" 2>&1 &
    NGINX_PID=$!
    for _ in $(seq 100); do
        NGINX_WORKER=$(pgrep -P "$NGINX_PID" | head -n1)
        [ -n "$NGINX_WORKER" ] && curl -s -o /dev/null -m 1 "http://127.0.0.1:$NGINX_PORT/healthz" && return 0
        sleep 0.1
    done
    echo "bench/run.sh: nginx did not start" >&2
    cat "$T/nginx/nginx-error.log" "$T/nginx/stdout.log" >&2
    exit 1
}

start_gateway() {
    local s
    {
        echo '{'
        echo '  "listen": [ { "address": "127.0.0.1", "port": 0 } ],'
        echo '  "auth": { "mode": "none" },'
        echo '  "log": { "level": "warn", "access": "off" },'
        echo '  "workers": 1,'
        echo '  "agents": {'
        for s in fast paced short idle; do
            printf '    "%s": { "upstreams": ["http://127.0.0.1:%s/agent?%s"] }' \
                "$s" "$DEMO_PORT" "$(scenario_query "$s")"
            [ "$s" = idle ] && echo || echo ','
        done
        echo '  }'
        echo '}'
    } >"$T/gw.json"
    rm -f "$T/gw.port"
    "${PROXY_CPU[@]}" "$GW" -c "$T/gw.json" --port-file "$T/gw.port" >"$T/gw.log" 2>&1 &
    GW_PID=$!
    wait_file "$T/gw.port" . 10 || { echo "bench/run.sh: the gateway did not start" >&2; cat "$T/gw.log" >&2; exit 1; }
    GW_PORT=$(head -n1 "$T/gw.port")
}

restart_target() { # TARGET: a fresh proxy process (the memory scenario measures from a clean heap)
    case "$1" in
    nginx) stop "$NGINX_PID"; NGINX_PID=""; start_nginx ;;
    gateway) stop "$GW_PID"; GW_PID=""; start_gateway ;;
    esac
}

target_url() { # TARGET SCENARIO
    case "$1" in
    direct) echo "http://127.0.0.1:$DEMO_PORT/agent?$(scenario_query "$2")" ;;
    nginx) echo "http://127.0.0.1:$NGINX_PORT/agent?$(scenario_query "$2")" ;;
    gateway) echo "http://127.0.0.1:$GW_PORT/v1/ag-ui/agents/$2/runs" ;;
    esac
}

# The processes whose CPU and memory are the proxy's: none for direct, nginx's worker (the master
# only supervises; its RSS and CPU do not move), the gateway process (all its threads).
proxy_pids() {
    case "$1" in
    direct) echo "" ;;
    nginx) echo "$NGINX_WORKER" ;;
    gateway) echo "$GW_PID" ;;
    esac
}

# cpu_ms PIDS -> CPU time in ms, summed: the scheduler's nanosecond account (se.sum_exec_runtime in
# /proc/PID/sched; user and system time of these single-threaded processes) when the kernel exposes
# it, else utime+stime from /proc/PID/stat, whose 10 ms ticks would measure a round's ~0.3 CPU-s to
# about 3 %.
cpu_ms() {
    local p sum=0 v
    for p in "$@"; do
        v=$(awk '/^se.sum_exec_runtime/ {print $3}' "/proc/$p/sched" 2>/dev/null)
        if [ -z "$v" ]; then
            v=$(cut -d')' -f2- "/proc/$p/stat" 2>/dev/null | awk -v hz="$HZ" '{print ($12 + $13) * 1000 / hz}')
        fi
        sum=$(awk -v a="$sum" -v b="${v:-0}" 'BEGIN {printf "%.6f", a + b}')
    done
    echo "$sum"
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

# run_one SCENARIO TARGET ROUND: one load run; appends one JSON line to $RAW.
run_one() {
    local s=$1 tgt=$2 round=$3 url pids c0 c1 d0 d1 r0 r1 out rc bound
    url=$(target_url "$tgt" "$s")
    if [ "$s" = idle ]; then
        restart_target "$tgt"
        url=$(target_url "$tgt" "$s")
    fi
    pids=$(proxy_pids "$tgt")
    bound=$([ "$QUICK" = 1 ] && echo 60 || echo 180)
    r0=$(rss_kib $pids)
    c0=$(cpu_ms $pids)
    d0=$(cpu_ms "$DEMO_PID")
    if [ "$s" = idle ]; then
        # shellcheck disable=SC2046
        "${PEERS_CPU[@]}" "$LOAD" --url "$url" $(scenario_args "$s") --duration "$bound" --label "$s/$tgt" \
            >"$T/load.out" 2>"$T/load.err" &
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
        timeout $((bound + 30)) "${PEERS_CPU[@]}" "$LOAD" --url "$url" $(scenario_args "$s") --duration "$bound" \
            --label "$s/$tgt" >"$T/load.out" 2>"$T/load.err"
        rc=$?
        r1=$(rss_kib $pids)
    fi
    c1=$(cpu_ms $pids)
    d1=$(cpu_ms "$DEMO_PID")
    out=$(head -n1 "$T/load.out")
    [ -n "$out" ] || out='{}'
    [ "$rc" = 0 ] || echo "bench/run.sh: $s/$tgt round $round: load exit $rc: $(head -c 300 "$T/load.err")" >&2
    python3 - "$s" "$tgt" "$round" "$rc" "$HZ" "${pids:-}" "$c0" "$c1" "$d0" "$d1" "$r0" "${r1:-}" \
        "$N_IDLE" "$out" >>"$RAW" <<'PY'
import json, sys
s, tgt, rnd, rc, hz, pids, c0, c1, d0, d1, r0, r1, nidle, out = sys.argv[1:]
o = json.loads(out)
hz = int(hz)
rec = {"scenario": s, "target": tgt, "round": int(rnd), "exit": int(rc), "load": o,
       "proxy_cpu_s": (float(c1) - float(c0)) / 1000 if pids else None,
       "upstream_cpu_s": (float(d1) - float(d0)) / 1000,
       "rss_before_kib": int(r0) if pids else None,
       "rss_after_kib": int(r1) if pids and r1 else None}
if s == "idle" and pids and r1:
    rec["kib_per_stream"] = (int(r1) - int(r0)) / int(nidle)
print(json.dumps(rec))
PY
    printf '  %-6s %-8s round %s: exit %s, %s\n' "$s" "$tgt" "$round" "$rc" \
        "$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); o=r["load"]
print("runs %s ok/%s failed, %s events, %.0f ev/s, lat p99 %s us, ttfe p50 %s us, proxy cpu %s s%s" % (o.get("runs_ok"), o.get("runs_failed"), o.get("events"), o.get("events_per_s", 0), o.get("latency_us", {}).get("p99"), o.get("ttfe_us", {}).get("p50"), r["proxy_cpu_s"], (", %.2f KiB/stream" % r["kib_per_stream"]) if "kib_per_stream" in r else ""))' "$(tail -n1 "$RAW")")" >&2
}

# ---- the run -------------------------------------------------------------------------------------
echo "bench: build $BUILD, rounds $ROUNDS, quick $QUICK, tmp $T" >&2
start_demo
case " $TARGETS " in *" nginx "*) start_nginx ;; esac
case " $TARGETS " in *" gateway "*) start_gateway ;; esac

# warm-up (not recorded): every target once with a short run
for tgt in $TARGETS; do
    timeout 30 "${PEERS_CPU[@]}" "$LOAD" --url "$(target_url "$tgt" short)" --concurrency 10 --runs 200 --duration 20 \
        >/dev/null 2>&1 || echo "bench/run.sh: warm-up against $tgt failed" >&2
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

python3 - "$RAW" "$ROUNDS" "$QUICK" "$(nproc)" "$("$NGINX" -v 2>&1 | sed 's/.*\///')" "${#PROXY_CPU[@]}" <<'PY' | tee "$RESULT"
import json, statistics, sys
raw, rounds, quick, ncpu, ngv, pinned = sys.argv[1:]
recs = [json.loads(l) for l in open(raw) if l.strip()]
def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None
def get(s, t, f):
    return med([f(r) for r in recs if r["scenario"] == s and r["target"] == t])
def fmt(v, nd=0):
    if v is None: return "n/a"
    if nd == 0: return f"{v:,.0f}"
    return f"{v:,.{nd}f}"
def ratio(a, b, nd=2):
    if a is None or b in (None, 0): return "n/a"
    return f"{a / b:.{nd}f}"
def cpu_per_mev(r):
    c, e = r.get("proxy_cpu_s"), r["load"].get("events", 0)
    return c / e * 1e6 if c is not None and e else None
def ev_per_cpu(r):
    c, e = r.get("proxy_cpu_s"), r["load"].get("events", 0)
    return e / c if c and e else None
def cpu_per_krun(r):
    c, n = r.get("proxy_cpu_s"), r["load"].get("runs_ok", 0)
    return c / n * 1e6 if c is not None and n else None
L = r_ = None
targets = [t for t in ("direct", "nginx", "gateway") if any(r["target"] == t for r in recs)]
scen = [s for s in ("fast", "paced", "short", "idle") if any(r["scenario"] == s for r in recs)]
out = []
out.append(f"Medians of {rounds} round(s){' (--quick)' if quick == '1' else ''}; {ncpu} CPUs"
           f"{' (proxy pinned to CPU 1, load generator and agent to CPU 0)' if pinned != '0' else ' (not pinned)'}; nginx {ngv}; "
           "proxy CPU = on-CPU time of the proxy process (nginx: its one worker), from /proc/PID/sched; ratio = gateway / nginx.\n")
rows = []
def row(scenario, metric, f, nd=0, better=""):
    vals = {t: get(scenario, t, f) for t in targets}
    r = ratio(vals.get("gateway"), vals.get("nginx")) if "gateway" in vals and "nginx" in vals else "n/a"
    rows.append([scenario, metric] + [fmt(vals[t], nd) for t in targets] + [r, better])
for s in scen:
    if s != "idle":
        row(s, "events/s", lambda r: r["load"].get("events_per_s"), 0, "higher")
        row(s, "runs failed (sum)", None or (lambda r: r["load"].get("runs_failed", 0) + r["load"].get("run_errors", 0)), 0, "")
        row(s, "TTFE p50 (µs)", lambda r: r["load"].get("ttfe_us", {}).get("p50"), 0, "lower")
        row(s, "TTFE p99 (µs)", lambda r: r["load"].get("ttfe_us", {}).get("p99"), 0, "lower")
        row(s, "proxy CPU s / M events", cpu_per_mev, 2, "lower")
        row(s, "events per proxy CPU-s", ev_per_cpu, 0, "higher")
    if s == "paced":
        row(s, "latency p50 (µs)", lambda r: r["load"].get("latency_us", {}).get("p50"), 0, "lower")
        row(s, "latency p99 (µs)", lambda r: r["load"].get("latency_us", {}).get("p99"), 0, "lower")
    if s == "short":
        row(s, "runs/s", lambda r: r["load"].get("runs_per_s"), 0, "higher")
        row(s, "proxy CPU ms / 1000 runs", cpu_per_krun, 1, "lower")
    if s == "idle":
        row(s, "TTFE p50 (µs)", lambda r: r["load"].get("ttfe_us", {}).get("p50"), 0, "lower")
        row(s, "RSS before (KiB)", lambda r: r.get("rss_before_kib"), 0, "")
        row(s, "RSS with streams open (KiB)", lambda r: r.get("rss_after_kib"), 0, "")
        row(s, "KiB per open stream", lambda r: r.get("kib_per_stream"), 2, "lower")
# fix the "runs failed" row to be a sum, not a median
for rr in rows:
    if rr[1] == "runs failed (sum)":
        s = rr[0]
        for i, t in enumerate(targets):
            rr[2 + i] = str(sum(r["load"].get("runs_failed", 0) + r["load"].get("run_errors", 0)
                                for r in recs if r["scenario"] == s and r["target"] == t))
        rr[2 + len(targets)] = ""
hdr = ["scenario", "metric"] + targets + ["gateway/nginx", "better"]
out.append("| " + " | ".join(hdr) + " |")
out.append("|" + "|".join(["---"] * len(hdr)) + "|")
for rr in rows:
    out.append("| " + " | ".join(rr) + " |")
# goals
out.append("\nGoals (same-run ratios):")
def g(s, t, f): return get(s, t, f)
if "gateway" in targets and "nginx" in targets:
    a, b = g("fast", "gateway", ev_per_cpu), g("fast", "nginx", ev_per_cpu)
    if a and b:
        out.append(f"- events per CPU-second, fast scenario: gateway/nginx = {a / b:.2f} (goal >= 1.00): {'met' if a >= b else 'MISSED by %.0f%%' % ((1 - a / b) * 100)}")
    if "direct" in targets:
        f = lambda r: r["load"].get("latency_us", {}).get("p99")
        d, n_, gw = g("paced", "direct", f), g("paced", "nginx", f), g("paced", "gateway", f)
        if None not in (d, n_, gw):
            an, ag = n_ - d, gw - d
            out.append(f"- added p99 latency over direct, paced scenario: nginx {an:+,.0f} µs, gateway {ag:+,.0f} µs (goal: gateway <= nginx): {'met' if ag <= an else f'MISSED by {ag - an:+,.0f} µs'}")
    f = lambda r: r.get("kib_per_stream")
    a, b = g("idle", "gateway", f), g("idle", "nginx", f)
    if a is not None and b is not None:
        out.append(f"- KiB per idle stream: gateway {a:.2f}, nginx {b:.2f} (goal: gateway <= nginx): {'met' if a <= b else 'MISSED by %.2f KiB (x%.2f)' % (a - b, a / b if b else float('inf'))}")
print("\n".join(out))
PY
echo "bench: results in $RESULT, raw runs in $RAW" >&2
