#!/usr/bin/env bash
# An agent whose backend speaks the legacy AG-Kit send-message dialect ("protocol": "ag-kit"; the demo agent's
# dialect=ag-kit): the request it gets (conversationId, only the messages it has not seen, tools' parameters as
# a string, resume), and the AG-UI stream the client gets from its legacy events, for the seed scenarios —
# basic chat, a server-side tool, a client tool call and its follow-up, an interrupt and its resume — and a
# legacy backend's error status. doc/dialects.md has the rules.
. "$AGW_SRCDIR/tests/integration/lib.sh"

if ! command -v node >/dev/null 2>&1; then
    echo "node is needed to read JSON (scripts/dev test installs it)"
    exit 1
fi
start_demo demo || exit 1
D=http://127.0.0.1:$DEMO_PORT
cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "mode": "none" },
  "agents": { "legacy": { "upstreams": ["$D/send-message?dialect=ag-kit"], "protocol": "ag-kit" },
              "broken": { "upstreams": ["$D/send-message?dialect=ag-kit&status=500"], "protocol": "ag-kit", "retries": 0 } },
  "store": { "kind": "memory" }
}
JSON
start_gateway "$T/gw.json" 2>/dev/null || exit 1
U=http://127.0.0.1:$GW_PORT/v1/ag-ui/agents
post() { # post AGENT BODY: the answer in $T/s, its status in STATUS
    STATUS=$(curl -sS -m 10 -o "$T/s" -w '%{http_code}' -H 'Content-Type: application/json' -d "$2" "$U/$1/runs")
}
types() { grep -o '"type":"[A-Z_]*"' "$T/s" | cut -d'"' -f4 | tr '\n' ' '; }
# upstream_body: what the legacy backend received last, as compact JSON with sorted keys.
upstream_body() {
    curl -s -m 5 "$D/_demo/last-request" | node -e '
      const sort = (v) => Array.isArray(v) ? v.map(sort) : v && typeof v === "object"
        ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sort(v[k])])) : v;
      let s = ""; process.stdin.on("data", (d) => s += d).on("end", () =>
        process.stdout.write(JSON.stringify(sort(JSON.parse(JSON.parse(s).body)))));'
}
TOOLS='[{"name":"change-background-color","description":"Change the background color","parameters":{"type":"object","properties":{"color":{"type":"string"}},"required":["color"]}}]'

# 1. Basic chat.
post legacy '{"threadId":"conv-1","runId":"r1","messages":[{"id":"m1","role":"user","content":"Hello"}]}'
check_eq "chat: 200" 200 "$STATUS"
check_eq "chat: the backend got the legacy request" '{"conversationId":"conv-1","messages":[{"content":"Hello","role":"user"}]}' "$(upstream_body)"
check_eq "chat: text events became one AG-UI message in one run" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED " "$(types)"
check_contains "chat: with the client's ids" '"type":"RUN_STARTED","threadId":"conv-1","runId":"r1"' "$(cat "$T/s")"
check_contains "chat: the text" '"delta":"! How can I help you?"' "$(cat "$T/s")"

# 2. A server-side tool: tool-call-* and tool-result.
post legacy '{"threadId":"conv-2","runId":"r2","messages":[{"id":"m1","role":"user","content":"What is the weather in Paris?"}]}'
check_eq "server tool: tool-call-start|args|end and tool-result became TOOL_CALL_* and TOOL_CALL_RESULT" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END TOOL_CALL_RESULT TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED " "$(types)"
check_contains "server tool: the result is the tool message's content" \
    '"type":"TOOL_CALL_RESULT","messageId":"r2-msg-2","content":"{\"city\":\"Paris\",\"condition\":\"Sunny\",\"temperature\":25,\"unit\":\"C\"}","role":"tool","toolCallId":"call_001"' "$(cat "$T/s")"

# 3. A client tool call, then its result: the backend gets only the tool message.
post legacy '{"threadId":"conv-3","runId":"r3","messages":[{"id":"m1","role":"user","content":"Use change-background-color to make it blue"}],"tools":'"$TOOLS"'}'
check_eq "client tool: the backend got the tools' parameters as a JSON string" \
    '{"conversationId":"conv-3","messages":[{"content":"Use change-background-color to make it blue","role":"user"}],"tools":[{"description":"Change the background color","name":"change-background-color","parameters":"{\"type\":\"object\",\"properties\":{\"color\":{\"type\":\"string\"}},\"required\":[\"color\"]}"}]}' \
    "$(upstream_body)"
check_eq "client tool: the call reaches the client" "RUN_STARTED TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END RUN_FINISHED " "$(types)"
call=$(grep -o '"toolCallId":"[^"]*"' "$T/s" | head -n1 | cut -d'"' -f4)
post legacy '{"threadId":"conv-3","runId":"r4","messages":[{"id":"m1","role":"user","content":"Use change-background-color to make it blue"},{"id":"a1","role":"assistant","toolCalls":[{"id":"'"$call"'","type":"function","function":{"name":"change-background-color","arguments":"{\"color\":\"blue\"}"}}]},{"id":"t1","role":"tool","toolCallId":"'"$call"'","content":"Background color successfully changed to: blue"}],"tools":'"$TOOLS"'}'
check_eq "client tool: its result is a new request (no live decision for a legacy backend)" 200 "$STATUS"
check_contains "client tool: the backend got only the tool message" \
    '"messages":[{"content":"Background color successfully changed to: blue","role":"tool","toolCallId":"'"$call"'"}]' "$(upstream_body)"
check_eq "client tool: the follow-up is a text" "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED " "$(types)"

# 4. An interrupt, then resume.
post legacy '{"threadId":"conv-4","runId":"r5","messages":[{"id":"m1","role":"user","content":"Please delete the temporary files"}],"tools":[{"name":"confirmAction","description":"confirm","parameters":{"type":"object"}}]}'
check_eq "interrupt: the run finishes with it" "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED " "$(types)"
check_contains "interrupt: as RUN_FINISHED's outcome" \
    '"outcome":{"type":"interrupt","interrupts":[{"id":"call_003","reason":"confirm","payload":{"action":"delete temporary files","count":15}}]}' "$(cat "$T/s")"
post legacy '{"threadId":"conv-4","runId":"r6","messages":[{"id":"m1","role":"user","content":"Please delete the temporary files"},{"id":"a1","role":"assistant","content":"About to delete 15 temporary files"}],"resume":[{"interruptId":"call_003","payload":{"approved":true}}]}'
check_contains "resume: the backend got resume {interruptId, payload} and no message" \
    '{"conversationId":"conv-4","messages":[],"resume":{"interruptId":"call_003","payload":{"approved":true}}}' "$(upstream_body)"
check_contains "resume: the run goes on with the approval" "the action was approved and carried out" "$(cat "$T/s")"
check_eq "resume: one run" "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED " "$(types)"

# 5. A legacy backend has no error event: its non-2xx status is the error, before the stream.
post broken '{"threadId":"conv-5","runId":"r7","messages":[{"id":"m1","role":"user","content":"hi"}]}'
check_eq "a backend's 500: 502 with a JSON error" 502 "$STATUS"
check_contains "naming the status" '"error":"bad gateway' "$(cat "$T/s")"

stop_pid "$GW_PID" >/dev/null
check_eq "clean exit" 0 "$STOP_STATUS"
finish
