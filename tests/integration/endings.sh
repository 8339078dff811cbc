#!/usr/bin/env bash
# Endings the gateway makes itself close what the backend left open. A run stalled inside a text message (the
# demo agent's stall=1: RUN_STARTED, TEXT_MESSAGE_START, one content, then silence) that is ended by
#   - the cancel endpoint (POST .../runs/{runId}/cancel → 202): TEXT_MESSAGE_END, then RUN_ERROR CANCELLED;
#   - SIGTERM with timeouts.drain 1s: TEXT_MESSAGE_END, then RUN_ERROR SHUTDOWN;
#   - timeouts.run 1s: TEXT_MESSAGE_END, then RUN_ERROR TIMEOUT;
# and in each case nothing after the RUN_ERROR, and a clean end of the chunked body.
. "$AGW_SRCDIR/tests/integration/lib.sh"

TOKEN=endings-token-$$
KEY=$(printf %s "$TOKEN" | "$AGW_GATEWAY" hash-token)
start_demo demo --log-level warn || exit 1
D=http://127.0.0.1:$DEMO_PORT
SAN_RE='ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|SUMMARY: (Address|Undefined|Leak)Sanitizer'

# config FILE RUN_TIMEOUT
config() {
    cat >"$1" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [ { "id": "endings", "sha256": "$KEY", "agents": ["*"] } ] },
  "agents": { "stall": { "upstreams": ["$D/agent?stall=1"] } },
  "timeouts": { "run": "$2", "drain": "1s", "idle": "30s", "heartbeat": "30s" },
  "store": { "path": "$1.store" },
  "log": { "access": "off" }
}
JSON
}
# gateway NAME RUN_TIMEOUT: starts a gateway; sets <NAME>_PORT and <NAME>_PID.
gateway() {
    config "$T/$1.json" "$2"
    "$AGW_GATEWAY" "${GW_ARGS[@]}" -c "$T/$1.json" --port-file "$T/$1.port" >"$T/$1.log" 2>&1 &
    eval "$1_PID=$!"
    PIDS="$PIDS $!"
    wait_port_file "$T/$1.port" || { cat "$T/$1.log" >&2; exit 1; }
    eval "$1_PORT=$(head -n1 "$T/$1.port")"
}
gateway A 0
gateway B 1s

# stream NAME PORT RUN: a stalled run in the background, its stream in $T/NAME.s; sets <NAME>_PID. curl's
# exit status goes to $T/NAME.rc (0: the chunked body ended cleanly).
stream() {
    (
        curl -sS -N -m 20 -o "$T/$1.s" -H 'Content-Type: application/json' -H "Authorization: Bearer $TOKEN" \
            -d "{\"threadId\":\"t-$3\",\"runId\":\"$3\",\"messages\":[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"Hello\"}]}" \
            "http://127.0.0.1:$2/v1/ag-ui/agents/stall/runs" 2>"$T/$1.err"
        echo $? >"$T/$1.rc"
    ) &
    eval "$1_PID=$!"
}
# check_ending NAME CODE: the stream NAME ends with TEXT_MESSAGE_END (of the open message msg_2), then
# RUN_ERROR with CODE, then nothing, and the body ended cleanly.
check_ending() {
    local s="$T/$1.s" types last2 lastline
    types=$(grep -o '"type":"[A-Z_]*"' "$s" | cut -d'"' -f4 | tr '\n' ' ')
    last2=$(printf %s "$types" | awk '{ print $(NF - 1), $NF }')
    check_eq "$1: the stream ends TEXT_MESSAGE_END, RUN_ERROR" "TEXT_MESSAGE_END RUN_ERROR" "$last2"
    check_contains "$1: the TEXT_MESSAGE_END closes the open message" '"messageId":"msg_2"' \
        "$(grep '"type":"TEXT_MESSAGE_END"' "$s" | tail -n1)"
    lastline=$(grep -v '^$' "$s" | tail -n1)
    check_contains "$1: the last line is the RUN_ERROR" 'data: {"type":"RUN_ERROR"' "$lastline"
    check_contains "$1: RUN_ERROR code $2" "\"code\":\"$2\"" "$lastline"
    check_eq "$1: one RUN_ERROR, one TEXT_MESSAGE_END" "1 1" \
        "$(grep -c '"type":"RUN_ERROR"' "$s") $(grep -c '"type":"TEXT_MESSAGE_END"' "$s")"
    check_eq "$1: the chunked body ended cleanly (curl exit 0)" 0 "$(cat "$T/$1.rc" 2>/dev/null)"
}

# ---- 1. cancel ----
stream cancel "$A_PORT" r-cancel
wait_grep "$T/cancel.s" TEXT_MESSAGE_CONTENT || fail "cancel: the stalled run did not start"
http POST "http://127.0.0.1:$A_PORT/v1/ag-ui/agents/stall/runs/r-cancel/cancel" -H "Authorization: Bearer $TOKEN"
check_eq "cancel: 202" 202 "$STATUS"
wait_done "$cancel_PID" || fail "cancel: the cancelled stream did not end"
check_ending cancel CANCELLED

# ---- 2. timeouts.run ----
stream runtimeout "$B_PORT" r-timeout
wait_grep "$T/runtimeout.s" TEXT_MESSAGE_CONTENT || fail "run timeout: the stalled run did not start"
wait_done "$runtimeout_PID" || fail "run timeout: the stream did not end"
check_ending runtimeout TIMEOUT

# ---- 3. SIGTERM with a 1 s drain ----
stream shutdown "$A_PORT" r-shutdown
wait_grep "$T/shutdown.s" TEXT_MESSAGE_CONTENT || fail "shutdown: the stalled run did not start"
stop_pid "$A_PID" >/dev/null
check_eq "shutdown: the daemon exits 0 after the drain" 0 "$STOP_STATUS"
wait_done "$shutdown_PID" || fail "shutdown: the stream did not end"
check_ending shutdown SHUTDOWN

stop_pid "$B_PID" >/dev/null
check_eq "the second daemon exits 0" 0 "$STOP_STATUS"
for g in A B; do
    check_eq "no sanitizer report in $g.log" 0 "$(grep -cE "$SAN_RE" "$T/$g.log")"
done
finish
