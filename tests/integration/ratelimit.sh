#!/usr/bin/env bash
# Rate limits per key (doc/configuration.md#rate-limits): runs per minute (a token bucket with a burst) and
# concurrent runs; over the limit 429 {"error":…} with Retry-After; counted across worker loops; decisions
# and cancels are not runs; exported in /metrics.
. "$AGW_SRCDIR/tests/integration/lib.sh"

start_demo demo || exit 1
D=http://127.0.0.1:$DEMO_PORT
h() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [
    { "id": "web",  "sha256": "$(h web-token)",  "agents": ["*"], "rate_limit": { "runs_per_minute": 2 } },
    { "id": "burst", "sha256": "$(h burst-token)", "agents": ["*"], "rate_limit": { "runs_per_minute": 1, "burst": 4 } },
    { "id": "ops",  "sha256": "$(h ops-token)",  "agents": ["*"], "rate_limit": { "concurrent_runs": 1 } },
    { "id": "free", "sha256": "$(h free-token)", "agents": ["*"], "rate_limit": { "runs_per_minute": 0 } } ] },
  "agents": { "demo": { "upstreams": ["$D/agent"] }, "hitl": { "upstreams": ["$D/agent?wait_decision=1"] } },
  "rate_limit": { "runs_per_minute": 1000 },
  "store": { "kind": "memory" }
}
JSON
start_gateway "$T/gw.json" || exit 1
U=http://127.0.0.1:$GW_PORT/v1/ag-ui/agents
J='Content-Type: application/json'
RUN='{"threadId":"t1","runId":"r1","messages":[{"id":"m1","role":"user","content":"hi"}]}'
# run TOKEN: one run on a new connection; prints its status.
run() { curl -sS -m 10 -o /dev/null -w '%{http_code}\n' -H "$J" -H "Authorization: Bearer $1" -d "$RUN" "$U/demo/runs"; }

# 1. runs_per_minute 2 (burst: a minute's worth): two runs, then 429 with Retry-After and a reason.
check_eq "first run" 200 "$(run web-token)"
check_eq "second run" 200 "$(run web-token)"
curl -sS -m 10 -D "$T/h" -o "$T/b" -H "$J" -H 'Authorization: Bearer web-token' -d "$RUN" "$U/demo/runs"
check_contains "the third run in the minute: 429" "HTTP/1.1 429" "$(head -n1 "$T/h")"
retry=$(tr -d '\r' <"$T/h" | awk -F': ' 'tolower($1) == "retry-after" { print $2 }')
case "$retry" in
[1-9] | [1-2][0-9] | 30) ok "Retry-After says when a run is due again ($retry s; one every 30 s)" ;;
*) fail "Retry-After: expected 1..30, got '$retry'" ;;
esac
check_eq "the body names the key and the limit" \
    '{"error":"too many requests: key '\''web'\'' may start 2 runs per minute (burst 2); retry in '"$retry"' s"}' "$(cat "$T/b")"
check_eq "another key is not affected" 200 "$(run free-token)"

# 2. A burst of 4 at 1 per minute, from 8 clients at once on separate connections (spread over the worker
# loops): exactly 4 pass.
pids=""
for i in 1 2 3 4 5 6 7 8; do
    run burst-token >"$T/burst.$i" &
    pids="$pids $!"
done
for p in $pids; do wait "$p"; done
passed=$(cat "$T"/burst.* | grep -c 200)
limited=$(cat "$T"/burst.* | grep -c 429)
check_eq "8 concurrent runs against a burst of 4: 4 pass, counted across loops" "4 4" "$passed $limited"

# 3. concurrent_runs 1: a run waiting for a decision holds the key's slot; a second run is refused, but a
# decision for the waiting run and a cancel are not runs.
curl -sS -N -m 30 -o "$T/wait.s" -H "$J" -H 'Authorization: Bearer ops-token' -d "$(run_body t3 r3)" "$U/hitl/runs" &
WAIT=$!
wait_grep "$T/wait.s" TOOL_CALL_END || fail "the waiting run did not call its tool"
check_eq "a second concurrent run of the key: 429" 429 "$(run ops-token)"
check_contains "it says why" "may run 1 runs at once" "$(curl -s -m 10 -H "$J" -H 'Authorization: Bearer ops-token' -d "$RUN" "$U/demo/runs")"
http POST "$U/hitl/runs/nope/cancel" -H 'Authorization: Bearer ops-token'
check_eq "a cancel is not a run (404 for an unknown run, not 429)" 404 "$STATUS"
http POST "$U/hitl/runs" -H "$J" -H 'Authorization: Bearer ops-token' -d "$(decision_body t3 r3 "$APPROVE")"
check_eq "a decision for the waiting run is not a run: 202" 202 "$STATUS"
wait_done "$WAIT" || fail "the waiting run did not end after its decision"
check_contains "the decided run finished" RUN_FINISHED "$(cat "$T/wait.s")"
ok=0
for _ in $(seq 50); do [ "$(run ops-token)" = 200 ] && { ok=1; break; }; sleep 0.1; done
check_eq "its slot is free again once it ended" 1 "$ok"

# 4. /metrics
check_eq "refusals counted by key and limit" 1 "$(metric 'agw_rate_limited_total{key="web",limit="runs_per_minute"}')"
check_eq "the burst's refusals" 4 "$(metric 'agw_rate_limited_total{key="burst",limit="runs_per_minute"}')"
n=$(metric 'agw_rate_limited_total{key="ops",limit="concurrent_runs"}')
[ "${n:-0}" -ge 2 ] && ok "the concurrency refusals ($n)" || fail "the concurrency refusals: expected at least 2, got '$n'"
check_eq "active runs by key, back to 0" 0 "$(metric 'agw_key_active_runs{key="ops"}')"
check_contains "429s counted as requests" 'status="429"' "$(curl -s -m 5 "http://127.0.0.1:$GW_PORT/metrics" | grep agw_requests_total)"

stop_pid "$GW_PID" >/dev/null
check_eq "clean exit" 0 "$STOP_STATUS"
finish
