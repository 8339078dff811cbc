#!/usr/bin/env bash
# The loop probe (AGW_LOOP_PROBE_MS, the benchmarks' stall measure) tells a loop that waited for a CPU
# from a loop that did not run for any other reason: agw_event_loop_lag_seconds_max counts both,
# agw_event_loop_self_lag_seconds_max only the second (what a loop blocked on a disk would show), and
# agw_event_loop_busy_lag_seconds_max the part of that the loop spent running (its own callbacks).
#   1. the gateway's CPU taken by a busy real-time process for 0.3 s: the loop is late by its wait in
#      the run queue, and its own part stays well under that lateness;
#   2. the gateway stopped (SIGSTOP) for 0.4 s: not a wait for a CPU, both figures see it; the loop
#      did not run, so its busy part stays small;
#   3. a request body of 1,000,000 messages (52 MB, under a raised limits.max_body_bytes), validated in
#      one callback: the loop runs for a long time, and the busy part sees it;
#   4. with AGW_LOOP_PROBE_REPORT_MS, the gateway logs each lateness of at least that when it stops,
#      with its parts (bench/run.sh --stall reads them): the stop's and the long callback's are there.
. "$AGW_SRCDIR/tests/integration/lib.sh"

if ! command -v taskset >/dev/null 2>&1 || ! command -v chrt >/dev/null 2>&1; then
    echo "SKIP: taskset or chrt is missing (util-linux)"
    exit 77
fi
cat >"$T/gw.json" <<JSON
{ "listen": [ { "address": "127.0.0.1", "port": 0 } ], "history": { "enabled": false }, "auth": { "mode": "none" },
  "limits": { "max_body_bytes": 67108864 },
  "agents": { "a": { "upstreams": ["http://127.0.0.1:9/agent"] } } }
JSON
AGW_LOOP_PROBE_MS=1 AGW_LOOP_PROBE_REPORT_MS=100 start_gateway "$T/gw.json" || exit 1
ms() { awk -v s="$1" 'BEGIN { printf "%d", s * 1000 }'; }

sleep 0.5
check_contains "the probe's lateness is exposed" "." "$(metric agw_event_loop_lag_seconds_max)"
check_contains "and its part not spent waiting for a CPU" "." "$(metric agw_event_loop_self_lag_seconds_max)"
check_contains "and of that, its part spent running" "." "$(metric agw_event_loop_busy_lag_seconds_max)"

# 1. Every thread of the gateway on the CPU this shell may use first; a busy process of real-time
#    priority there for 0.3 s (its timeout one step higher, so that it ends it): the loop is runnable
#    and waits for that CPU the whole time. Without the right to real-time priorities, the check is
#    skipped (a weaker stand-in, SCHED_IDLE behind a busy process, depends on the machine's load).
cpu=$(taskset -pc $$ | sed 's/.*: //; s/[,-].*//')
# One trial: lag and own (ms) of the loop behind the busy process. The figures are the gateway's
# maxima since it started.
rt_trial() {
    for t in /proc/"$GW_PID"/task/*; do
        taskset -pc "$cpu" "${t##*/}" >/dev/null
    done
    base_own=$(ms "$(metric agw_event_loop_self_lag_seconds_max)")
    taskset -c "$cpu" chrt -f 2 timeout 0.3 chrt -f 1 sh -c 'while :; do :; done'
    lag=$(ms "$(metric agw_event_loop_lag_seconds_max)")
    own=$(ms "$(metric agw_event_loop_self_lag_seconds_max)")
    echo "its CPU taken for 0.3 s: lateness ${lag} ms, less the waits for a CPU ${own} ms (before: ${base_own} ms)"
}
if chrt -f 1 true 2>/dev/null; then
    rt_trial
    if [ "$lag" -lt 250 ] || [ "$own" -ge 100 ]; then
        # On a virtual machine whose host takes its CPU away, the guest sees the loop neither run nor
        # wait meanwhile, and counts that time as its own (this kernel does not account stolen
        # time; seen once in CI, 284 of 309 ms). A second trial on a fresh gateway: a loop whose
        # waits for a CPU were counted as its own would fail both.
        echo "a second trial, on a fresh gateway"
        stop_pid "$GW_PID" >/dev/null
        AGW_LOOP_PROBE_MS=1 AGW_LOOP_PROBE_REPORT_MS=100 start_gateway "$T/gw.json" || exit 1
        sleep 0.5
        rt_trial
    fi
    CHECKS=$((CHECKS + 1))
    if [ "$lag" -ge 250 ] && [ "$own" -lt 100 ]; then
        ok "waiting for a CPU makes the loop late (${lag} ms) but is not its own lateness (${own} ms)"
    else
        fail "a loop behind a real-time busy process for 0.3 s: expected a lateness of 250 ms or more and an own part under 100 ms; got ${lag} and ${own} ms"
    fi
else
    echo "skip: no real-time priority here (chrt -f): the wait-for-a-CPU check is not run"
fi

# 2. Stopped: off every run queue, so all of it is the loop's own lateness.
kill -STOP "$GW_PID"
sleep 0.4
kill -CONT "$GW_PID"
sleep 0.1
lag=$(ms "$(metric agw_event_loop_lag_seconds_max)")
own=$(ms "$(metric agw_event_loop_self_lag_seconds_max)")
busy=$(ms "$(metric agw_event_loop_busy_lag_seconds_max)")
CHECKS=$((CHECKS + 1))
if [ "$lag" -ge 350 ] && [ "$own" -ge 350 ]; then
    ok "a loop that could not run for 0.4 s: late ${lag} ms, all of it its own (${own} ms)"
else
    fail "a gateway stopped for 0.4 s: expected both figures at 350 ms or more, got ${lag} and ${own} ms"
fi
CHECKS=$((CHECKS + 1))
if [ "$busy" -lt 100 ]; then
    ok "it did not run meanwhile: its busy part stays small (${busy} ms)"
else
    fail "a gateway stopped for 0.4 s: expected a busy part under 100 ms, got ${busy} ms"
fi

# 3. A loop that runs its own work for long: one request of 1,000,000 messages, validated at once
#    (600,000 made 100 to 120 ms of it, at the bound, once the gate served the requests itself).
python3 -c '
import json
m = [{"id": "m%d" % i, "role": "user", "content": "hi"} for i in range(1000000)]
print(json.dumps({"threadId": "t", "runId": "r", "messages": m, "tools": [], "context": [],
                  "state": {}, "forwardedProps": {}}))' >"$T/big.json"
code=$(curl -sS -m 60 -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary @"$T/big.json" "http://127.0.0.1:$GW_PORT/v1/ag-ui/agents/a/runs")
check_eq "the large request is validated and routed (its upstream refuses: 502)" 502 "$code"
own=$(ms "$(metric agw_event_loop_self_lag_seconds_max)")
busy=$(ms "$(metric agw_event_loop_busy_lag_seconds_max)")
echo "a 52 MB request validated: own part ${own} ms, of which running ${busy} ms"
CHECKS=$((CHECKS + 1))
if [ "$busy" -ge 100 ] && [ "$busy" -le "$own" ]; then
    ok "a loop busy with one callback: its busy part sees it (${busy} ms of ${own} ms)"
else
    fail "a request of 1,000,000 messages: expected a busy part of 100 ms or more, within the own part; got ${busy} of ${own} ms"
fi
stop_pid "$GW_PID" >/dev/null
check_eq "the gateway stops cleanly" 0 "$STOP_STATUS"

# 4. The latenesses of 100 ms or more, logged at the stop by each loop (the 52 MB request ran on one of
#    them): "worker N: loop probe: late L ms at T s; own O ms, running R ms".
lines=$(grep -E 'worker [0-9]+: loop probe: late' "$GW_LOG")
echo "$lines"
stopped=$(echo "$lines" | awk '{ for (i = 1; i <= NF; i++) { if ($i == "late") l = $(i + 1); if ($i == "own") o = $(i + 1); if ($i == "running") r = $(i + 1) }
    if (l >= 350 && o >= 350 && r < 100) n++ } END { print n + 0 }')
ran=$(echo "$lines" | awk '{ for (i = 1; i <= NF; i++) { if ($i == "own") o = $(i + 1); if ($i == "running") r = $(i + 1) }
    if (r >= 100 && r <= o) n++ } END { print n + 0 }')
CHECKS=$((CHECKS + 1))
if [ "$stopped" -ge 1 ] && [ "$ran" -ge 1 ]; then
    ok "the latenesses are logged at the stop with their parts: the stop's (own, not running) and the long callback's (running)"
else
    fail "expected a logged lateness of 350 ms or more, own, not running (got $stopped) and one running 100 ms or more (got $ran)"
fi
finish
