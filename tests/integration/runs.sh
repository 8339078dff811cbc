#!/usr/bin/env bash
# POST /v1/ag-ui/agents/{id}/runs before anything reaches an upstream: bearer auth (401/403), unknown agents
# (404, after auth), 415, 413, 400 and 422 with the exact messages of doc/protocol.md#validation.
. "$AGW_SRCDIR/tests/integration/lib.sh"

h() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [
    { "id": "web", "sha256": "$(h web-token)", "agents": ["a"] },
    { "id": "ops", "sha256": "$(h ops-token)", "agents": ["*"] } ] },
  "agents": { "a": { "upstreams": ["http://127.0.0.1:9/agent"] },
              "b": { "upstreams": ["http://127.0.0.1:9/agent"] } },
  "limits": { "max_body_bytes": 4096, "max_json_depth": 16 },
  "log": { "access": "$T/access.log" }
}
JSON
start_gateway "$T/gw.json" || exit 1
U=http://127.0.0.1:$GW_PORT/v1/ag-ui/agents
J='Content-Type: application/json'
WEB='Authorization: Bearer web-token'
OK='{"threadId":"t1","runId":"r1","messages":[{"id":"m1","role":"user","content":"hi"}]}'

http POST $U/a/runs -H "$J" -d "$OK"
check_eq "no token" 401 "$STATUS"
check_contains "401 names the problem" '"error":"unauthorized' "$BODY"
curl -s -D "$T/h" -o /dev/null -H "$J" -d "$OK" $U/a/runs
check_contains "401 carries WWW-Authenticate" 'WWW-Authenticate: Bearer realm="agui-gateway"' "$(cat "$T/h")"
http POST $U/a/runs -H "$J" -H 'Authorization: Bearer wrong' -d "$OK"
check_eq "unknown token" 401 "$STATUS"
http POST $U/a/runs -H "$J" -H 'Authorization: Basic d2ViOnRva2Vu' -d "$OK"
check_eq "not a bearer token" 401 "$STATUS"
http POST $U/b/runs -H "$J" -H "$WEB" -d "$OK"
check_eq "valid token, agent outside its list" 403 "$STATUS"
check_contains "403 names the agent" "'b'" "$BODY"
http POST $U/zzz/runs -H "$J" -d "$OK"
check_eq "unknown agent without a token is 401 (ids do not leak)" 401 "$STATUS"
http GET http://127.0.0.1:$GW_PORT/metrics
check_not_contains "a client-chosen agent id does not become a metrics label" 'agent="zzz"' "$BODY"
check_contains "its 401 is counted without an agent" 'agw_requests_total{agent="",status="401"}' "$BODY"
http POST $U/zzz/runs -H "$J" -H 'Authorization: Bearer ops-token' -d "$OK"
check_eq "unknown agent" 404 "$STATUS"
check_eq "unknown agent message" '{"error":"agent not found: zzz"}' "$BODY"

http POST $U/a/runs -H "$WEB" -H 'Content-Type: text/plain' -d "$OK"
check_eq "wrong Content-Type" 415 "$STATUS"
http POST $U/a/runs -H "$WEB" -H 'Content-Type: application/json; charset=utf-8' -d 'nope'
check_eq "Content-Type with parameters is accepted; bad JSON" 400 "$STATUS"
check_contains "bad JSON message" '"error":"bad request: body is not valid JSON' "$BODY"
http POST $U/a/runs -H "$WEB" -H "$J" -d '[1,2]'
check_eq "not an object" 400 "$STATUS"
http POST $U/a/runs -H "$WEB" -H "$J" -d '{"threadId":"","runId":"r","messages":[]}'
check_eq "empty threadId" 400 "$STATUS"
check_eq "empty threadId message" '{"error":"bad request: threadId cannot be empty"}' "$BODY"
http POST $U/a/runs -H "$WEB" -H "$J" -d '{"threadId":"t","runId":"","messages":[]}'
check_eq "empty runId message" '{"error":"bad request: runId cannot be empty"}' "$BODY"
http POST $U/a/runs -H "$WEB" -H "$J" -d '{"threadId":"t","messages":[]}'
check_eq "missing runId" 422 "$STATUS"
check_contains "missing runId names it" 'runId' "$BODY"
http POST $U/a/runs -H "$WEB" -H "$J" -d '{"threadId":7,"runId":"r","messages":[]}'
check_eq "threadId not a string" 422 "$STATUS"
http POST $U/a/runs -H "$WEB" -H "$J" -d '{"threadId":"t","runId":"r"}'
check_eq "missing messages" 422 "$STATUS"
http POST $U/a/runs -H "$WEB" -H "$J" \
    -d '{"threadId":"t","runId":"r","messages":[{"role":"user","content":"x"},{"role":"wizard"},{"role":"tool","content":"ok"}]}'
check_eq "bad role" 422 "$STATUS"
check_contains "bad role names the path" 'messages[1].role' "$BODY"
http POST $U/a/runs -H "$WEB" -H "$J" \
    -d '{"threadId":"t","runId":"r","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"},{"role":"tool","content":"ok"}]}'
check_eq "tool message without toolCallId" 422 "$STATUS"
check_contains "names messages[2].toolCallId" 'messages[2].toolCallId is required' "$BODY"
http POST $U/a/runs -H "$WEB" -H "$J" -d '{"threadId":"t","runId":"r","messages":[],"tools":[{"parameters":{}}]}'
check_eq "tool without name" 422 "$STATUS"
deep=$(printf '%.0s[' $(seq 40))1$(printf '%.0s]' $(seq 40))
http POST $U/a/runs -H "$WEB" -H "$J" -d "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[],\"state\":$deep}"
check_eq "JSON nested deeper than limits.max_json_depth" 400 "$STATUS"
printf '{"threadId":"t\xff","runId":"r","messages":[]}' >"$T/bad-utf8"
http POST $U/a/runs -H "$WEB" -H "$J" --data-binary @"$T/bad-utf8"
check_eq "invalid UTF-8" 400 "$STATUS"
head -c 5000 /dev/zero | tr '\0' ' ' >"$T/big"
http POST $U/a/runs -H "$WEB" -H "$J" --data-binary @"$T/big"
check_eq "too large" 413 "$STATUS"

# Valid input, unreachable upstream (port 9 is closed): 502 with a JSON error.
http POST $U/a/runs -H "$WEB" -H "$J" -d "$OK"
check_eq "upstream unreachable before the stream" 502 "$STATUS"
check_contains "502 is a JSON error" '"error":"bad gateway' "$BODY"

# The same bearer rules guard the cancel and thread-history endpoints.
V=http://127.0.0.1:$GW_PORT/v1/ag-ui
http POST $U/a/runs/r1/cancel
check_eq "cancel without a token" 401 "$STATUS"
http POST $U/b/runs/r1/cancel -H "$WEB"
check_eq "cancel with a key outside its agents" 403 "$STATUS"
http POST $U/zzz/runs/r1/cancel -H 'Authorization: Bearer ops-token'
check_eq "cancel on an unknown agent" 404 "$STATUS"
http GET $V/threads/t1/messages
check_eq "thread history without a token" 401 "$STATUS"
http GET $V/threads/t1/messages -H 'Authorization: Bearer nope'
check_eq "thread history with an unknown token" 401 "$STATUS"

check_contains "access log names the key id" '"key":"web"' "$(cat "$T/access.log")"
# the client's address, made text only when a line is written (src/http_server.c, peer_of())
check_contains "access log names the client's address and port" '"client":"127.0.0.1:' "$(cat "$T/access.log")"
check_not_contains "access log never holds a token" 'web-token' "$(cat "$T/access.log" "$GW_LOG")"
stop_pid "$GW_PID" >/dev/null
st=$STOP_STATUS
check_eq "clean exit" 0 "$st"
finish
