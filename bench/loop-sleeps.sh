#!/usr/bin/env bash
# Where the event loop sleeps under a recording load: every time the kernel takes the loop's thread off
# its CPU, with the reason (the kernel function it slept in, or "R": preempted while runnable), how long
# until it ran again (for a sleep: the idle time and the wait for the CPU once woken), and who got the
# CPU. The short and the throughput load at once, as the stall pass
# of run.sh, with thread history on and then off. A loop that waited on the disk would show D-state
# sleeps (io_schedule); one that waited on a lock held by the store's writer, futex waits. Each sleep
# of 2 ms or more is listed with its time (the monotonic clock's, as the loop probe's records).
# usage: BUILD=_build bash bench/loop-sleeps.sh [SECONDS]   (default 5). Needs perf (linux-perf), python3,
# and the permission to trace the scheduler (root, or kernel.perf_event_paranoid <= -1).
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$SRC/_build}
SECS=${1:-5}
T=$(mktemp -d "${TMPDIR:-/tmp}/agw-sleeps.XXXXXX")
PIDS=""
trap 'for p in $PIDS; do kill "$p" 2>/dev/null; done; sleep 0.5; rm -rf "$T"' EXIT
command -v perf >/dev/null || { echo "bench/loop-sleeps.sh: perf is missing (Debian: linux-perf)" >&2; exit 1; }
TOKEN=bench-token-0123456789
SHA=$(printf %s "$TOKEN" | "$BUILD/src/agui-gateway" hash-token)
# With 2+ CPUs the gateway runs alone on CPU 1 (the peers on CPU 0) and only CPU 1 is traced.
PEERS=() GWCPU=() TRACE=(-a)
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
    PEERS=(taskset -c 0) GWCPU=(taskset -c 1) TRACE=(-C 1)
fi

"${PEERS[@]}" "$BUILD/src/agui-demo-agent" --listen 127.0.0.1:0 --port-file "$T/demo.port" --log-level warn \
    >"$T/demo.log" 2>&1 &
PIDS="$PIDS $!"
for _ in $(seq 100); do [ -s "$T/demo.port" ] && break; sleep 0.1; done
D=http://127.0.0.1:$(head -n1 "$T/demo.port")/agent

one() { # HISTORY(true|false)
    local gw port l1 l2
    cat >"$T/gw.json" <<JSON
{ "listen": [ { "address": "127.0.0.1", "port": 0 } ], "workers": 1,
  "auth": { "keys": [ { "id": "bench", "sha256": "$SHA", "agents": ["*"] } ] },
  "log": { "level": "warn", "access": "off" },
  "history": { "enabled": $1 }, "store": { "kind": "embedded", "path": "$T/store-$1" },
  "agents": { "tp": { "upstreams": ["$D?events=2000&size=200&ids=run&write_each=1"] },
              "short": { "upstreams": ["$D?events=10&size=100&ids=run&write_each=1"] } } }
JSON
    rm -f "$T/gw.port"
    "${GWCPU[@]}" "$BUILD/src/agui-gateway" -c "$T/gw.json" --port-file "$T/gw.port" >"$T/gw.log" 2>&1 &
    gw=$!
    PIDS="$PIDS $gw"
    for _ in $(seq 100); do [ -s "$T/gw.port" ] && break; sleep 0.1; done
    port=$(head -n1 "$T/gw.port")
    # traced from before the load starts: its first second is where stalls were seen
    perf record -q -e sched:sched_switch -g "${TRACE[@]}" -o "$T/perf.data" -- sleep "$SECS" >/dev/null 2>&1 &
    pr=$!
    sleep 0.5
    "${PEERS[@]}" "$BUILD/bench/agw-load" --url "http://127.0.0.1:$port/v1/ag-ui/agents/tp/runs" \
        --header "Authorization: Bearer $TOKEN" --concurrency 50 --seconds $((SECS - 1)) >/dev/null &
    l1=$!
    "${PEERS[@]}" "$BUILD/bench/agw-load" --url "http://127.0.0.1:$port/v1/ag-ui/agents/short/runs" \
        --header "Authorization: Bearer $TOKEN" --concurrency 100 --seconds $((SECS - 1)) >/dev/null &
    l2=$!
    wait "$pr"
    wait "$l1" "$l2"
    kill "$gw"
    wait "$gw"
    perf script -i "$T/perf.data" -F tid,time,event,trace,ip,sym 2>/dev/null >"$T/sched.txt"
    echo "history $([ "$1" = true ] && echo on || echo off): the loop thread's times off its CPU over $SECS s of load"
    python3 - "$T/sched.txt" "$gw" <<'PY'
import collections, re, sys
path, loop = sys.argv[1], sys.argv[2]
head = re.compile(r"\s*\d+\s+([\d.]+): sched:sched_switch: prev_comm=.*? prev_pid=(\d+) prev_prio=\d+ "
                  r"prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)")
# frames that say "it is switching", not why
plumbing = {"__schedule", "schedule", "schedule_timeout", "schedule_hrtimeout_range",
            "schedule_hrtimeout_range_clock", "exit_to_user_mode_loop", "preempt_schedule_irq",
            "preempt_schedule_common", "__cond_resched", "irqentry_exit", "raw_irqentry_exit_cond_resched",
            "do_syscall_64", "entry_SYSCALL_64_after_hwframe", "asm_sysvec_apic_timer_interrupt",
            "asm_sysvec_reschedule_ipi"}
recs, cur = [], None
for line in open(path, errors="replace"):
    if line.startswith("\t"):
        if cur is not None and line.split():
            f = line.split()
            cur["stack"].append(f[1] if len(f) > 1 else f[0])
        continue
    m = head.match(line)
    cur = None
    if m:
        cur = {"t": float(m.group(1)), "prev": m.group(2), "state": m.group(3), "to": m.group(4),
               "next": m.group(5), "stack": []}
        recs.append(cur)
count, took, went, pending = collections.Counter(), collections.defaultdict(list), \
    collections.defaultdict(collections.Counter), None
longs = []
for r in recs:
    if r["prev"] == loop:
        why = next((f for f in r["stack"] if f not in plumbing), "?")
        state = r["state"][0] if r["state"][0] in "SD" else "R"
        kind = f"{state} {why}"
        count[kind] += 1
        went[kind][r["to"]] += 1
        pending = (r["t"], kind, r["stack"])
    elif r["next"] == loop and pending:
        ms = (r["t"] - pending[0]) * 1e3
        took[pending[1]].append(ms)
        if ms >= 2 and not pending[1].startswith("R") and len(longs) < 20:
            longs.append("    %.3f ms asleep (and waiting for the CPU once woken) from %.6f s: %s"
                         % (ms, pending[0], pending[1]))
        pending = None
print("  %7s  %-34s %9s %9s  %s" % ("times", "state, where", "p99 ms", "max ms", "the CPU went to"))
for kind, n in count.most_common():
    d = sorted(took[kind]) or [0.0]
    print("  %7d  %-34s %9.3f %9.3f  %s" % (n, kind, d[int(len(d) * 0.99)], d[-1],
          ", ".join(f"{k} {v}" for k, v in went[kind].most_common(3))))
disk = sum(n for k, n in count.items() if k.startswith("D "))
locks = [k for k in count if k.startswith("S ") and "futex" in k]
print("  sleeps in D state (disk): %d; futex waits: %d (longest %.3f ms); S = asleep, R = preempted"
      % (disk, sum(count[k] for k in locks), max([max(took[k] or [0]) for k in locks] or [0])))
print("  sleeps of 2 ms or more (at most 20):" + ("\n" + "\n".join(longs) if longs else " none"))
PY
}

one true
one false
