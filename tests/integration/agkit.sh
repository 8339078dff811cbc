#!/usr/bin/env bash
# The legacy AG-Kit send-message dialect (doc/dialects.md), both ways:
# 1-5. an agent whose backend speaks it ("protocol": "ag-kit"; the demo agent's dialect=ag-kit): the request it
#    gets (conversationId, only the messages it has not seen, tools' parameters as a string, resume), and the
#    AG-UI stream the client gets from its legacy events, for the seed scenarios — basic chat, a server-side
#    tool, a client tool call and its follow-up, an interrupt and its resume — and a legacy backend's error;
# 6-10. a legacy client (POST /v1/ag-kit/agents/{id}/send-message) in front of an AG-UI backend: the legacy
#    event sequences of the seed, its tool result completed from the thread's history, an interrupt from a
#    legacy backend, an error, invalid legacy requests, and the same bearer rules.
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
  "auth": { "keys": [ { "id": "web", "sha256": "$(printf %s web-token | sha256sum | cut -d' ' -f1)", "agents": ["*"] },
                      { "id": "narrow", "sha256": "$(printf %s narrow-token | sha256sum | cut -d' ' -f1)", "agents": ["legacy"] } ] },
  "agents": { "legacy": { "upstreams": ["$D/send-message?dialect=ag-kit"], "protocol": "ag-kit" },
              "broken": { "upstreams": ["$D/send-message?dialect=ag-kit&status=500"], "protocol": "ag-kit", "retries": 0 },
              "modern": { "upstreams": ["$D/agent"] }, "failing": { "upstreams": ["$D/agent?fail=1"] } },
  "store": { "kind": "memory" }
}
JSON
start_gateway "$T/gw.json" 2>/dev/null || exit 1
U=http://127.0.0.1:$GW_PORT/v1/ag-ui/agents
post() { # post AGENT BODY: the answer in $T/s, its status in STATUS
    STATUS=$(curl -sS -m 10 -o "$T/s" -w '%{http_code}' -H 'Content-Type: application/json' -H 'Authorization: Bearer web-token' -d "$2" "$U/$1/runs")
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

# ---- legacy clients ----
L=http://127.0.0.1:$GW_PORT/v1/ag-kit/agents
send() { # send AGENT BODY [TOKEN]: the answer in $T/s, its status in STATUS
    STATUS=$(curl -sS -m 10 -o "$T/s" -w '%{http_code}' -H 'Content-Type: application/json' \
        -H "Authorization: Bearer ${3:-web-token}" -d "$2" "$L/$1/send-message")
}
# legacy: the frames' data, one per line.
legacy() { sed -n 's/^data: //p' "$T/s"; }
ltypes() { legacy | sed -n 's/^{"type":"\([a-z-]*\)".*/\1/p; s/^\[DONE\]$/[DONE]/p' | tr '\n' ' '; }

# 6. Basic chat: text events, then the end.
send modern '{"messages":[{"role":"user","content":"hi"}],"conversationId":"2da2146d-9e7e-41f3-9515-b70557e4430c"}'
check_eq "legacy client chat: 200" 200 "$STATUS"
check_eq "legacy client chat: text events and [DONE]" \
    '{"type":"text","content":"Hello"}|{"type":"text","content":"! How can I help you?"}|[DONE]' "$(legacy | paste -sd'|')"
check_contains "the AG-UI backend got a RunAgentInput for the conversation" \
    '{"context":[],"forwardedProps":{},"messages":[{"content":"hi","id":"' "$(upstream_body)"
check_contains "with the conversation as its thread" '"threadId":"2da2146d-9e7e-41f3-9515-b70557e4430c"' "$(upstream_body)"

# 7. A client tool call, then its result as a delta: the AG-UI backend gets the whole conversation, from the
# thread's history.
CTOOLS='[{"name":"change-background-color","description":"Change the background color","parameters":"{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"type\":\"object\",\"properties\":{\"color\":{\"type\":\"string\"}},\"required\":[\"color\"],\"additionalProperties\":false}"}]'
send modern '{"messages":[{"role":"user","content":"Use change-background-color to make it blue"}],"tools":'"$CTOOLS"',"conversationId":"c7d334f7"}'
check_eq "legacy client tool: tool-call-start|args|end and [DONE]" "tool-call-start tool-call-args tool-call-end [DONE] " "$(ltypes)"
check_contains "legacy client tool: the AG-UI backend got the parameters as a schema object" \
    '"parameters":{"$schema":"https://json-schema.org/draft/2020-12/schema","additionalProperties":false' "$(upstream_body)"
lcall=$(legacy | sed -n 's/.*"tool-call-start","toolCallId":"\([^"]*\)".*/\1/p')
send modern '{"messages":[{"role":"tool","content":"Background color successfully changed to: blue","toolCallId":"'"$lcall"'"}],"conversationId":"c7d334f7"}'
check_eq "legacy client tool result: text events and [DONE]" "text [DONE] " "$(ltypes)"
body=$(upstream_body)
check_contains "the backend got the user's message from the history" '"content":"Use change-background-color to make it blue"' "$body"
check_contains "and the assistant's tool call" '"name":"change-background-color"},"id":"'"$lcall"'","type":"function"}]}' "$body"
check_contains "and the result, last" '"content":"Background color successfully changed to: blue","id":"' "$body"

# 8. A server-side tool: text, tool-call-*, tool-result, text.
send modern '{"messages":[{"role":"user","content":"What is the weather in Paris?"}],"conversationId":"w1"}'
check_eq "legacy client server tool: the seed's sequence" "text tool-call-start tool-call-args tool-call-end tool-result text [DONE] " "$(ltypes)"
check_contains "with the result" '{"type":"tool-result","toolCallId":"call_001","result":"{\"city\":\"Paris\",\"condition\":\"Sunny\",\"temperature\":25,\"unit\":\"C\"}"}' "$(legacy)"

# 9. A legacy client in front of a legacy backend: an interrupt crosses both translations; resume answers it.
send legacy '{"messages":[{"role":"user","content":"Please delete the temporary files"}],"tools":[{"name":"confirmAction","description":"confirm","parameters":"{\"type\":\"object\"}"}],"conversationId":"i1"}'
check_eq "legacy to legacy: text, interrupt, [DONE]" "text interrupt [DONE] " "$(ltypes)"
check_contains "the interrupt as the backend wrote it" '{"type":"interrupt","id":"call_003","reason":"confirm","payload":{"action":"delete temporary files","count":15}}' "$(legacy)"
send legacy '{"messages":[],"resume":{"interruptId":"call_003","payload":{"approved":true}},"conversationId":"i1"}'
check_eq "resume: the run goes on" "text [DONE] " "$(ltypes)"
check_contains "resume reached the backend" '"resume":{"interruptId":"call_003","payload":{"approved":true}}' "$(upstream_body)"

# 10. Errors: a failed run, invalid legacy requests, the bearer rules.
send failing '{"messages":[{"role":"user","content":"hi"}]}'
check_eq "a run that fails: its text, then an error event and no [DONE]" "text text error " "$(ltypes)"
check_contains "the error names its code" '"code":"MODEL_ERROR"' "$(legacy)"
send modern '{"messages":[{"role":"robot","content":"hi"}]}'
check_eq "a bad role: 400" 400 "$STATUS"
check_eq "naming it" '{"error":"bad request: messages[0].role must be one of user, tool, system, developer, assistant"}' "$(cat "$T/s")"
send modern '{"messages":[{"role":"tool","content":"x"}]}'
check_contains "a tool message without toolCallId: 400" "messages[0].toolCallId is required" "$(cat "$T/s")"
send modern '{"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"t","parameters":"{not json"}]}'
check_contains "parameters that are not a schema: 400" "tools[0].parameters must be a JSON Schema object" "$(cat "$T/s")"
send modern '{"messages":[{"role":"user","content":"hi"}],"conversationId":""}'
check_eq "an empty conversationId: 400" 400 "$STATUS"
send modern '{"messages":[]}'
check_contains "nothing to send: 400" "messages must not be empty" "$(cat "$T/s")"
send modern '{"messages":[{"role":"user","content":"hi"}]}' wrong-token
check_eq "an unknown token: 401" 401 "$STATUS"
send modern '{"messages":[{"role":"user","content":"hi"}]}' narrow-token
check_eq "a key kept from the agent: 403" 403 "$STATUS"
send nope '{"messages":[{"role":"user","content":"hi"}]}'
check_eq "an unknown agent: 404" 404 "$STATUS"

stop_pid "$GW_PID" >/dev/null
check_eq "clean exit" 0 "$STOP_STATUS"
finish
