#!/usr/bin/env bash
# Human in the loop: the active-run registry, decision-only requests forwarded to the backend of the
# run waiting for them (202) while the original stream goes on, decisions.match "run"/"thread",
# decisions.no_active_run "new_run"/"reject", a decision for a run that just finished, two runs deciding at
# once, the cancel endpoint, on_client_disconnect "detach"; what the backend's answer to a forwarded decision
# makes of it (202 only when the backend took it into the live run; a new stream relayed as a run; an empty
# stream or a refusal as an error) and each decisions.forward mode — and the registry empty after each.
# The rules: doc/protocol.md#decisions.
. "$AGW_SRCDIR/tests/integration/lib.sh"

start_demo demo || exit 1
D=http://127.0.0.1:$DEMO_PORT
W="$D/agent?wait_decision=1" # the demo agent waits for a decision after a frontend tool call

h() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
# gateway_config FILE DECISIONS: one config per decisions setting, the same agents behind each.
gateway_config() {
    cat >"$1" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [ { "id": "web", "sha256": "$(h web-token)", "agents": ["*"] } ] },
  "agents": {
    "hitl":   { "upstreams": ["$W"] },
    "plain":  { "upstreams": ["$D/agent"] },
    "detach": { "upstreams": ["$W"], "on_client_disconnect": "detach" },
    "refuse": { "upstreams": ["$W"], "forward_headers": ["X-Demo-Status"] },
    "drop":   { "upstreams": ["$D/agent?events=100&delay_ms=20&drop_after=40"] },
    "newstream":  { "upstreams": ["$W&decision=stream"] },
    "empty":      { "upstreams": ["$W&decision=empty"] },
    "conflict":   { "upstreams": ["$W&decision=refuse"] },
    "streamfail": { "upstreams": ["$W&decision=stream&fail=1"] },
    "liveonly":   { "upstreams": ["$W&decision=stream&delay_ms=100"], "decisions": { "forward": "live" } },
    "liveok":     { "upstreams": ["$W"], "decisions": { "forward": "live" } },
    "never":      { "upstreams": ["$W&decision=stream"], "decisions": { "forward": "never" } }
  },
  "decisions": $2,
  "store": { "path": "$1.store" },
  "timeouts": { "heartbeat": "10s", "drain": "1s" },
  "log": { "access": "$1.access" }
}
JSON
}
# gateway NAME DECISIONS: starts a gateway; sets <NAME>_PORT and <NAME>_PID.
gateway() {
    gateway_config "$T/$1.json" "$2"
    "$AGW_GATEWAY" "${GW_ARGS[@]}" -c "$T/$1.json" --port-file "$T/$1.port" >"$T/$1.log" 2>&1 &
    eval "$1_PID=$!"
    PIDS="$PIDS $!"
    wait_port_file "$T/$1.port" || { cat "$T/$1.log" >&2; exit 1; }
    eval "$1_PORT=$(head -n1 "$T/$1.port")"
}
gateway A '{}'
gateway R '{ "match": "run", "no_active_run": "reject" }'
gateway TH '{ "match": "thread" }'

J='Content-Type: application/json'
AUTH='Authorization: Bearer web-token'
DENY='"false"'

# stream NAME PORT AGENT BODY: a run in the background, its stream in $T/NAME.s; sets <NAME>_PID.
stream() {
    curl -sS -N -m 30 -o "$T/$1.s" -H "$J" -H "$AUTH" -d "$4" "http://127.0.0.1:$2/v1/ag-ui/agents/$3/runs" \
        2>"$T/$1.err" &
    eval "$1_PID=$!"
}
types() { grep -o '"type":"[A-Z_]*"' "$1" | cut -d'"' -f4 | tr '\n' ' '; }
# wait_metric NAME PORT VALUE: up to 5 s for the metric to reach VALUE; prints its last value.
wait_metric() {
    local v
    for _ in $(seq 50); do
        v=$(metric "$1" "$2")
        [ "$v" = "$3" ] && break
        sleep 0.1
    done
    echo "$v"
}
stat() { curl -s -m 5 "$D/_demo/stats" | grep -o "\"$1\":[0-9]*" | cut -d: -f2; }
registry_empty() { check_eq "registry empty after $1" 0 "$(wait_metric agw_active_runs "$2" 0)"; }
decide() { # decide PORT AGENT BODY [curl args]: POSTs a decision; sets STATUS and BODY
    local port=$1 agent=$2 body=$3
    shift 3
    http POST "http://127.0.0.1:$port/v1/ag-ui/agents/$agent/runs" -H "$J" -H "$AUTH" -d "$body" "$@"
}

# ---- 1. the 202 path: the decision reaches the waiting run, whose own stream shows its effect ----
stream s1 "$A_PORT" hitl "$(run_body t1 r1)"
wait_grep "$T/s1.s" TOOL_CALL_END || fail "the waiting run did not call its tool"
check_eq "a waiting run is registered" 1 "$(wait_metric agw_active_runs "$A_PORT" 1)"
check_not_contains "the run waits (no RUN_FINISHED yet)" RUN_FINISHED "$(cat "$T/s1.s")"
DEC=$(decision_body t1 r1 "$APPROVE")
decide "$A_PORT" hitl "$DEC"
check_eq "decision forwarded: 202" 202 "$STATUS"
check_eq "202 body" '{"status":"decision_forwarded","threadId":"t1","runId":"r1"}' "$BODY"
last_body=$(curl -s "$D/_demo/last-request" | python3 -c 'import json,sys; sys.stdout.write(json.load(sys.stdin)["body"])')
check_eq "the backend got the same body, byte for byte" "$DEC" "$last_body"
wait_done "$s1_PID" || fail "the original stream did not end after the decision"
check_contains "the original stream shows the decision's effect" "Successfully deleted 15 temporary files." "$(cat "$T/s1.s")"
check_eq "one run: RUN_STARTED … RUN_FINISHED" "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED " "$(types "$T/s1.s")"
check_eq "decisions forwarded counted" 1 "$(metric agw_decisions_forwarded_total "$A_PORT")"
registry_empty "a decided run" "$A_PORT"

# ---- 2. a decision for a run that just finished: no_active_run "new_run" starts a new run ----
http POST "http://127.0.0.1:$A_PORT/v1/ag-ui/agents/plain/runs" -H "$J" -H "$AUTH" -d "$(run_body t2 r2)"
check_contains "a run that ends by itself" RUN_FINISHED "$BODY"
registry_empty "a run that finished" "$A_PORT"
decide "$A_PORT" plain "$(decision_body t2 r2 "$APPROVE")"
check_eq "late decision, new_run: a new stream" 200 "$STATUS"
check_contains "the new run answers the decision" "Successfully deleted 15 temporary files." "$BODY"
check_contains "the new run ends" RUN_FINISHED "$BODY"
check_eq "nothing forwarded" 1 "$(metric agw_decisions_forwarded_total "$A_PORT")"
registry_empty "a new run from a decision" "$A_PORT"

# ---- 3. no_active_run "reject", and match "run" is the exact key ----
decide "$R_PORT" hitl "$(decision_body t3 r3 "$APPROVE")"
check_eq "late decision, reject: 400" 400 "$STATUS"
check_eq "the exact message of doc/protocol.md#decisions" \
    '{"error":"bad request: no active run found for thread '"'"'t3'"'"', runId: r3; cannot apply decisions"}' "$BODY"
check_eq "rejections counted" 1 "$(metric agw_decisions_rejected_total "$R_PORT")"
stream s3 "$R_PORT" hitl "$(run_body t3 r3)"
wait_grep "$T/s3.s" TOOL_CALL_END || fail "run t3 did not reach its tool call"
wait_metric agw_active_runs "$R_PORT" 1 >/dev/null
decide "$R_PORT" hitl "$(decision_body t3 r3-other "$APPROVE")"
check_eq "match run: another runId of the thread does not match" 400 "$STATUS"
decide "$R_PORT" hitl "$(decision_body t3 r3 "$APPROVE")"
check_eq "match run: the exact key matches" 202 "$STATUS"
wait_done "$s3_PID" || fail "run t3 did not end"
check_contains "run t3 shows its decision" "Successfully deleted" "$(cat "$T/s3.s")"
registry_empty "reject mode" "$R_PORT"
decide "$R_PORT" hitl "$(decision_body t3 r3 "$APPROVE")"
check_eq "reject: a decision for the run that just finished gets 400" 400 "$STATUS"

# ---- 4. match "thread": the latest active run of the thread, whatever the runId ----
stream s4 "$TH_PORT" hitl "$(run_body t4 r4)"
wait_grep "$T/s4.s" TOOL_CALL_END || fail "run t4 did not reach its tool call"
wait_metric agw_active_runs "$TH_PORT" 1 >/dev/null
decide "$TH_PORT" hitl "$(decision_body t4 r4-next "$DENY")"
check_eq "match thread: 202" 202 "$STATUS"
check_eq "match thread: the 202 names the active run" '{"status":"decision_forwarded","threadId":"t4","runId":"r4"}' "$BODY"
wait_done "$s4_PID" || fail "run t4 did not end"
check_contains "run t4 shows the denial" "Cancelled: I did not delete temporary files." "$(cat "$T/s4.s")"
registry_empty "match thread" "$TH_PORT"

# ---- 5. two concurrent runs on different threads each get their own decision ----
stream s5a "$A_PORT" hitl "$(run_body t5a r5a)"
stream s5b "$A_PORT" hitl "$(run_body t5b r5b)"
wait_grep "$T/s5a.s" TOOL_CALL_END && wait_grep "$T/s5b.s" TOOL_CALL_END || fail "the two runs did not both wait"
check_eq "two runs registered" 2 "$(wait_metric agw_active_runs "$A_PORT" 2)"
decide "$A_PORT" hitl "$(decision_body t5b r5b "$DENY")"
check_eq "decision for t5b" 202 "$STATUS"
decide "$A_PORT" hitl "$(decision_body t5a r5a "$APPROVE")"
check_eq "decision for t5a" 202 "$STATUS"
wait_done "$s5a_PID" && wait_done "$s5b_PID" || fail "the two runs did not end"
check_contains "t5a got its approval" "Successfully deleted" "$(cat "$T/s5a.s")"
check_not_contains "t5a did not get t5b's denial" "Cancelled" "$(cat "$T/s5a.s")"
check_contains "t5b got its denial" "Cancelled: I did not delete" "$(cat "$T/s5b.s")"
check_not_contains "t5b did not get t5a's approval" "Successfully" "$(cat "$T/s5b.s")"
registry_empty "two concurrent runs" "$A_PORT"

# ---- 6. the backend refuses a decision: 502, and the run is untouched ----
stream s6 "$A_PORT" refuse "$(run_body t6 r6)"
wait_grep "$T/s6.s" TOOL_CALL_END || fail "run t6 did not reach its tool call"
wait_metric agw_active_runs "$A_PORT" 1 >/dev/null
decide "$A_PORT" refuse "$(decision_body t6 r6 "$APPROVE")" -H 'X-Demo-Status: 500'
check_eq "a refused decision: 502" 502 "$STATUS"
check_contains "502 names the backend's status" "the backend refused the decision with HTTP 500" "$BODY"
check_eq "the run still waits" 1 "$(metric agw_active_runs "$A_PORT")"

# ---- 7. cancellation: RUN_ERROR CANCELLED to the client, the upstream closed at once ----
closed_before=$(stat client_closed)
C=http://127.0.0.1:$A_PORT/v1/ag-ui/agents
http POST "$C/refuse/runs/r6/cancel" -H "$AUTH"
check_eq "cancel: 202" 202 "$STATUS"
check_eq "cancel body" '{"status":"cancelled","threadId":"t6","runId":"r6"}' "$BODY"
wait_done "$s6_PID" || fail "the cancelled stream did not end"
check_eq "the client's stream ends with RUN_ERROR" RUN_ERROR "$(types "$T/s6.s" | awk '{print $NF}')"
check_contains "with code CANCELLED" '"code":"CANCELLED"' "$(cat "$T/s6.s")"
for _ in $(seq 50); do [ "$(stat client_closed)" -gt "$closed_before" ] && break; sleep 0.1; done
check_eq "the backend saw its connection close" $((closed_before + 1)) "$(stat client_closed)"
http POST "$C/refuse/runs/r6/cancel" -H "$AUTH"
check_eq "cancel an ended run: 404" 404 "$STATUS"
check_contains "404 names the run" "no active run 'r6'" "$BODY"
http POST "$C/hitl/runs/never/cancel" -H "$AUTH"
check_eq "cancel an unknown run: 404" 404 "$STATUS"
check_eq "cancellations counted" 1 "$(metric agw_runs_cancelled_total "$A_PORT")"
registry_empty "a cancelled run" "$A_PORT"

# ---- 8. client disconnect: "cancel" (default) closes the upstream and the entry ----
stream s8 "$A_PORT" hitl "$(run_body t8 r8)"
wait_grep "$T/s8.s" TOOL_CALL_END || fail "run t8 did not reach its tool call"
closed_before=$(stat client_closed)
kill "$s8_PID"
registry_empty "a client disconnect" "$A_PORT"
for _ in $(seq 50); do [ "$(stat client_closed)" -gt "$closed_before" ] && break; sleep 0.1; done
check_eq "disconnect closes the upstream" $((closed_before + 1)) "$(stat client_closed)"

# ---- 8b. the upstream lost mid-stream: RUN_ERROR to the client, the entry removed ----
stream s8b "$A_PORT" drop '{"threadId":"t8b","runId":"r8b","messages":[{"id":"m1","role":"user","content":"Tell me a story"}]}'
check_eq "a streaming run is registered" 1 "$(wait_metric agw_active_runs "$A_PORT" 1)"
wait_done "$s8b_PID" || fail "the dropped run did not end"
check_contains "the client sees UPSTREAM_ERROR" '"code":"UPSTREAM_ERROR"' "$(cat "$T/s8b.s")"
registry_empty "an upstream lost mid-stream" "$A_PORT"

# ---- 9. "detach": the run outlives its client, decisions still reach it, it is recorded ----
stream s9 "$A_PORT" detach "$(run_body t9 r9)"
wait_grep "$T/s9.s" TOOL_CALL_END || fail "run t9 did not reach its tool call"
closed_before=$(stat client_closed)
completed_before=$(stat completed)
kill "$s9_PID"
wait_grep "$T/A.log" "goes on detached" || fail "the gateway did not detach the run"
check_eq "a detached run stays registered" 1 "$(metric agw_active_runs "$A_PORT")"
decide "$A_PORT" detach "$(decision_body t9 r9 "$APPROVE")"
check_eq "a decision reaches a detached run" 202 "$STATUS"
registry_empty "a detached run" "$A_PORT"
for _ in $(seq 50); do [ "$(stat completed)" -gt "$completed_before" ] && break; sleep 0.1; done
check_eq "the detached run ran to its end at the backend" $((completed_before + 1)) "$(stat completed)"
check_eq "its upstream was not closed early" "$closed_before" "$(stat client_closed)"
wait_grep "$T/A.json.access" '"detached":true' || true
check_contains "the access log records the detached run's end" \
    '"thread":"t9","run":"r9","key":"web","status":200' "$(grep '"detached":true' "$T/A.json.access")"
check_contains "… as finished" '"outcome":"RUN_FINISHED"' "$(grep '"detached":true' "$T/A.json.access")"

# ---- 11. the backend answers the decision with a new stream (Mastra, AG-Kit): relayed as a run, not 202 ----
fwd_before=$(metric agw_decisions_forwarded_total "$A_PORT")
stream s11 "$A_PORT" newstream "$(run_body t11 r11)"
wait_grep "$T/s11.s" TOOL_CALL_END || fail "run t11 did not reach its tool call"
wait_metric agw_active_runs "$A_PORT" 1 >/dev/null
decide "$A_PORT" newstream "$(decision_body t11 r11 "$APPROVE")" -D "$T/h11"
check_eq "a decision answered with a stream: the client gets that stream (200)" 200 "$STATUS"
check_contains "… as an event stream" "Content-Type: text/event-stream" "$(cat "$T/h11")"
printf '%s' "$BODY" >"$T/d11.s"
check_eq "… one whole run" "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED " \
    "$(types "$T/d11.s")"
check_contains "… with the decision's ids" '{"type":"RUN_STARTED","threadId":"t11","runId":"r11"}' "$BODY"
check_contains "… and the backend's answer to it, nothing thrown away" "Successfully deleted 15 temporary files." "$BODY"
check_eq "not counted as forwarded" "$fwd_before" "$(metric agw_decisions_forwarded_total "$A_PORT")"
check_eq "counted as streamed" 1 "$(metric agw_decisions_streamed_total "$A_PORT")"
wait_done "$s11_PID" || fail "the original run t11 did not end"
check_eq "the original run ends without the decision" RUN_FINISHED "$(types "$T/s11.s" | awk '{print $NF}')"
check_not_contains "… and without its answer" "Successfully" "$(cat "$T/s11.s")"
wait_grep "$T/A.json.access" '"thread":"t11","run":"r11","key":"web","status":200,"events":5' ||
    fail "the decision's stream is not in the access log as a run: $(grep t11 "$T/A.json.access")"
registry_empty "a decision answered with a stream" "$A_PORT"

# ---- 12. an empty stream (CopilotKit: "thread already running"): 502, never 202; the run still waits ----
stream s12 "$A_PORT" empty "$(run_body t12 r12)"
wait_grep "$T/s12.s" TOOL_CALL_END || fail "run t12 did not reach its tool call"
wait_metric agw_active_runs "$A_PORT" 1 >/dev/null
decide "$A_PORT" empty "$(decision_body t12 r12 "$APPROVE")"
check_eq "a decision answered with an empty stream: 502" 502 "$STATUS"
check_contains "502 says why" "the backend answered with an empty event stream (it did not take the decision)" "$BODY"
check_eq "the waiting run is untouched" 1 "$(metric agw_active_runs "$A_PORT")"

# ---- 13. a refusal with the backend's reason: 502 quoting it ----
stream s13 "$A_PORT" conflict "$(run_body t13 r13)"
wait_grep "$T/s13.s" TOOL_CALL_END || fail "run t13 did not reach its tool call"
wait_metric agw_active_runs "$A_PORT" 2 >/dev/null
decide "$A_PORT" conflict "$(decision_body t13 r13 "$APPROVE")"
check_eq "a decision refused with 409: 502" 502 "$STATUS"
check_eq "502 quotes the backend's status and reason" \
    '{"error":"bad gateway: the backend refused the decision with HTTP 409: thread already running: the decision was not taken"}' "$BODY"
for r in r12 r13; do
    http POST "http://127.0.0.1:$A_PORT/v1/ag-ui/agents/$([ $r = r12 ] && echo empty || echo conflict)/runs/$r/cancel" -H "$AUTH"
done
wait_done "$s12_PID" && wait_done "$s13_PID" || fail "runs t12/t13 did not end on cancel"
registry_empty "an empty stream and a refusal" "$A_PORT"

# ---- 14. a new stream that fails at once: the error reaches the client in-band, not a 202 ----
stream s14 "$A_PORT" streamfail "$(run_body t14 r14)"
wait_grep "$T/s14.s" TOOL_CALL_END || fail "run t14 did not reach its tool call"
wait_metric agw_active_runs "$A_PORT" 1 >/dev/null
decide "$A_PORT" streamfail "$(decision_body t14 r14 "$APPROVE")"
check_eq "a failing new stream: 200, the run's own error" 200 "$STATUS"
check_contains "… RUN_ERROR in-band" '"type":"RUN_ERROR","message":"demo failure requested (fail=1)","code":"MODEL_ERROR"' "$BODY"
wait_done "$s14_PID" || fail "run t14 did not end"
registry_empty "a failing new stream" "$A_PORT"

# ---- 15. decisions.forward "live": only a 202/204 is success ----
closed_before=$(stat client_closed)
stream s15 "$A_PORT" liveonly "$(run_body t15 r15)"
wait_grep "$T/s15.s" TOOL_CALL_END || fail "run t15 did not reach its tool call"
wait_metric agw_active_runs "$A_PORT" 1 >/dev/null
decide "$A_PORT" liveonly "$(decision_body t15 r15 "$APPROVE")"
check_eq "forward live, the backend starts a stream: 502" 502 "$STATUS"
check_contains "502 says it was not taken live" 'not 202 (decisions.forward is \"live\")' "$BODY"
for _ in $(seq 50); do [ "$(stat client_closed)" -gt "$closed_before" ] && break; sleep 0.1; done
check_eq "… and that stream was closed at the backend" $((closed_before + 1)) "$(stat client_closed)"
wait_done "$s15_PID" || fail "run t15 did not end"
stream s15b "$A_PORT" liveok "$(run_body t15b r15b)"
wait_grep "$T/s15b.s" TOOL_CALL_END || fail "run t15b did not reach its tool call"
wait_metric agw_active_runs "$A_PORT" 1 >/dev/null
decide "$A_PORT" liveok "$(decision_body t15b r15b "$APPROVE")"
check_eq "forward live, the backend takes it live: 202" 202 "$STATUS"
wait_done "$s15b_PID" || fail "run t15b did not end"
check_contains "… and the live run shows it" "Successfully deleted" "$(cat "$T/s15b.s")"
registry_empty "forward live" "$A_PORT"

# ---- 16. decisions.forward "never": a decision-only request is a new run, even with a run waiting ----
fwd_before=$(metric agw_decisions_forwarded_total "$A_PORT")
str_before=$(metric agw_decisions_streamed_total "$A_PORT")
stream s16 "$A_PORT" never "$(run_body t16 r16)"
wait_grep "$T/s16.s" TOOL_CALL_END || fail "run t16 did not reach its tool call"
wait_metric agw_active_runs "$A_PORT" 1 >/dev/null
decide "$A_PORT" never "$(decision_body t16 r16 "$APPROVE")"
check_eq "forward never: a new run" 200 "$STATUS"
check_contains "… which answers the decision" "Successfully deleted 15 temporary files." "$BODY"
check_eq "… not forwarded" "$fwd_before" "$(metric agw_decisions_forwarded_total "$A_PORT")"
check_eq "… not a forwarded decision's stream" "$str_before" "$(metric agw_decisions_streamed_total "$A_PORT")"
wait_done "$s16_PID" || fail "run t16 did not end"
registry_empty "forward never" "$A_PORT"

# A detached run still going when the gateway stops ends with the drain (SHUTDOWN), and nothing leaks.
stream s10 "$A_PORT" detach "$(run_body t10 r10)"
wait_grep "$T/s10.s" TOOL_CALL_END || fail "run t10 did not reach its tool call"
kill "$s10_PID"
wait_grep "$T/A.log" "req=" >/dev/null
check_eq "detached run registered" 1 "$(wait_metric agw_active_runs "$A_PORT" 1)"
for g in A R TH; do
    stop_pid "$(eval echo "\$${g}_PID")" >/dev/null
    check_eq "gateway $g exits cleanly" 0 "$STOP_STATUS"
done
check_contains "the drain ended the detached run" '"run":"r10"' "$(cat "$T/A.json.access")"
finish
