#!/usr/bin/env bash
# Every core: "workers": 2 runs two event loops over SO_REUSEPORT listeners, and a run lives on the
# loop that accepted it. Runs land on both loops; a decision or a cancel that arrives on one loop
# reaches a run held by the other; /metrics counts the runs of every loop; SIGTERM drains both
# loops and the process exits 0. The access log's "worker" field says which loop took a request:
# the checks below read it to know that both loops and the crossings were exercised.
. "$AGW_SRCDIR/tests/integration/lib.sh"

start_demo demo || exit 1
D=http://127.0.0.1:$DEMO_PORT
h() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [ { "id": "web", "sha256": "$(h web-token)", "agents": ["*"] } ] },
  "workers": 2,
  "agents": {
    "hitl":  { "upstreams": ["$D/agent?wait_decision=1"] },
    "stall": { "upstreams": ["$D/agent?stall=1"] }
  },
  "timeouts": { "heartbeat": "10s", "drain": "1s" },
  "log": { "access": "$T/access.log" }
}
JSON
start_gateway "$T/gw.json" --workers 2 || exit 1
check_contains "two event loops" "2 worker event loops" "$(cat "$GW_LOG")"
U=http://127.0.0.1:$GW_PORT/v1/ag-ui/agents
J='Content-Type: application/json'
AUTH='Authorization: Bearer web-token'
# stream NAME AGENT BODY: a run in the background (its own connection), its stream in $T/NAME.s
stream() {
    curl -sS -N -m 30 -o "$T/$1.s" -H "$J" -H "$AUTH" -d "$3" "$U/$2/runs" 2>"$T/$1.err" &
    eval "$1_PID=$!"
}
wait_metric() { # NAME VALUE: up to 5 s; prints the last value
    local v
    for _ in $(seq 50); do
        v=$(metric "$1")
        [ "$v" = "$2" ] && break
        sleep 0.1
    done
    echo "$v"
}
# crossings KIND PREFIX: how many requests of KIND ("decision": a run's body to /runs; "cancel")
# were taken by another loop than the run they were for, and how many were for such runs in all.
crossings() {
    python3 - "$T/access.log" "$1" "$2" <<'PY'
import json, sys
path, kind, prefix = sys.argv[1:4]
lines = [json.loads(l) for l in open(path) if l.strip()]
run_worker, req_worker = {}, {}
for l in lines:
    run = l.get("run", "")
    if not run.startswith(prefix):
        continue
    if kind == "cancel" and l["path"].endswith("/cancel"):
        req_worker[run] = l["worker"]
    elif kind == "decision" and l.get("outcome") == "decision_forwarded":
        req_worker[run] = l["worker"]
    elif not l["path"].endswith("/cancel") and l.get("outcome") != "decision_forwarded":
        run_worker[run] = l["worker"]
both = [r for r in req_worker if r in run_worker]
print(sum(1 for r in both if req_worker[r] != run_worker[r]), len(both))
PY
}

N=8
cross_d=0 cross_c=0 batch=0
# Which loop takes a connection is the kernel's choice (a hash of the addresses): batches of N
# runs until decisions and cancels have both crossed loops (the chance that a batch never crosses
# is 2^-N for each kind).
while [ "$batch" -lt 4 ] && { [ "$cross_d" -eq 0 ] || [ "$cross_c" -eq 0 ]; }; do
    batch=$((batch + 1))
    for i in $(seq $N); do
        stream "d$i" hitl "$(run_body "td$batch-$i" "rd$batch-$i")"
        stream "c$i" hitl "$(run_body "tc$batch-$i" "rc$batch-$i")"
    done
    for i in $(seq $N); do
        wait_grep "$T/d$i.s" TOOL_CALL_END || fail "batch $batch: run d$i did not call its tool"
        wait_grep "$T/c$i.s" TOOL_CALL_END || fail "batch $batch: run c$i did not call its tool"
    done
    check_eq "batch $batch: /metrics counts the runs of both loops" $((2 * N)) "$(wait_metric agw_active_runs $((2 * N)))"
    for i in $(seq $N); do
        http POST "$U/hitl/runs" -H "$J" -H "$AUTH" -d "$(decision_body "td$batch-$i" "rd$batch-$i" "$APPROVE")"
        check_eq "batch $batch: decision $i forwarded" 202 "$STATUS"
        http POST "$U/hitl/runs/rc$batch-$i/cancel" -H "$AUTH"
        check_eq "batch $batch: cancel $i accepted" 202 "$STATUS"
    done
    for i in $(seq $N); do
        wait_done "$(eval echo "\$d${i}_PID")" || fail "batch $batch: decided run d$i did not end"
        wait_done "$(eval echo "\$c${i}_PID")" || fail "batch $batch: cancelled run c$i did not end"
        check_contains "batch $batch: run d$i took its decision" "Successfully deleted 15 temporary files." "$(cat "$T/d$i.s")"
        check_contains "batch $batch: run d$i finished" RUN_FINISHED "$(cat "$T/d$i.s")"
        check_contains "batch $batch: run c$i ended CANCELLED" '"code":"CANCELLED"' "$(cat "$T/c$i.s")"
    done
    check_eq "batch $batch: registry empty" 0 "$(wait_metric agw_active_runs 0)"
    read -r cross_d n_d <<<"$(crossings decision rd)"
    read -r cross_c n_c <<<"$(crossings cancel rc)"
done
echo "decisions: $cross_d of $n_d crossed loops; cancels: $cross_c of $n_c (after $batch batches)"
check_eq "every decision is in the access log with its run" $((batch * N)) "$n_d"
check_eq "every cancel is in the access log with its run" $((batch * N)) "$n_c"
CHECKS=$((CHECKS + 1))
if [ "$cross_d" -gt 0 ]; then ok "decisions reached runs on the other loop ($cross_d)"; else fail "no decision crossed loops"; fi
CHECKS=$((CHECKS + 1))
if [ "$cross_c" -gt 0 ]; then ok "cancels reached runs on the other loop ($cross_c)"; else fail "no cancel crossed loops"; fi
workers=$(python3 -c 'import json,sys; print(" ".join(sorted({str(json.loads(l)["worker"]) for l in open(sys.argv[1]) if l.strip()})))' "$T/access.log")
check_eq "both loops took requests" "0 1" "$workers"
check_eq "runs cancelled counted once each" $((batch * N)) "$(metric agw_runs_cancelled_total)"
check_eq "decisions counted once each" $((batch * N)) "$(metric agw_decisions_forwarded_total)"

# ---- drain: SIGTERM ends the runs of both loops (RUN_ERROR SHUTDOWN after the 1 s drain) -------
for i in $(seq $N); do
    stream "s$i" stall "$(run_body "ts$i" "rs$i")"
done
for i in $(seq $N); do
    wait_grep "$T/s$i.s" RUN_STARTED || fail "stalled run s$i did not start"
done
check_eq "stalled runs registered" "$N" "$(wait_metric agw_active_runs "$N")"
t0=$(date +%s%N)
stop_pid "$GW_PID" >/dev/null
elapsed=$((($(date +%s%N) - t0) / 1000000))
check_eq "SIGTERM: the process exits 0" 0 "$STOP_STATUS"
[ "$STOP_STATUS" = 0 ] || tail -n 60 "$GW_LOG" >&2
CHECKS=$((CHECKS + 1))
if [ "$elapsed" -lt 6000 ]; then ok "drained in $elapsed ms"; else fail "drain took $elapsed ms"; fi
for i in $(seq $N); do
    wait_done "$(eval echo "\$s${i}_PID")" || fail "stalled run s$i did not end"
    check_contains "run s$i ended with SHUTDOWN" '"code":"SHUTDOWN"' "$(cat "$T/s$i.s")"
done
workers=$(grep '"run":"rs' "$T/access.log" | python3 -c 'import json,sys; print(" ".join(sorted({str(json.loads(l)["worker"]) for l in sys.stdin})))')
echo "stalled runs were on loops: $workers"
finish
