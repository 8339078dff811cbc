#!/usr/bin/env bash
# The soak benchmark: many mixed runs (normal, cancelled, cut by the client, human in the loop,
# upstream failures, invalid requests) through a gateway built with AddressSanitizer + UBSan. Every
# run's outcome is checked; the gateway's RSS and descriptors are sampled once idle after a warm-up
# and after each phase; at the end the gateway is stopped with SIGTERM and its sanitizer log must be
# empty. See doc/benchmarks.md, "Soak".
#
# usage: bench/soak.sh [--runs N] [--concurrency C] [--phases K] [--seed S] [--warmup N]
#                      [--mix normal=50,cancel=10,cut=10,hitl=10,upstream=10,invalid=10]
#                      [--pool-wait S] [--build DIR] [--no-pin] [--allow-unsanitized]
#   BUILD (env) or --build: a configured and built tree with --enable-sanitizers (default
#   <srcdir>/_build-san); the script builds nothing and refuses an unsanitized gateway unless
#   --allow-unsanitized. --runs (default 100000) are played in --phases (default 5) of equal size,
#   --concurrency (default 64) at once, after --warmup runs (default 20000; not counted: the
#   baseline is taken once the gateway's pools and the history store's caches have filled, which
#   takes about 20,000 of these runs, doc/benchmarks.md "Soak").
#   --pool-wait S: after the last phase, wait up to S seconds (default 70; 0 = do not wait) for the
#   gateway's idle pooled upstream connections to reach their keep-alive timeout (60 s) and close.
#   With 2+ CPUs and taskset, the gateway runs on CPU 1, the demo agent and the client on CPU 0.
#   Environment: ASAN_QUARANTINE_MB (default 64), RSS_TOLERANCE_KIB (default 16384).
# Needs bash, python3, curl; the client is bench/agw-soak (bench/soak.c), built with the tree.
# Exit status 0 only when every run matched, nothing timed out, descriptors came back to the
# baseline, RSS stopped growing, the gateway exited 0 on SIGTERM and no sanitizer report was written.
# Everything runs on 127.0.0.1 with ephemeral ports; every process started here is stopped on exit.
# Results (summary, per-phase JSON, sanitizer and process logs; on failure the access log too) go to
# $BUILD/soak-results/<stamp>/.
set -u

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$SRC/_build-san}
RUNS=100000
CONC=64
PHASES=5
SEED=1
WARMUP=
POOL_WAIT=70
MIX=normal=50,cancel=10,cut=10,hitl=10,upstream=10,invalid=10
PIN=1
ALLOW_UNSAN=0
RSS_TOLERANCE_KIB=${RSS_TOLERANCE_KIB:-16384} # RSS growth allowed (baseline -> after, phase 1 -> last)
# ASan keeps freed memory in a quarantine (256 MiB by default) to catch uses after free; RSS grows
# until it is full. A smaller one fills during the warm-up, so that the baseline taken after it is
# comparable with the figures after the soak. 64 MiB still holds the frees of hundreds of runs.
ASAN_QUARANTINE_MB=${ASAN_QUARANTINE_MB:-64}

while [ $# -gt 0 ]; do
    case "$1" in
    --runs) RUNS=$2; shift ;;
    --concurrency) CONC=$2; shift ;;
    --phases) PHASES=$2; shift ;;
    --seed) SEED=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --pool-wait) POOL_WAIT=$2; shift ;;
    --mix) MIX=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --no-pin) PIN=0 ;;
    --allow-unsanitized) ALLOW_UNSAN=1 ;;
    -h | --help) sed -n '2,/^set -u$/{/^set -u$/d;p}' "$0"; exit 0 ;;
    *) echo "bench/soak.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
# With --no-pin the gateway runs a loop per CPU: each loop's arena and pool fill on its share of the
# runs, so the baseline needs a longer warm-up to be taken from the steady state.
WARMUP=${WARMUP:-20000}
for v in RUNS CONC PHASES SEED WARMUP POOL_WAIT; do
    case "${!v}" in '' | *[!0-9]*) echo "bench/soak.sh: ${v,,} expects a number, got '${!v}'" >&2; exit 2 ;; esac
done
[ "$RUNS" -ge 1 ] && [ "$CONC" -ge 1 ] && [ "$PHASES" -ge 1 ] || { echo "bench/soak.sh: runs, concurrency and phases must be >= 1" >&2; exit 2; }
[ "$PHASES" -le "$RUNS" ] || PHASES=$RUNS
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "bench/soak.sh: no build directory (BUILD=...)" >&2; exit 2; }
SOAK=$BUILD/bench/agw-soak
DEMO=$BUILD/src/agui-demo-agent
GW=$BUILD/src/agui-gateway
for f in "$SOAK" "$DEMO" "$GW"; do
    [ -x "$f" ] || { echo "bench/soak.sh: $f is not built (make -C $BUILD)" >&2; exit 2; }
done
for c in python3 curl; do
    command -v "$c" >/dev/null || { echo "bench/soak.sh: needs $c" >&2; exit 2; }
done

# ---- is the gateway sanitized? ------------------------------------------------------------------
sanitizers() { # BINARY -> "asan ubsan" (what it was built with)
    local syms out=""
    syms=$( (nm -D "$1"; nm "$1") 2>/dev/null)
    if grep -q '__asan_init\|__asan_report' <<<"$syms" || ldd "$1" 2>/dev/null | grep -q libasan; then out="asan"; fi
    if grep -q '__ubsan_handle' <<<"$syms" || ldd "$1" 2>/dev/null | grep -q libubsan; then out="$out ubsan"; fi
    echo "${out# }"
}
GW_SAN=$(sanitizers "$GW")
if [ "$GW_SAN" != "asan ubsan" ]; then
    {
        echo "################################################################################"
        echo "bench/soak.sh: $GW is NOT built with AddressSanitizer and UBSan (found: '${GW_SAN:-none}')."
        echo "A soak of an unsanitized gateway proves nothing about memory errors. Build one:"
        echo "  ./autogen.sh && mkdir -p _build-san && cd _build-san && ../configure --enable-sanitizers && make"
        echo "################################################################################"
    } >&2
    [ "$ALLOW_UNSAN" = 1 ] || exit 2
    echo "bench/soak.sh: --allow-unsanitized: going on; the sanitizer check below is void" >&2
fi

PEERS_CPU=()
GW_CPU=()
if [ "$PIN" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    PEERS_CPU=(taskset -c 0)
    GW_CPU=(taskset -c 1)
fi
ulimit -n 16384 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$BUILD/soak-results/$STAMP
SAN=$OUT/sanitizers
mkdir -p "$SAN"
T=$(mktemp -d "${TMPDIR:-/tmp}/agw-soak.XXXXXX")
SUMMARY=$OUT/summary.txt
PHASES_JSON=$OUT/phases.jsonl
: >"$PHASES_JSON"

DEMO_PID="" GW_PID="" SOAK_PID=""
stop() { # PID SECONDS: TERM, wait, then KILL
    local p=$1 i
    [ -n "$p" ] || return 0
    kill -TERM "$p" 2>/dev/null || return 0
    for i in $(seq $((${2:-10} * 10))); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    return 0
}
cleanup() {
    stop "$SOAK_PID" 5
    stop "$GW_PID" 10
    stop "$DEMO_PID" 10
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "soak: $*" | tee -a "$OUT/soak.log" >&2; }
FAILURES=()
fail() { FAILURES+=("$*"); log "FAIL: $*"; }

wait_file() { # FILE SECONDS
    local i
    for i in $(seq $(($2 * 10))); do
        [ -s "$1" ] && return 0
        sleep 0.1
    done
    return 1
}

# Sanitizer options: every report goes to a file under $SAN (log_path appends .<pid>), the process
# aborts on the first error (so a report also shows as a crash), leaks are looked for at exit.
san_env() { # NAME -> SAN_ENV: the environment assignments for a process called NAME
    SAN_ENV=(
        "ASAN_OPTIONS=log_path=$SAN/$1.asan:detect_leaks=1:abort_on_error=1:halt_on_error=1:quarantine_size_mb=$ASAN_QUARANTINE_MB:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1"
        "LSAN_OPTIONS=log_path=$SAN/$1.lsan"
        "UBSAN_OPTIONS=log_path=$SAN/$1.ubsan:print_stacktrace=1:halt_on_error=1:abort_on_error=1"
    )
}

# ---- peers -----------------------------------------------------------------------------------------
TOKEN="soak-$(od -An -N8 -tx8 /dev/urandom | tr -d ' \n')"
HASH=$(printf %s "$TOKEN" | "$GW" hash-token 2>/dev/null) || HASH=""
[ ${#HASH} = 64 ] || { echo "bench/soak.sh: '$GW hash-token' failed" >&2; exit 1; }
MAX_BODY=65536

san_env demo
env "${SAN_ENV[@]}" "${PEERS_CPU[@]}" "$DEMO" --listen 127.0.0.1:0 --port-file "$T/demo.port" --log-level warn \
    >"$OUT/demo.log" 2>&1 &
DEMO_PID=$!
wait_file "$T/demo.port" 10 || { cat "$OUT/demo.log" >&2; echo "bench/soak.sh: the demo agent did not start" >&2; exit 1; }
DEMO_PORT=$(head -n1 "$T/demo.port")
# a port nobody listens on (the 'down' agent): bound, then closed
DOWN_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

U="http://127.0.0.1:$DEMO_PORT/agent"
# Every soak run starts a thread of its own; the history cache (history.cache_threads, default 10,000)
# would grow through the phases until it holds that many and hide a leak behind its growth. A cache of
# 500 fills during the warm-up, so the baseline already holds it.
cat >"$OUT/gateway.json" <<EOF
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "mode": "bearer", "keys": [ { "id": "soak", "sha256": "$HASH", "agents": ["*"] } ] },
  "log": { "level": "info", "access": "$T/access.log" },
  "limits": { "max_body_bytes": $MAX_BODY },
  "timeouts": { "first_byte": "2s" },
  "store": { "kind": "embedded", "path": "$T/store" },
  "history": { "cache_threads": 500 },
  "agents": {
    "chat":  { "upstreams": ["$U?events=8&size=16&write_each=1"], "forward_headers": ["X-Demo-Events", "X-Demo-Size"] },
    "stall": { "upstreams": ["$U?stall=1"] },
    "slow":  { "upstreams": ["$U?events=1000&delay_ms=5"] },
    "fast":  { "upstreams": ["$U?events=5000&size=1024"] },
    "detach": { "upstreams": ["$U?events=40&delay_ms=2"], "on_client_disconnect": "detach" },
    "detach-stall": { "upstreams": ["$U?stall=1"], "on_client_disconnect": "detach" },
    "hitl":  { "upstreams": ["$U?wait_decision=1"] },
    "err":   { "upstreams": ["$U?status=500"], "forward_headers": ["X-Demo-Status", "X-Demo-First-Byte-Delay-Ms"] },
    "drop":  { "upstreams": ["$U?drop_after=3&events=20"], "forward_headers": ["X-Demo-Drop-After"] },
    "down":  { "upstreams": ["http://127.0.0.1:$DOWN_PORT/agent"] }
  }
}
EOF
san_env gateway
env "${SAN_ENV[@]}" "${GW_CPU[@]}" "$GW" -c "$OUT/gateway.json" --port-file "$T/gw.port" >"$OUT/gateway.log" 2>&1 &
GW_PID=$!
wait_file "$T/gw.port" 20 || { cat "$OUT/gateway.log" >&2; echo "bench/soak.sh: the gateway did not start" >&2; exit 1; }
GW_PORT=$(head -n1 "$T/gw.port")
log "build $BUILD ($GW_SAN), commit $(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) CPUs$([ ${#GW_CPU[@]} -gt 0 ] && echo ', gateway pinned to CPU 1, agent and client to CPU 0')"
log "gateway pid $GW_PID on port $GW_PORT, demo agent pid $DEMO_PID on port $DEMO_PORT; results in $OUT"

# ---- probes ------------------------------------------------------------------------------------------
metrics() { curl -s -m 5 "http://127.0.0.1:$GW_PORT/metrics"; }
demo_stats() { curl -s -m 5 "http://127.0.0.1:$DEMO_PORT/_demo/stats"; }
metric() { # NAME [TEXT] -> value (0 when absent)
    awk -v n="$1" '$1 == n {print $2; f=1} END {if (!f) print 0}' <<<"${2:-$(metrics)}"
}
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$GW_PID/status" 2>/dev/null; }
hwm_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$GW_PID/status" 2>/dev/null; }

# fd_census -> one JSON object: the gateway's descriptors by kind (listen, upstream = TCP to the
# demo agent or the down port, client = accepted TCP, other sockets, other descriptors). The store's
# rollback journal is left out: SQLite opens it for each commit and closes it after, so a sample taken
# during a commit would count one descriptor more than the next.
fd_census() {
    python3 - "$GW_PID" "$GW_PORT" "$DEMO_PORT" "$DOWN_PORT" <<'PY'
import json, os, sys
pid, gwp, demop, downp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
socks = {}
for f in ("tcp", "tcp6"):
    try:
        lines = open(f"/proc/{pid}/net/{f}").read().splitlines()[1:]
    except OSError:
        continue
    for l in lines:
        p = l.split()
        lport = int(p[1].rsplit(":", 1)[1], 16)
        rport = int(p[2].rsplit(":", 1)[1], 16)
        socks[p[9]] = (lport, rport, p[3])
c = {"total": 0, "listen": 0, "upstream": 0, "client": 0, "other_sockets": 0, "other": 0,
     "tcp_states": {}}
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        t = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        continue
    if t.endswith("-journal"):
        continue  # the store's rollback journal: open only while a commit runs
    c["total"] += 1
    if t.startswith("socket:["):
        ino = t[8:-1]
        if ino in socks:
            lp, rp, st = socks[ino]
            if st == "0A":
                c["listen"] += 1
            elif rp in (demop, downp):
                c["upstream"] += 1
                c["tcp_states"][st] = c["tcp_states"].get(st, 0) + 1
            elif lp == gwp:
                c["client"] += 1
                c["tcp_states"][st] = c["tcp_states"].get(st, 0) + 1
            else:
                c["other_sockets"] += 1
        else:
            c["other_sockets"] += 1
    else:
        c["other"] += 1
c["without_upstream"] = c["total"] - c["upstream"]
print(json.dumps(c))
PY
}

# settle LABEL: waits (up to 30 s) until no run is open in the gateway and no stream in the agent,
# then 2 s more, so that the sample that follows sees an idle process.
settle() {
    local i m d
    for i in $(seq 300); do
        m=$(metrics)
        d=$(demo_stats)
        if [ "$(metric agw_open_relays "$m")" = 0 ] && [ "$(metric agw_active_runs "$m")" = 0 ] &&
            python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d["active_streams"]==0 and d["waiting"]==0 else 1)' "$d" 2>/dev/null; then
            sleep 2
            return 0
        fi
        sleep 0.1
    done
    fail "$1: the gateway or the agent did not become idle within 30 s: open_relays $(metric agw_open_relays "$m"), active_runs $(metric agw_active_runs "$m"), agent $d"
    return 1
}

# sample LABEL [SOAK_JSON_FILE]: one JSON line in $PHASES_JSON (RSS, descriptors, metrics, agent)
sample() {
    local label=$1 res=${2:-} m d fds
    m=$(metrics)
    sleep 0.3 # the /metrics connection is closed by now
    fds=$(fd_census)
    d=$(demo_stats)
    python3 - "$label" "$(rss_kib)" "$(hwm_kib)" "$fds" "$d" "$m" "$res" >>"$PHASES_JSON" <<'PY'
import json, sys
label, rss, hwm, fds, demo, m, res = sys.argv[1:]
met = {}
for l in m.splitlines():
    if l and not l.startswith("#"):
        k, _, v = l.rpartition(" ")
        try:
            met[k] = float(v)
        except ValueError:
            pass
rec = {"label": label, "rss_kib": int(rss or 0), "hwm_kib": int(hwm or 0), "fds": json.loads(fds),
       "demo": json.loads(demo) if demo else {}, "metrics": met}
if res:
    try:
        rec["soak"] = json.loads(open(res).read().splitlines()[0])
    except Exception:
        rec["soak"] = None
print(json.dumps(rec))
PY
    tail -n1 "$PHASES_JSON" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read()); f = r["fds"]
s = r.get("soak") or {}
extra = (", %d runs, %d mismatches, %.0f runs/s" % (s.get("runs", 0), s.get("mismatches", 0), s.get("runs_per_s", 0))) if s else ""
print("soak: %-10s RSS %6d KiB, fds %d (listen %d, pooled upstream %d, client %d, other sockets %d, other %d)%s"
      % (r["label"], r["rss_kib"], f["total"], f["listen"], f["upstream"], f["client"], f["other_sockets"], f["other"], extra))' |
        tee -a "$OUT/soak.log" >&2
}

# play LABEL RUNS SEED: one agw-soak invocation, bounded in time
play() {
    local label=$1 n=$2 seed=$3 rc bound
    bound=$((600 + n / 20)) # generous: a sanitized gateway does a few hundred runs/s at worst
    san_env agw-soak
    env "${SAN_ENV[@]}" "${PEERS_CPU[@]}" "$SOAK" --url "http://127.0.0.1:$GW_PORT" --token "$TOKEN" \
 --mix "$MIX" \
        --runs "$n" --concurrency "$CONC" --seed "$seed" --prefix "$label" --max-body "$MAX_BODY" \
        --duration "$bound" --progress 10 >"$OUT/$label.json" 2> >(tee -a "$OUT/$label.err" >&2) &
    SOAK_PID=$!
    wait "$SOAK_PID"
    rc=$?
    SOAK_PID=""
    if ! kill -0 "$GW_PID" 2>/dev/null; then
        wait "$GW_PID"
        rc=$?
        if grep -q 'SIG[A-Z]*: draining' "$OUT/gateway.log"; then
            # The gateway exits 0 only after a drain, which only SIGTERM/SIGINT start. This script
            # sends neither before the end: another process did (on a shared machine, a stale PID
            # of someone else's test that the kernel gave to this gateway: pid_max is often 32768).
            fail "$label: the gateway was stopped by a signal from outside this script (exit status $rc; its log: $(grep -m1 'SIG[A-Z]*: draining' "$OUT/gateway.log" | cut -c1-200)); run the soak again"
        else
            fail "$label: the gateway died (exit status $rc) during the phase; see $OUT/gateway.log and $SAN"
        fi
        GW_PID=""
        return 1
    fi
    if ! kill -0 "$DEMO_PID" 2>/dev/null; then
        wait "$DEMO_PID"
        fail "$label: the demo agent died (exit status $?) during the phase; see $OUT/demo.log"
        DEMO_PID=""
    fi
    [ "$rc" = 0 ] || fail "$label: agw-soak exit $rc: $(head -c 600 "$OUT/$label.json")"
    return 0
}

# ---- the run -------------------------------------------------------------------------------------------
T_START=$(date +%s)
log "warm-up: $WARMUP runs"
if [ "$WARMUP" -gt 0 ]; then
    play warmup "$WARMUP" $((SEED + 1000)) || true
fi
[ -n "$GW_PID" ] && settle warmup
[ -n "$GW_PID" ] && sample baseline

per=$((RUNS / PHASES))
for i in $(seq "$PHASES"); do
    [ -n "$GW_PID" ] || break
    n=$per
    [ "$i" = "$PHASES" ] && n=$((RUNS - per * (PHASES - 1)))
    log "phase $i/$PHASES: $n runs, concurrency $CONC"
    play "phase$i" "$n" $((SEED + i)) || break
    settle "phase$i"
    sample "phase$i" "$OUT/phase$i.json"
done

if [ -n "$GW_PID" ] && [ "$POOL_WAIT" -gt 0 ]; then
    log "waiting up to $POOL_WAIT s for idle pooled upstream connections to time out (keep-alive 60 s)"
    t0=$(date +%s)
    while [ $(($(date +%s) - t0)) -lt "$POOL_WAIT" ]; do
        up=$(fd_census | python3 -c 'import json,sys; print(json.load(sys.stdin)["upstream"])')
        [ "$up" = 0 ] && break
        sleep 1
    done
    log "pooled upstream connections: $up after $(($(date +%s) - t0)) s"
    sample pool-expired
fi

# ---- stop the gateway: SIGTERM, bounded wait, exit status ---------------------------------------------------
GW_EXIT=""
if [ -n "$GW_PID" ]; then
    kill -TERM "$GW_PID"
    for _ in $(seq 600); do kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$GW_PID" 2>/dev/null; then
        fail "the gateway did not exit within 60 s of SIGTERM"
        kill -KILL "$GW_PID"
    fi
    wait "$GW_PID"
    GW_EXIT=$?
    GW_PID=""
    [ "$GW_EXIT" = 0 ] || fail "the gateway exited with status $GW_EXIT after SIGTERM"
fi
stop "$DEMO_PID" 10
DEMO_PID=""
T_END=$(date +%s)
ACCESS_LINES=$(wc -l <"$T/access.log" 2>/dev/null || echo 0)

export ASAN_QUARANTINE_MB WARMUP
# ---- verdicts and summary --------------------------------------------------------------------------------------
python3 - "$PHASES_JSON" "$OUT" "$SAN" "$RUNS" "$PHASES" "$CONC" "${GW_EXIT:-died}" "$RSS_TOLERANCE_KIB" \
    "$((T_END - T_START))" "$ACCESS_LINES" "$POOL_WAIT" "$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo '?')" \
    "$(date -u +%Y-%m-%d)" "$GW_SAN" <<'PY' >"$T/verdict" 2>&1
import glob, json, os, re, sys
(phases_json, out, san, runs, nphases, conc, gw_exit, tol, wall, access_lines, pool_wait, commit, day,
 gw_san) = sys.argv[1:]
tol = int(tol)
recs = [json.loads(l) for l in open(phases_json) if l.strip()]
by = {r["label"]: r for r in recs}
fails = []
lines = []
P = lambda s="": lines.append(s)

# sanitizer reports: every file, every process
reports = {}
pat = re.compile(r"ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer|WARNING: AddressSanitizer|SUMMARY: UndefinedBehaviorSanitizer")
for f in sorted(glob.glob(os.path.join(san, "*"))):
    txt = open(f, errors="replace").read()
    n = len(pat.findall(txt)) or (1 if txt.strip() else 0)
    if n:
        reports[os.path.basename(f)] = n
for f in ("gateway.log", "demo.log"):
    p = os.path.join(out, f)
    if os.path.exists(p):
        n = len(pat.findall(open(p, errors="replace").read()))
        if n:
            reports[f] = n
gw_reports = sum(n for f, n in reports.items() if f.startswith("gateway"))
other_reports = sum(n for f, n in reports.items() if not f.startswith("gateway"))

# the runs
phases = [r for r in recs if r["label"].startswith("phase")]
kinds = {}
statuses = {}
mism, incomplete, elapsed, nruns, stray = 0, 0, 0.0, 0, 0
reasons = {}
for r in phases:
    s = r.get("soak") or {}
    if not s:
        fails.append(f"{r['label']}: no result from agw-soak")
        continue
    nruns += s["runs"]; mism += s["mismatches"]; incomplete += s["incomplete"]
    elapsed += s["elapsed_s"]; stray += s.get("stray_bytes", 0)
    for k, v in s["kinds"].items():
        a = kinds.setdefault(k, {"runs": 0, "ok": 0, "mismatch": 0})
        for f in a:
            a[f] += v[f]
    for k, v in s["statuses"].items():
        statuses[k] = statuses.get(k, 0) + v
    for k, v in s["mismatch_reasons"].items():
        reasons[k] = reasons.get(k, 0) + v
if nruns != int(runs):
    fails.append(f"{nruns} runs played of {runs}")
if mism:
    fails.append(f"{mism} runs did not have the expected outcome")
if stray:
    fails.append(f"{stray} bytes arrived on connections with no request outstanding")

# gateway counters over the phases (baseline -> last phase)
base = by.get("baseline")
last = phases[-1] if phases else None
def mdelta(name):
    if not base or not last:
        return None
    return last["metrics"].get(name, 0) - base["metrics"].get(name, 0)
checks = []
if base and last:
    want_cancel = sum((r.get("soak") or {}).get("kinds", {}).get("cancel", {}).get("ok", 0) for r in phases)
    want_cancel += sum((r.get("soak") or {}).get("kinds", {}).get("cut", {}).get("variants", {}).get("detach_cancel", {}).get("runs", 0) for r in phases)
    want_dec = sum((r.get("soak") or {}).get("kinds", {}).get("hitl", {}).get("ok", 0) for r in phases)
    checks.append(("agw_runs_cancelled_total (delta)", mdelta("agw_runs_cancelled_total"), want_cancel))
    checks.append(("agw_decisions_forwarded_total (delta)", mdelta("agw_decisions_forwarded_total"), want_dec))
    checks.append(("agw_active_runs (idle, after)", last["metrics"].get("agw_active_runs"), 0))
    checks.append(("agw_open_relays (idle, after)", last["metrics"].get("agw_open_relays"), 0))
    # requests by status: the gateway's counters against what the client saw (all agents)
    def by_status(rec):
        d = {}
        for k, v in rec["metrics"].items():
            # answers of the handler, and refusals of the HTTP parser before routing (413 …)
            m = re.match(r'agw_requests_total\{agent="[^"]*",status="(\d+)"\}', k) or \
                re.match(r'agw_requests_refused_total\{status="(\d+)"\}', k)
            if m:
                d[m.group(1)] = d.get(m.group(1), 0) + v
        return d
    b0, b1 = by_status(base), by_status(last)
    # /metrics itself is counted as a 200 by the gateway: one per sample and per settle poll, so
    # 200 is left out; every other status must match exactly
    for st in sorted(set(b1) | set(statuses)):
        if st == "200":
            continue
        checks.append((f"requests answered {st}", b1.get(st, 0) - b0.get(st, 0), statuses.get(st, 0)))
# the agent's counters (GET /_demo/stats) over the phases: what reached the backend
variants = {}
for r in phases:
    for k, v in ((r.get("soak") or {}).get("kinds") or {}).items():
        for vn, vv in v["variants"].items():
            variants[f"{k}/{vn}"] = variants.get(f"{k}/{vn}", 0) + vv["runs"]
V = lambda name: variants.get(name, 0)
checks_demo = []
warns = []
if base and last and variants:
    dd = lambda f: last["demo"].get(f, 0) - base["demo"].get(f, 0)
    kind_runs = lambda k: sum(v for n, v in variants.items() if n.startswith(k + "/"))
    # one upstream request per run that reaches a backend, two for a decision; none for 'down' and
    # the invalid requests (a single backend per agent: no retry on another one)
    want_req = (kind_runs("normal") + kind_runs("cancel") + kind_runs("cut") + 2 * kind_runs("hitl")
                + kind_runs("upstream") - V("upstream/down"))
    checks_demo = [
        ("agent: requests received (delta)", dd("requests"), want_req),
        ("agent: decisions applied (delta)", dd("decisions"), kind_runs("hitl")),
        ("agent: runs dropped by drop_after (delta)", dd("dropped"), V("upstream/drop3") + V("upstream/drop0")),
        ("agent: streams still open when idle", last["demo"].get("active_streams"), 0),
        ("agent: runs still waiting for a decision when idle", last["demo"].get("waiting"), 0),
    ]
    for name, got, want in checks_demo:
        if got != want:
            fails.append(f"{name}: {got}, expected {want}")
    # runs whose upstream connection the gateway closed: every cancel, every cut of a stalled or
    # slow stream, every first-byte timeout, every detached run cancelled; a cut of the fast stream
    # may come after the agent has handed its whole stream to the kernel (it then counts as
    # completed); a detached paced run is read to its end
    lo = (kind_runs("cancel") + V("cut/stall") + V("cut/slow") + V("upstream/first_byte_timeout")
          + V("cut/detach_cancel"))
    hi = lo + V("cut/fast")
    cc = dd("client_closed")
    checks.append(("agent: runs whose client (the gateway) went away", cc, f"{lo}..{hi}"))
    if not lo <= cc <= hi:
        fails.append(f"agent: runs whose client (the gateway) went away: {cc}, expected {lo}..{hi}: the gateway did not close the upstream of every cancelled or cut run")

for i, (name, got, want) in enumerate(checks):
    if isinstance(want, str):
        continue
    if got is None or int(got) != int(want):
        # the first four are about runs left behind: failures; the per-status request counters
        # only say whether /metrics counts every answer: warnings
        (fails if i < 4 else warns).append(f"{name}: gateway says {got}, expected {want}")

# descriptors and memory
fd_lines = []
if base and last:
    fb, fl = base["fds"], last["fds"]
    if fl["without_upstream"] != fb["without_upstream"]:
        fails.append(f"descriptors other than pooled upstream connections: {fb['without_upstream']} at baseline, {fl['without_upstream']} after the soak")
    if fl["client"]:
        fails.append(f"{fl['client']} client connections still open in the gateway once idle ({fl['tcp_states']})")
    pe = by.get("pool-expired")
    if pe:
        if pe["fds"]["upstream"] != 0:
            fails.append(f"{pe['fds']['upstream']} pooled upstream connections still open after the keep-alive wait")
        if pe["fds"]["total"] != fb["without_upstream"]:
            fails.append(f"descriptors after the pool wait: {pe['fds']['total']}, baseline without pooled upstream connections {fb['without_upstream']}")
    first = phases[0]
    growth = last["rss_kib"] - first["rss_kib"]
    if len(phases) > 1 and growth > tol:
        fails.append(f"RSS grew by {growth} KiB from the end of phase 1 to the end of phase {len(phases)} (tolerance {tol} KiB)")
    if last["rss_kib"] - base["rss_kib"] > tol:
        # without a real warm-up the baseline is taken before the ASan quarantine and the
        # allocator's caches fill: then it says little
        (fails if int(os.environ.get("WARMUP", "0")) >= 1000 else warns).append(
            f"RSS after the soak is {last['rss_kib'] - base['rss_kib']} KiB above the baseline (tolerance {tol} KiB)"
            + ("" if int(os.environ.get("WARMUP", "0")) >= 1000 else "; with --warmup under 1000 this is only a warning"))

if gw_exit != "0":
    fails.append(f"gateway exit status after SIGTERM: {gw_exit}")
if gw_reports:
    fails.append(f"{gw_reports} sanitizer report(s) from the gateway")
if other_reports:
    fails.append(f"{other_reports} sanitizer report(s) from the demo agent or the client")

# ---- print
P(f"Soak: {runs} runs in {nphases} phases, concurrency {conc}; commit {commit}, {day}; gateway built with {gw_san or 'NO sanitizers'}, ASan quarantine {os.environ.get('ASAN_QUARANTINE_MB')} MiB")
P()
P("| kind | runs | ok | mismatches |")
P("|---|---|---|---|")
for k in ("normal", "cancel", "cut", "hitl", "upstream", "invalid"):
    a = kinds.get(k, {"runs": 0, "ok": 0, "mismatch": 0})
    P(f"| {k} | {a['runs']:,} | {a['ok']:,} | {a['mismatch']:,} |")
tot = {f: sum(a[f] for a in kinds.values()) for f in ("runs", "ok", "mismatch")}
P(f"| **all** | {tot['runs']:,} | {tot['ok']:,} | {tot['mismatch']:,} |")
P()
if reasons:
    P("Mismatches by reason:")
    for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]):
        P(f"- {v:,} × {k}")
    P()
P("- variants: " + ", ".join(f"{k} {v:,}" for k, v in variants.items() if v))
P(f"- throughput: {nruns:,} runs in {elapsed:.1f} s of load = {nruns / elapsed if elapsed else 0:,.0f} runs/s (wall time of the whole script {wall} s)")
P("- HTTP statuses seen by the client: " + ", ".join(f"{k}: {v:,}" for k, v in sorted(statuses.items())))
P(f"- access log lines written by the gateway: {int(access_lines):,}")
if checks:
    P("- gateway counters: " + "; ".join(f"{n} {int(g) if g is not None else None} (expected {w})" for n, g, w in checks[:4]))
    P("- agent counters: " + "; ".join(f"{n} {g} (expected {w})" for n, g, w in checks_demo + [c for c in checks if isinstance(c[2], str)]))
P()
P("| sample | RSS KiB | fds total | listen | pooled upstream | client | other sockets | other |")
P("|---|---|---|---|---|---|---|---|")
for r in recs:
    f = r["fds"]
    P(f"| {r['label']} | {r['rss_kib']:,} | {f['total']} | {f['listen']} | {f['upstream']} | {f['client']} | {f['other_sockets']} | {f['other']} |")
if base and last:
    P()
    P(f"- RSS: baseline {base['rss_kib']:,} KiB, after the soak {last['rss_kib']:,} KiB ({last['rss_kib'] - base['rss_kib']:+,} KiB), "
      f"end of phase 1 → end of the last phase {last['rss_kib'] - phases[0]['rss_kib']:+,} KiB (tolerance {tol:,}); peak (VmHWM) {last['hwm_kib']:,} KiB")
    P(f"- fds: baseline {base['fds']['total']} ({base['fds']['upstream']} pooled upstream), after the soak {last['fds']['total']} "
      f"({last['fds']['upstream']} pooled upstream); without pooled upstream connections {base['fds']['without_upstream']} → {last['fds']['without_upstream']}"
      + (f"; after the keep-alive wait {by['pool-expired']['fds']['total']}" if "pool-expired" in by else ""))
    P(f"- agent connections open at the end (demo /_demo/stats, one is the stats request): {last['demo'].get('connections')}")
P(f"- gateway exit status after SIGTERM: {gw_exit}")
P(f"- sanitizer reports: {gw_reports} from the gateway, {other_reports} from the agent/client" + (": " + ", ".join(f"{k} ({v})" for k, v in reports.items()) if reports else ""))
P()
if warns:
    P("Warnings:")
    for w in warns:
        P(f"- {w}")
    P()
if fails:
    P("RESULT: FAIL")
    for f in fails:
        P(f"- {f}")
else:
    P("RESULT: PASS")
print("\n".join(lines))
sys.exit(1 if fails else 0)
PY
VRC=$?
tee "$SUMMARY" <"$T/verdict"
for f in "${FAILURES[@]+"${FAILURES[@]}"}"; do echo "- $f" | tee -a "$SUMMARY"; done
if [ -n "$(ls -A "$SAN" 2>/dev/null)" ]; then
    echo "sanitizer logs: $SAN" | tee -a "$SUMMARY"
    for f in "$SAN"/*; do echo "== $f"; head -n 40 "$f"; done >&2
fi
echo "soak: summary in $SUMMARY" >&2
[ "$VRC" = 0 ] && [ ${#FAILURES[@]} = 0 ] && exit 0
# A failed soak keeps the gateway's access log (one line per request: the run, its status, how it
# ended), so that a mismatch reported by the client can be looked up on the gateway's side.
gzip -c "$T/access.log" >"$OUT/access.log.gz" 2>/dev/null && echo "soak: access log in $OUT/access.log.gz" >&2
[ "$VRC" = 0 ] && echo "RESULT: FAIL (see above)" | tee -a "$SUMMARY"
exit 1
