#!/bin/bash
# agui-demo-agent: the four demo scenarios (conversation, frontend tool, server-side tool, human in the loop;
# doc/demo-agent.md), every test knob, the /_demo endpoints, HTTP framing and a clean exit on SIGTERM.
# Everything runs against the real binary on 127.0.0.1 with bounded curls.
. "$AGW_SRCDIR/tests/integration/lib.sh"

start_demo demo --log-level debug || exit 1
U="http://127.0.0.1:$DEMO_PORT"

# sse URL BODY [curl args...]: POSTs BODY, keeps the raw stream in $T/sse, the headers in $T/hdr and the
# curl exit status in CURL_RC; sets SSE (the stream) and TYPES (the "type" of each event, space-separated).
sse() {
    local u=$1 b=$2
    shift 2
    rm -f "$T/sse" "$T/hdr"
    curl -sS -N -m 10 -D "$T/hdr" -o "$T/sse" -H 'Content-Type: application/json' -d "$b" "$@" "$u" \
        2>"$T/curl.err"
    CURL_RC=$?
    [ "$CURL_RC" -eq 0 ] || echo "note: curl $u exited $CURL_RC: $(head -c 300 "$T/curl.err")"
    SSE=$(cat "$T/sse" 2>/dev/null)
    TYPES=$(sed -n 's/^data: {"type":"\([A-Z_]*\)".*/\1/p' "$T/sse" | tr -d '\r' | tr '\n' ' ' |
        sed 's/ $//')
    HDR=$(tr -d '\r' <"$T/hdr" 2>/dev/null)
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

HELLO='{"threadId":"thread_001","runId":"run_001","messages":[{"id":"msg_1","role":"user","content":"Hello"}],"tools":[],"context":[]}'
CHAT='{"threadId":"t9","runId":"r9","messages":[{"id":"m1","role":"user","content":"Tell me a story"}]}'

# ---- scenario 1: pure conversation --------------------------------------------------------------------
sse "$U/agent" "$HELLO"
check_eq "chat: curl ok" 0 "$CURL_RC"
check_contains "chat: 200" "HTTP/1.1 200" "$HDR"
check_contains "chat: text/event-stream" "Content-Type: text/event-stream" "$HDR"
check_contains "chat: chunked" "Transfer-Encoding: chunked" "$HDR"
check_eq "chat: event sequence" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED" \
    "$TYPES"
check_contains "chat: RUN_STARTED carries the ids" \
    'data: {"type":"RUN_STARTED","threadId":"thread_001","runId":"run_001"}' "$SSE"
check_contains "chat: assistant message" \
    'data: {"type":"TEXT_MESSAGE_START","messageId":"msg_2","role":"assistant"}' "$SSE"
check_contains "chat: the greeting's deltas" '"delta":"! How can I help you?"' "$SSE"
check_contains "chat: RUN_FINISHED carries the ids" \
    'data: {"type":"RUN_FINISHED","threadId":"thread_001","runId":"run_001"}' "$SSE"
check_not_contains "chat: no null field" ':null' "$SSE"
sse "$U/send-message" "$CHAT"
check_contains "chat: echoes the user's text" 'Tell me a story' "$SSE"

# ---- scenario 2: frontend tool, then its result -------------------------------------------------------
FT1='{"threadId":"thread_003","runId":"run_003","messages":[{"id":"msg_1","role":"user","content":"Help me search for report files locally"}],"tools":[{"name":"search_local_files","description":"Search user local files","parameters":{"type":"object","properties":{"keyword":{"type":"string"}}}}],"context":[]}'
sse "$U/agent" "$FT1"
check_eq "frontend tool: event sequence" \
    "RUN_STARTED TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END RUN_FINISHED" "$TYPES"
check_contains "frontend tool: start" \
    '{"type":"TOOL_CALL_START","toolCallId":"call_002","toolCallName":"search_local_files"}' "$SSE"
check_contains "frontend tool: args" '"delta":"{\"keyword\":\"report\"}"' "$SSE"
FT2='{"threadId":"thread_003","runId":"run_004","messages":[{"id":"msg_1","role":"user","content":"Help me search for report files locally"},{"id":"msg_2","role":"assistant","toolCalls":[{"id":"call_002","type":"function","function":{"name":"search_local_files","arguments":"{\"keyword\":\"report\"}"}}]},{"id":"msg_3","role":"tool","toolCallId":"call_002","content":"[\"2024_annual_report.pdf\", \"Q3_report.docx\"]"}],"tools":[],"context":[]}'
sse "$U/agent" "$FT2"
check_eq "tool result: event sequence" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED" "$TYPES"
check_contains "tool result: uses the result" \
    '"messageId":"msg_4","delta":"Found 2 files: 2024_annual_report.pdf and Q3_report.docx"' "$SSE"
check_contains "tool result: new run id" '"runId":"run_004"' "$SSE"

# ---- scenario 3: server-side tool (weather) -----------------------------------------------------------
W='{"threadId":"thread_002","runId":"run_002","messages":[{"id":"msg_1","role":"user","content":"What is the weather like in Beijing?"}],"tools":[],"context":[]}'
sse "$U/agent" "$W"
check_eq "weather: event sequence" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END TOOL_CALL_RESULT TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED" \
    "$TYPES"
check_contains "weather: tool start" \
    '{"type":"TOOL_CALL_START","toolCallId":"call_001","toolCallName":"get_weather","parentMessageId":"msg_2"}' \
    "$SSE"
check_contains "weather: args" '"delta":"{\"city\":\"Beijing\"}"' "$SSE"
check_contains "weather: result" '"type":"TOOL_CALL_RESULT","messageId":"msg_tool_1","toolCallId":"call_001"' "$SSE"
check_contains "weather: final text" '"messageId":"msg_3","delta":"Beijing is sunny today, 25°C."' "$SSE"

# ---- scenario 4: human in the loop (confirmAction), approved and denied ------------------------------------
CONFIRM_TOOL='{"name":"confirmAction","description":"Request user confirmation","parameters":{"type":"object","properties":{"action":{"type":"string"},"count":{"type":"number"}},"required":["action"]}}'
H1='{"threadId":"thread_004","runId":"run_005","messages":[{"id":"msg_1","role":"user","content":"Delete all temporary files"}],"tools":['$CONFIRM_TOOL'],"context":[]}'
sse "$U/agent" "$H1"
check_eq "confirm: event sequence" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END RUN_FINISHED" \
    "$TYPES"
check_contains "confirm: announces" '"delta":"About to delete 15 temporary files"' "$SSE"
check_contains "confirm: tool call" \
    '{"type":"TOOL_CALL_START","toolCallId":"call_003","toolCallName":"confirmAction","parentMessageId":"msg_2"}' \
    "$SSE"
check_contains "confirm: args" '"delta":"{\"action\":\"delete temporary files\",\"count\":15}"' "$SSE"
decision() {
    printf '%s' '{"threadId":"thread_004","runId":"run_006","messages":[{"id":"msg_1","role":"user","content":"Delete all temporary files"},{"id":"msg_2","role":"assistant","content":"About to delete 15 temporary files","toolCalls":[{"id":"call_003","type":"function","function":{"name":"confirmAction","arguments":"{\"action\":\"delete temporary files\",\"count\":15}"}}]},{"id":"msg_3","role":"tool","toolCallId":"call_003","content":'"$1"'}],"tools":['$CONFIRM_TOOL'],"context":[]}'
}
sse "$U/agent" "$(decision '"confirmed"')"
check_eq "approved: event sequence" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED" "$TYPES"
check_contains "approved: text" '"messageId":"msg_4","delta":"Successfully deleted 15 temporary files."' "$SSE"
for yes in '"true"' '"{\"approved\":true}"' '"yes"' '"approve"'; do
    sse "$U/agent" "$(decision "$yes")"
    check_contains "approved by $yes" 'Successfully deleted' "$SSE"
done
for no in '"false"' '"{\"approved\":false}"' '"deny"' '"cancel"'; do
    sse "$U/agent" "$(decision "$no")"
    check_contains "denied by $no" 'Cancelled: I did not delete temporary files.' "$SSE"
done

# ---- knobs ------------------------------------------------------------------------------------------
sse "$U/agent?events=5&size=7" "$CHAT"
check_eq "events=5: five deltas" 5 "$(grep -c TEXT_MESSAGE_CONTENT "$T/sse")"
check_contains "size=7: filler delta of 7 bytes" '"delta":"lorem i"}' "$SSE"
sse "$U/agent?events=5" "$CHAT" -H 'X-Demo-Events: 2'
check_eq "header knob wins over the query" 2 "$(grep -c TEXT_MESSAGE_CONTENT "$T/sse")"
sse "$U/agent?events=0" "$CHAT"
check_eq "events=0" "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_END RUN_FINISHED" "$TYPES"

sse "$U/agent?crlf=1" "$HELLO"
check_eq "crlf=1: every line ends with CR LF" "$(grep -c '' "$T/sse")" "$(grep -c $'\r$' "$T/sse")"
check_contains "crlf=1: CRLF CRLF separators" '\r  \n  \r  \n' "$(od -c "$T/sse")"
sse "$U/agent" "$HELLO"
check_eq "default: no CR at all" 0 "$(grep -c $'\r' "$T/sse")"

sse "$U/agent?status=500" "$HELLO"
check_contains "status=500: status" "HTTP/1.1 500" "$HDR"
check_contains "status=500: JSON" "Content-Type: application/json" "$HDR"
check_eq "status=500: body" '{"error":"demo status 500"}' "$SSE"
sse "$U/agent" '{not json' -H 'X-Demo-Status: 429'
check_contains "status from header, body not even parsed" "HTTP/1.1 429" "$HDR"

sse "$U/agent?drop_after=3&events=100&delay_ms=1" "$CHAT"
check_eq "drop_after=3: curl sees a truncated body" 18 "$CURL_RC"
check_eq "drop_after=3: three events arrived" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT" "$TYPES"
sse "$U/agent?drop_after=0" "$CHAT"
check_eq "drop_after=0: headers then EOF" 18 "$CURL_RC"

sse "$U/agent?stall=1" "$CHAT" -m 1
check_eq "stall=1: still open after 1 s" 28 "$CURL_RC"
check_eq "stall=1: sent up to the first delta" "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT" "$TYPES"

sse "$U/agent?framing=close" "$HELLO"
check_eq "framing=close: curl ok" 0 "$CURL_RC"
check_not_contains "framing=close: not chunked" "Transfer-Encoding" "$HDR"
check_not_contains "framing=close: no length" "Content-Length" "$HDR"
check_contains "framing=close: Connection: close" "Connection: close" "$HDR"
check_contains "framing=close: complete stream" "RUN_FINISHED" "$TYPES"
sse "$U/agent?framing=length" "$HELLO"
check_contains "framing=length: Content-Length" "Content-Length: $(wc -c <"$T/sse")" "$HDR"
check_eq "framing=length: complete stream" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED" \
    "$TYPES"
sse "$U/agent?content_type=application%2Fjson" "$HELLO"
check_contains "content_type=application/json" "Content-Type: application/json" "$HDR"

sse "$U/agent?lifecycle=none" "$HELLO"
check_eq "lifecycle=none" \
    "TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END" "$TYPES"
sse "$U/agent?done=1" "$HELLO"
check_eq "done=1: [DONE] last" "data: [DONE]" "$(grep '^data:' "$T/sse" | tail -n1)"
sse "$U/agent?fail=1" "$HELLO"
check_contains "fail=1: ends with RUN_ERROR" "TEXT_MESSAGE_END RUN_ERROR" "$TYPES"
check_not_contains "fail=1: no RUN_FINISHED" "RUN_FINISHED" "$TYPES"
check_contains "fail=1: message and code" '"message":"demo failure requested (fail=1)","code":"MODEL_ERROR"' "$SSE"

sse "$U/agent?dialect=cloudbase&fail=1" "$W"
check_contains "cloudbase: RUN_ERROR.error" '{"type":"RUN_ERROR","error":{"code":"MODEL_ERROR","message":' "$SSE"
check_contains "cloudbase: TEXT_MESSAGE_START without role" '{"type":"TEXT_MESSAGE_START","messageId":"msg_2"}' "$SSE"
check_contains "cloudbase: TOOL_CALL_START carries args" '"parentMessageId":"msg_2","args":{"city":"Beijing"}}' "$SSE"
check_not_contains "cloudbase: no TOOL_CALL_ARGS" "TOOL_CALL_ARGS" "$TYPES"

sse "$U/agent?multiline=1" "$HELLO"
check_contains "multiline=1: JSON over several data: lines" $'data: {\ndata:   "type": "RUN_STARTED",' "$SSE"
check_eq "multiline=1: one frame per event" 6 "$(grep -c '^data: }' "$T/sse")"
sse "$U/agent?comments=1" "$HELLO"
check_contains "comments=1: keepalive comment" ": keepalive" "$SSE"
check_contains "comments=1: event: and id: lines" $'event: RUN_STARTED\nid: 1\ndata: {"type":"RUN_STARTED"' "$SSE"
sse "$U/agent?ts=1&events=3" "$CHAT"
check_eq "ts=1: every delta has sentUs" 3 "$(grep -c '"sentUs":[0-9]\{16\}}' "$T/sse")"

sse "$U/agent" "$HELLO"
cp "$T/sse" "$T/plain"
sse "$U/agent?bytewise=1" "$HELLO"
check_eq "bytewise=1: the same bytes" "$(od -c "$T/plain")" "$(od -c "$T/sse")"
check_eq "bytewise=1: curl ok" 0 "$CURL_RC"

# write_each=1: every event its own chunk in its own write(), with no delay_ms. Shown at the receiving end,
# with no tracer: the client's socket counts the TCP segments that carried data (tcp_info's
# tcpi_data_segs_in, Linux >= 4.6). Both sides set TCP_NODELAY, so each write of the agent is a segment of
# its own; the batched default sends 44 events in one write (one segment, two with the head).
cat >"$T/segs.py" <<'PY'
import socket, struct, sys
port, query = int(sys.argv[1]), sys.argv[2]
body = b'{"messages":[{"id":"m1","role":"user","content":"Tell me a story"}]}'
s = socket.create_connection(("127.0.0.1", port), timeout=10)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
s.sendall(b"POST /agent?%s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nConnection: close\r\n"
          b"Content-Length: %d\r\n\r\n%s" % (query.encode(), len(body), body))
data = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
events = sum(1 for l in data.split(b"\n") if l.startswith(b"data: "))
print(events, struct.unpack_from("I", info, 152)[0] if len(info) >= 156 else -1)
PY
read -r ev_b segs_b < <(timeout 20 python3 "$T/segs.py" "$DEMO_PORT" "events=40&size=10")
read -r ev_e segs_e < <(timeout 20 python3 "$T/segs.py" "$DEMO_PORT" "events=40&size=10&write_each=1")
check_eq "write_each=1: the same 44 events" "44 44" "${ev_b:-} ${ev_e:-}"
CHECKS=$((CHECKS + 1))
if [ "${segs_b:--1}" -lt 0 ]; then
    ok "write_each=1: tcp_info has no tcpi_data_segs_in on this kernel (not checked)"
elif [ "$segs_e" -ge 22 ] && [ "$segs_b" -le 4 ]; then
    ok "write_each=1: $segs_e data segments for 44 events (batched: $segs_b)"
else
    fail "write_each=1: $segs_e data segments for 44 events (batched: $segs_b): not one write per event"
fi
sse "$U/agent?write_each=1" "$HELLO"
check_eq "write_each=1: the same bytes" "$(od -c "$T/plain")" "$(od -c "$T/sse")"
check_eq "write_each=1: curl ok" 0 "$CURL_RC"
sse "$U/agent?write_each=1&framing=length&events=5" "$CHAT"
check_eq "write_each=1 with framing=length: whole" 9 "$(grep -c '^data:' "$T/sse")"
sse "$U/agent?write_each=1&delay_ms=5&events=5" "$CHAT"
check_eq "write_each=1 with delay_ms: every event" 9 "$(grep -c '^data:' "$T/sse")"

t0=$(now_ms)
sse "$U/agent?first_byte_delay_ms=400" "$HELLO"
t1=$(now_ms)
check_eq "first_byte_delay_ms: complete" 0 "$CURL_RC"
[ $((t1 - t0)) -ge 380 ] && ok "first_byte_delay_ms=400 waited $((t1 - t0)) ms" ||
    fail "first_byte_delay_ms=400 answered after $((t1 - t0)) ms"
CHECKS=$((CHECKS + 1))
t0=$(now_ms)
sse "$U/agent?delay_ms=30&events=10" "$CHAT"
t1=$(now_ms)
check_eq "delay_ms: all events" 14 "$(grep -c '^data:' "$T/sse")"
[ $((t1 - t0)) -ge 350 ] && ok "delay_ms=30 paced 14 events over $((t1 - t0)) ms" ||
    fail "delay_ms=30: 14 events in $((t1 - t0)) ms"
CHECKS=$((CHECKS + 1))

sse "$U/agent?events=200000&size=64" "$CHAT"
check_eq "big stream: complete" 0 "$CURL_RC"
check_eq "big stream: every delta" 200000 "$(grep -c TEXT_MESSAGE_CONTENT "$T/sse")"

# concurrent streams: all complete
PAR=""
for i in $(seq 40); do
    curl -sS -N -m 20 -d "$CHAT" "$U/agent?events=2000&size=32" 2>/dev/null | grep -c TEXT_MESSAGE_CONTENT \
        >"$T/par.$i" &
    PAR="$PAR $!"
done
for p in $PAR; do wait "$p"; done
check_eq "40 concurrent streams complete" "$(seq 40 | sed 's/.*/2000/' | tr '\n' ' ')" \
    "$(for i in $(seq 40); do cat "$T/par.$i"; done | tr '\n' ' ')"

# ---- bad requests ------------------------------------------------------------------------------------
http POST "$U/agent" -H 'Content-Type: application/json' -d '{"threadId":'
check_eq "bad JSON: 400" 400 "$STATUS"
check_contains "bad JSON: JSON error" '{"error":"invalid JSON body' "$BODY"
http POST "$U/agent" -d '[1,2]'
check_eq "JSON array: 400" 400 "$STATUS"
http POST "$U/agent?delay_ms=soon" -d "$HELLO"
check_eq "bad knob: 400" 400 "$STATUS"
check_contains "bad knob: names the knob" "demo knob delay_ms" "$BODY"
http POST "$U/agent" -H 'X-Demo-Bogus: 1' -d "$HELLO"
check_eq "unknown X-Demo header: 400" 400 "$STATUS"
http GET "$U/agent"
check_eq "GET on an agent path: 405" 405 "$STATUS"
http GET "$U/_demo/nothing"
check_eq "unknown /_demo path: 404" 404 "$STATUS"

# ---- ids, HTTP details ---------------------------------------------------------------------------------
sse "$U/agent" '{"messages":[{"id":"m1","role":"user","content":"Hello"}]}'
check_contains "missing ids are generated" '"threadId":"thread_' "$SSE"
check_contains "missing ids are generated (run)" '"runId":"run_' "$SSE"
printf '%s' "$HELLO" >"$T/hello.json"
sse "$U/agent" "@$T/hello.json" -H 'Transfer-Encoding: chunked'
check_contains "chunked request body" "RUN_FINISHED" "$TYPES"
curl -sS -m 10 -v -o /dev/null -d "$HELLO" "$U/agent" --next -sS -m 10 -o /dev/null -d "$HELLO" \
    "$U/agent" 2>"$T/v" || true
check_contains "keep-alive after a chunked stream" "Re-using existing connection" "$(cat "$T/v")"
exec 3<>"/dev/tcp/127.0.0.1/$DEMO_PORT"
printf 'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nPOST /agent HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s' \
    "${#HELLO}" "$HELLO" >&3
RAW=$(timeout 5 cat <&3 | tr -d '\r')
exec 3<&-
check_contains "pipelined: first answer" '{"status":"ok"}' "$RAW"
check_contains "HTTP/1.0: close-delimited stream" $'Connection: close\n\ndata: {"type":"RUN_STARTED"' "$RAW"
check_contains "HTTP/1.0: complete" 'RUN_FINISHED' "$RAW"

# ---- ids=run: every message and tool-call id is followed by -<runId> (new in every run) ----
sse "$U/agent?ids=run" "$HELLO"
check_contains "ids=run: the text message's id" '"messageId":"msg_2-run_001","role":"assistant"' "$SSE"
check_not_contains "ids=run: no bare id" '"msg_2"' "$SSE"
sse "$U/agent?ids=count" "$HELLO"
check_contains "ids=count: the message count alone (the default)" '"messageId":"msg_2","role":"assistant"' "$SSE"
sse "$U/agent" '{"threadId":"t","runId":"r5","messages":[{"id":"m1","role":"user","content":"What is the weather in Paris?"}]}' \
    -H 'X-Demo-Ids: run'
check_contains "ids=run (header): the tool call and its parent" \
    '"toolCallId":"call_001-r5","toolCallName":"get_weather","parentMessageId":"msg_2-r5"' "$SSE"
check_contains "ids=run: the tool result" '"messageId":"msg_tool_1-r5","toolCallId":"call_001-r5"' "$SSE"
check_contains "ids=run: the answer" '"messageId":"msg_3-r5"' "$SSE"
sse "$U/agent?ids=run" "$FT1"
check_contains "ids=run: a frontend tool call" '"toolCallId":"call_002-run_003"' "$SSE"
sse "$U/agent?ids=run" '{"messages":[{"id":"m1","role":"user","content":"Hello"}]}'
check_contains "ids=run: a generated runId too" '"messageId":"msg_2-run_' "$SSE"
sse "$U/agent?ids=sometimes" "$HELLO"
check_contains "ids: a bad value is 400" "HTTP/1.1 400" "$HDR"
check_contains "ids: the 400 names the knob" "demo knob ids: expects count|run" "$SSE"

# ---- /_demo endpoints ----------------------------------------------------------------------------------
http GET "$U/healthz"
check_eq "healthz: 200" 200 "$STATUS"
check_eq "healthz: body" '{"status":"ok"}' "$BODY"
http GET "$U/_demo/stats"
check_contains "stats: nothing active" '"active_streams":0,' "$BODY"
CC0=$(printf %s "$BODY" | sed 's/.*"client_closed":\([0-9]*\).*/\1/')
timeout 1 curl -sS -N -m 10 -d "$CHAT" "$U/agent?stall=1" >/dev/null 2>&1
sleep 0.3
http GET "$U/_demo/stats"
check_eq "stats: client_closed counts the killed client" $((CC0 + 1)) \
    "$(printf %s "$BODY" | sed 's/.*"client_closed":\([0-9]*\).*/\1/')"
check_contains "stats: the stalled stream is no longer active" '"active_streams":0,' "$BODY"
check_contains "stats: requests counted" '"requests":' "$BODY"
check_contains "stats: completed counted" '"completed":' "$BODY"

http POST "$U/agent/x?events=1&foo=bar" -H 'Content-Type: application/json' -H 'X-Request-Id: req-42' \
    -H 'traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' -d "$HELLO"
check_eq "last-request: the run" 200 "$STATUS"
http GET "$U/_demo/last-request"
check_contains "last-request: method" '"method":"POST"' "$BODY"
check_contains "last-request: path" '"path":"/agent/x"' "$BODY"
check_contains "last-request: query" '"query":"events=1&foo=bar"' "$BODY"
check_contains "last-request: header" '"x-request-id":"req-42"' "$BODY"
check_contains "last-request: traceparent" '"traceparent":"00-0af7651916cd43dd8448eb211c80319c' "$BODY"
check_contains "last-request: content-type" '"content-type":"application/json"' "$BODY"
check_contains "last-request: raw body" '"body":"{\"threadId\":\"thread_001\"' "$BODY"

# ---- wait_decision: a frontend tool call waits for a decision-only POST, which resumes the same stream ----
WAIT_TOOLS='[{"name":"confirmAction","description":"x","parameters":{"type":"object"}}]'
# wait_body THREAD RUN: the user asks for something that needs a confirmation (scenario b).
wait_body() {
    printf '{"threadId":"%s","runId":"%s","messages":[{"id":"m1","role":"user","content":"delete the temporary files"}],"tools":%s}' \
        "$1" "$2" "$WAIT_TOOLS"
}
# decision_body THREAD RUN CONTENT: decision-only (the assistant's tool call and its answer, no user message);
# CONTENT is the tool message's content as a JSON string literal.
decision_body() {
    printf '{"threadId":"%s","runId":"%s","messages":[{"id":"a1","role":"assistant","content":"","toolCalls":[{"id":"call_003","type":"function","function":{"name":"confirmAction","arguments":"{}"}}]},{"id":"t1","role":"tool","toolCallId":"call_003","content":%s}]}' \
        "$1" "$2" "$3"
}
APPROVE='"{\"approved\":true}"'
# demo_stat NAME: one counter of /_demo/stats.
demo_stat() { curl -sS -m 5 "$U/_demo/stats" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }
# wait_stat NAME VALUE: polls /_demo/stats until NAME is VALUE (5 s max); prints the last value seen.
wait_stat() {
    local v=
    for _ in $(seq 50); do
        v=$(demo_stat "$1")
        [ "$v" = "$2" ] && break
        sleep 0.1
    done
    echo "$v"
}
# start_waiting NAME URL BODY [curl args...]: starts a run in the background, its stream into $T/NAME.s and its
# headers into $T/NAME.h; sets WAIT_PID. Returns once the stream holds TOOL_CALL_END (5 s max).
start_waiting() {
    local n=$1 u=$2 b=$3
    shift 3
    rm -f "$T/$n.s" "$T/$n.h"
    curl -sS -N -m 15 -D "$T/$n.h" -o "$T/$n.s" -H 'Content-Type: application/json' -d "$b" "$@" "$u" \
        2>/dev/null &
    WAIT_PID=$!
    for _ in $(seq 50); do
        grep -q TOOL_CALL_END "$T/$n.s" 2>/dev/null && break
        sleep 0.1
    done
}
# ended PID: waits for a background curl (bounded by its -m) and prints its exit status.
ended() {
    wait "$1"
    echo $?
}
# decide BODY [curl args...]: POSTs a decision; sets STATUS, BODY and DHDR (the response headers).
decide() {
    local b=$1
    shift
    curl -sS -m 10 -D "$T/dec.h" -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' -d "$b" \
        "$@" "$U/agent" >"$T/status" 2>"$T/curl.err" || true
    STATUS=$(cat "$T/status")
    BODY=$(cat "$T/body" 2>/dev/null)
    DHDR=$(tr -d '\r' <"$T/dec.h" 2>/dev/null)
}
types_of() { sed -n 's/^data: {"type":"\([A-Z_]*\)".*/\1/p' "$1" | tr '\n' ' ' | sed 's/ $//'; }
WAITED_TYPES="RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END"
RESUMED_TYPES="$WAITED_TYPES TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED"

# (i) a confirmation waits; the decision for the same thread and run gets 202 and the stream goes on
start_waiting w1 "$U/agent?wait_decision=1" "$(wait_body tw rw)"
check_eq "wait: the run waits" 1 "$(wait_stat waiting 1)"
check_eq "wait: everything up to TOOL_CALL_END is flushed, nothing after" "$WAITED_TYPES" "$(types_of "$T/w1.s")"
check_contains "wait: X-Demo-Scenario is the run's scenario" $'X-Demo-Scenario: confirm\n' "$(tr -d '\r' <"$T/w1.h")"
C0=$(demo_stat completed)
decide "$(decision_body tw rw "$APPROVE")"
check_eq "decision: 202" 202 "$STATUS"
check_eq "decision: the 202 names the waiting run" '{"status":"accepted","threadId":"tw","runId":"rw"}' "$BODY"
check_contains "decision: Content-Length" "Content-Length: ${#BODY}" "$DHDR"
check_contains "decision: keep-alive" "Connection: keep-alive" "$DHDR"
check_eq "decision: the waiting stream ends cleanly" 0 "$(ended "$WAIT_PID")"
check_eq "decision: one run, the answer after the tool call" "$RESUMED_TYPES" "$(types_of "$T/w1.s")"
check_eq "decision: exactly one RUN_STARTED" 1 "$(grep -c RUN_STARTED "$T/w1.s")"
check_contains "decision: the run's own tool and arguments answer it" \
    '{"type":"TEXT_MESSAGE_CONTENT","messageId":"msg_3","delta":"Successfully deleted 15 temporary files."}' \
    "$(cat "$T/w1.s")"
check_contains "decision: RUN_FINISHED carries the run's ids" '{"type":"RUN_FINISHED","threadId":"tw","runId":"rw"}' \
    "$(cat "$T/w1.s")"
check_eq "decision: nothing waits any more" 0 "$(wait_stat waiting 0)"
check_eq "decision: decisions counted" 1 "$(demo_stat decisions)"
check_eq "decision: the resumed run completed" $((C0 + 1)) "$(demo_stat completed)"
check_contains "decision: logged" "decision for run rw (thread tw, confirmAction call_003)" "$(cat "$T/demo.log")"

# (ii) a denial; the knob as a header; the waiting run's own knobs (done) apply at its end; a decision holding
# only its tool message still gets a new message id (msg_2 is the run's own text)
start_waiting w2 "$U/agent" "$(wait_body td rd)" -H 'X-Demo-Wait-Decision: 1' -H 'X-Demo-Done: 1'
check_eq "denial: the run waits (header knob)" 1 "$(wait_stat waiting 1)"
decide '{"threadId":"td","runId":"rd","messages":[{"id":"t1","role":"tool","toolCallId":"call_003","content":"false"}]}'
check_eq "denial: 202" 202 "$STATUS"
check_eq "denial: the waiting stream ends cleanly" 0 "$(ended "$WAIT_PID")"
check_contains "denial: the answer" \
    '{"type":"TEXT_MESSAGE_CONTENT","messageId":"msg_3","delta":"Cancelled: I did not delete temporary files."}' \
    "$(cat "$T/w2.s")"
check_eq "denial: done=1 of the waiting run" "data: [DONE]" "$(grep '^data:' "$T/w2.s" | tail -n1)"

# (iii) two waiting runs on one thread: a decision with another runId goes to the latest, one with the exact
# runId to that run; a frontend tool (scenario c) waits too, and a tool message for another call still answers it
FRONTEND_TOOLS='[{"name":"search_local_files","description":"x","parameters":{"type":"object","properties":{"keyword":{"type":"string"}}}}]'
start_waiting w3a "$U/agent?wait_decision=1" \
    '{"threadId":"tx","runId":"rx1","messages":[{"id":"m1","role":"user","content":"search for report files locally"}],"tools":'"$FRONTEND_TOOLS"'}'
W3A=$WAIT_PID
check_eq "thread: the frontend tool run waits" 1 "$(wait_stat waiting 1)"
check_contains "thread: X-Demo-Scenario frontend-tool" $'X-Demo-Scenario: frontend-tool\n' "$(tr -d '\r' <"$T/w3a.h")"
start_waiting w3b "$U/agent?wait_decision=1" "$(wait_body tx rx2)"
check_eq "thread: two runs wait" 2 "$(wait_stat waiting 2)"
decide "$(decision_body tx other-run "$APPROVE")"
check_eq "thread: another runId, 202" 202 "$STATUS"
check_eq "thread: the thread's latest waiting run takes it" '{"status":"accepted","threadId":"tx","runId":"rx2"}' "$BODY"
check_eq "thread: that stream ends cleanly" 0 "$(ended "$WAIT_PID")"
check_contains "thread: with the decision" "Successfully deleted 15 temporary files." "$(cat "$T/w3b.s")"
check_eq "thread: the other run still waits" 1 "$(wait_stat waiting 1)"
decide "$(decision_body tx rx1 '"[\"a.pdf\",\"b.pdf\"]"')"
check_eq "thread: the exact runId takes it" '{"status":"accepted","threadId":"tx","runId":"rx1"}' "$BODY"
check_eq "thread: the frontend tool stream ends cleanly" 0 "$(ended "$W3A")"
check_contains "thread: answered as scenario (a) does" '"delta":"Found 2 files: a.pdf and b.pdf"' "$(cat "$T/w3a.s")"
check_eq "thread: the frontend tool run resumed" \
    "RUN_STARTED TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED" \
    "$(types_of "$T/w3a.s")"
check_eq "thread: decisions counted" 4 "$(demo_stat decisions)"

# (iv) a decision-only POST with nothing waiting is an ordinary run (scenario a)
sse "$U/agent" "$(decision_body tw rw "$APPROVE")"
check_contains "no waiting run: 200" "HTTP/1.1 200" "$HDR"
check_contains "no waiting run: an event stream" "Content-Type: text/event-stream" "$HDR"
check_eq "no waiting run: scenario (a)" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED" "$TYPES"
check_contains "no waiting run: answers the tool message" \
    '"messageId":"msg_3","delta":"Done: the action was approved and carried out."' "$SSE"
check_eq "no waiting run: not a decision" 4 "$(demo_stat decisions)"

# (v) a status= knob on the decision wins and the run keeps waiting; a killed client ends the waiting run
start_waiting w5 "$U/agent?wait_decision=1" "$(wait_body tk rk)"
check_eq "killed: the run waits" 1 "$(wait_stat waiting 1)"
decide "$(decision_body tk rk "$APPROVE")" -H 'X-Demo-Status: 500'
check_eq "status= on the decision: that status" 500 "$STATUS"
check_eq "status= on the decision: the run still waits" 1 "$(demo_stat waiting)"
CC0=$(demo_stat client_closed)
kill "$WAIT_PID"
wait "$WAIT_PID" 2>/dev/null
check_eq "killed: nothing waits" 0 "$(wait_stat waiting 0)"
check_eq "killed: client_closed counts it" $((CC0 + 1)) "$(demo_stat client_closed)"
check_eq "killed: no stream left" 0 "$(demo_stat active_streams)"
sse "$U/agent" "$(decision_body tk rk "$APPROVE")"
check_contains "killed: a later decision is an ordinary run" "HTTP/1.1 200" "$HDR"
check_eq "killed: decisions unchanged" 4 "$(demo_stat decisions)"

# (vi) decision= on the decision: what a backend that takes no live decisions does with one
start_waiting w6 "$U/agent?wait_decision=1" "$(wait_body tm rm)"
check_eq "decision=: the run waits" 1 "$(wait_stat waiting 1)"
D0=$(demo_stat decisions)
decide "$(decision_body tm rm "$APPROVE")" -H 'X-Demo-Decision: empty'
check_eq "decision=empty: 200" 200 "$STATUS"
check_contains "decision=empty: an event stream" "Content-Type: text/event-stream" "$DHDR"
check_eq "decision=empty: no event" "" "$BODY"
check_eq "decision=empty: the run still waits" 1 "$(demo_stat waiting)"
decide "$(decision_body tm rm "$APPROVE")" -H 'X-Demo-Decision: refuse'
check_eq "decision=refuse: 409" 409 "$STATUS"
check_eq "decision=refuse: a JSON reason" '{"error":"thread already running: the decision was not taken"}' "$BODY"
check_eq "decision=refuse: the run still waits" 1 "$(demo_stat waiting)"
decide "$(decision_body tm rm "$APPROVE")" -H 'X-Demo-Decision: stream'
check_eq "decision=stream: 200" 200 "$STATUS"
printf '%s\n' "$BODY" >"$T/d6.s"
check_eq "decision=stream: a new run answering the decision" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED" "$(types_of "$T/d6.s")"
check_contains "decision=stream: with the decision's ids" '"threadId":"tm","runId":"rm"' "$BODY"
check_eq "decision=stream: the waiting run ends" 0 "$(ended "$WAIT_PID")"
check_eq "decision=stream: … without the decision" "$WAITED_TYPES RUN_FINISHED" "$(types_of "$T/w6.s")"
check_eq "decision=stream: nothing waits" 0 "$(demo_stat waiting)"
check_eq "decision=stream: not applied as a decision" "$D0" "$(demo_stat decisions)"
decide "$(decision_body tm rm "$APPROVE")" -H 'X-Demo-Decision: maybe'
check_eq "decision=: a bad value is 400" 400 "$STATUS"
check_contains "decision=: the 400 names the knob" "demo knob decision" "$BODY"

# (ids=run) a decision's follow-up text gets the waiting run's runId
start_waiting w7 "$U/agent?wait_decision=1&ids=run" "$(wait_body tn rn)"
check_contains "ids=run: the waiting run's tool call" '"toolCallId":"call_003-rn"' "$(cat "$T/w7.s")"
decide "$(decision_body tn rn "$APPROVE")"
check_eq "ids=run: the decision is taken" 202 "$STATUS"
check_eq "ids=run: the run ends" 0 "$(ended "$WAIT_PID")"
check_contains "ids=run: the follow-up text's id" '"messageId":"msg_3-rn"' "$(cat "$T/w7.s")"

# ---- SIGTERM ------------------------------------------------------------------------------------------
curl -sS -N -m 10 -d "$CHAT" "$U/agent?stall=1" >/dev/null 2>&1 &
sleep 0.3
# stop_pid runs here, not in $(...): only the shell that started the agent can wait for its status
stop_pid "$DEMO_PID" >"$T/stop"
check_eq "exits 0 on SIGTERM (with a stream open)" 0 "$(cat "$T/stop")"
check_contains "one log line per request" "POST /agent?status=500 -> run" "$(cat "$T/demo.log")"

finish
