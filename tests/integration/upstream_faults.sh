#!/usr/bin/env bash
# Hostile upstreams (hostile_upstream.py, one agent per behaviour): what the client gets, and that the daemon
# survives each one. Before the stream (no byte sent to the client yet) a bad answer is a 502 JSON error naming
# the response head: not HTTP at all (an SSH banner, a TLS alert), a bad status line, a head over
# limits.max_header_bytes, 33 interim 100 Continue. Once streaming, the stream ends in-band: an RST in the
# middle of a frame → TEXT_MESSAGE_END (the open message) then RUN_ERROR UPSTREAM_ERROR, and so does an RST
# that reaches the socket together with the last events while the daemon is stopped (SIGSTOP: its
# edge-triggered read sees one report for both, and must still find the reset); a stall →
# RUN_ERROR TIMEOUT (timeouts.idle 1s); one 50 MB frame → RUN_ERROR FRAME_TOO_LARGE with bounded memory.
# After every case: the daemon is alive and answers /healthz (a sanitized build aborts on a memory error:
# that shows here as a dead daemon, its exit status and the report in its log).
. "$AGW_SRCDIR/tests/integration/lib.sh"

SAN_RE='ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|SUMMARY: (Address|Undefined|Leak)Sanitizer'
TOKEN=faults-token-$$
KEY=$(printf %s "$TOKEN" | "$AGW_GATEWAY" hash-token)

python3 "$AGW_SRCDIR/tests/integration/hostile_upstream.py" --port-file "$T/hostile.port" 2>"$T/hostile.log" &
PIDS="$PIDS $!"
wait_port_file "$T/hostile.port" || { cat "$T/hostile.log" >&2; exit 1; }
H=http://127.0.0.1:$(cat "$T/hostile.port")

agent() { printf '"%s": { "upstreams": ["%s/%s"], "retries": 0 }' "$1" "$H" "$1"; }
cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "admin": { "address": "127.0.0.1", "port": 0 },
  "auth": { "keys": [ { "id": "faults", "sha256": "$KEY", "agents": ["*"] } ] },
  "agents": {
    $(agent ok), $(agent ssh), $(agent garbage), $(agent badstatus), $(agent bighead), $(agent interim33),
    $(agent reset-mid-frame), $(agent reset-on-cue), $(agent stall), $(agent frame50mb)
  },
  "timeouts": { "connect": "2s", "first_byte": "3s", "idle": "1s", "heartbeat": "10s" },
  "log": { "level": "info", "access": "$T/access.log" }
}
JSON

GW_N=0
LOGS=""
gw_start() {
    GW_N=$((GW_N + 1))
    rm -f "$T/gw.port"
    GW_LOG="$T/gw.$GW_N.log"
    LOGS="$LOGS $GW_LOG"
    "$AGW_GATEWAY" "${GW_ARGS[@]}" -c "$T/gw.json" --port-file "$T/gw.port" >"$GW_LOG" 2>&1 &
    GW_PID=$!
    PIDS="$PIDS $GW_PID"
    wait_port_file "$T/gw.port" 2 || { cat "$GW_LOG" >&2; exit 1; }
    GW_PORT=$(sed -n 1p "$T/gw.port")
    ADMIN_PORT=$(sed -n 2p "$T/gw.port")
}
# gw_alive CASE: the daemon survived CASE: alive, /healthz 200, no sanitizer report so far. If it died, that
# fails with its exit status and its report, and a new daemon is started for the next cases.
gw_alive() {
    local st rc log=$GW_LOG
    st=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$GW_PORT/healthz" 2>/dev/null)
    CHECKS=$((CHECKS + 1))
    if kill -0 "$GW_PID" 2>/dev/null && [ "$st" = 200 ]; then
        ok "$1: the daemon is alive and healthy"
    else
        if kill -0 "$GW_PID" 2>/dev/null; then
            rc="still running"
            kill -9 "$GW_PID" 2>/dev/null
        else
            wait "$GW_PID" 2>/dev/null
            rc="exit status $?"
        fi
        fail "$1: the daemon died or is unhealthy (healthz '$st', $rc)"
        grep -E -A 4 "$SAN_RE" "$log" | head -n 6 >&2
        gw_start
    fi
    check_eq "$1: no sanitizer report in the daemon's log" 0 "$(grep -cE "$SAN_RE" "$log")"
}
gw_start

BODY='{"threadId":"t-faults","runId":"r-faults","messages":[{"id":"m1","role":"user","content":"Hello"}]}'
# run AGENT: POSTs BODY (bounded), headers in $T/AGENT.h, body in $T/AGENT.s; sets STATUS, TYPES, LASTLINE.
run() {
    curl -sS -N -m 20 -D "$T/$1.h" -o "$T/$1.s" -H 'Content-Type: application/json' \
        -H "Authorization: Bearer $TOKEN" -d "$BODY" "http://127.0.0.1:$GW_PORT/v1/ag-ui/agents/$1/runs" \
        2>"$T/$1.err"
    echo $? >"$T/$1.rc"
    run_read "$1"
}
# run_read AGENT: STATUS, TYPES and LASTLINE from what run() kept (for a run() in the background).
run_read() {
    STATUS=$(head -n1 "$T/$1.h" 2>/dev/null | cut -d' ' -f2)
    TYPES=$(grep -o '"type":"[A-Z_]*"' "$T/$1.s" 2>/dev/null | cut -d'"' -f4 | tr '\n' ' ' | sed 's/ $//')
    LASTLINE=$(grep -v '^$' "$T/$1.s" 2>/dev/null | tail -n1)
}
lc() { printf %s "$1" | tr '[:upper:]' '[:lower:]'; }
# bad_head AGENT PHRASE: the upstream's answer is refused before the stream: 502, JSON error naming PHRASE.
bad_head() {
    run "$1"
    check_eq "$1: 502" 502 "$STATUS"
    check_contains "$1: a JSON error" "Content-Type: application/json" "$(cat "$T/$1.h" 2>/dev/null)"
    CHECKS=$((CHECKS + 1))
    case "$(lc "$(cat "$T/$1.s" 2>/dev/null)")" in
    '{"error":"'*"$(lc "$2")"*) ok "$1: the error names '$2'" ;;
    *) fail "$1: the error should name '$2', got '$(head -c 300 "$T/$1.s" 2>/dev/null)'" ;;
    esac
    gw_alive "$1"
}

run ok
check_eq "ok: a sane upstream is relayed (the mock works)" "200 RUN_STARTED RUN_FINISHED" "$STATUS $TYPES"

# ---- before the stream: 502 ----
bad_head ssh "malformed response head"
bad_head garbage "malformed response head"
bad_head badstatus "malformed response head"
bad_head bighead "response head too large"
bad_head interim33 "malformed response head"

# ---- in the stream: RUN_ERROR in-band ----
run reset-mid-frame
check_eq "reset-mid-frame: 200 (the stream had begun)" 200 "$STATUS"
check_eq "reset-mid-frame: the open message is closed, then RUN_ERROR" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_ERROR" "$TYPES"
check_contains "reset-mid-frame: TEXT_MESSAGE_END names the open message" '"messageId":"m-reset"' \
    "$(grep '"type":"TEXT_MESSAGE_END"' "$T/reset-mid-frame.s")"
check_contains "reset-mid-frame: RUN_ERROR code UPSTREAM_ERROR, last" '"code":"UPSTREAM_ERROR"' "$LASTLINE"
check_not_contains "reset-mid-frame: the half frame is never relayed" 'm-re"' "$(cat "$T/reset-mid-frame.s")"
check_eq "reset-mid-frame: the client's body ends cleanly" 0 "$(cat "$T/reset-mid-frame.rc")"
gw_alive reset-mid-frame

# The last events and the reset arrive while the daemon is stopped: one readiness report carries both. The
# events are relayed, the reset is found (a read after the socket was quiet for 100 ms), and the run ends
# with UPSTREAM_ERROR well before timeouts.idle (1 s) would end it with TIMEOUT.
rm -f "$T/cue"
run reset-on-cue &
bg=$!
wait_grep "$T/reset-on-cue.s" '"delta":"Hel"' 10
kill -STOP "$GW_PID"
touch "$T/cue"
wait_grep "$T/hostile.log" "reset on cue" 10
sleep 0.2
kill -CONT "$GW_PID"
wait "$bg"
run_read reset-on-cue
check_eq "reset-on-cue: the events that came with the reset are relayed, then RUN_ERROR" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_ERROR" \
    "$TYPES"
check_contains "reset-on-cue: RUN_ERROR code UPSTREAM_ERROR (not TIMEOUT), last" '"code":"UPSTREAM_ERROR"' "$LASTLINE"
gw_alive reset-on-cue

start=$(date +%s%N)
run stall
elapsed=$((($(date +%s%N) - start) / 1000000))
check_eq "stall: RUN_STARTED, then RUN_ERROR" "RUN_STARTED RUN_ERROR" "$TYPES"
check_contains "stall: RUN_ERROR code TIMEOUT, last" '"code":"TIMEOUT"' "$LASTLINE"
CHECKS=$((CHECKS + 1))
if [ "$elapsed" -lt 5000 ]; then ok "stall: ended by timeouts.idle (1 s) ($elapsed ms)"; else fail "stall: took $elapsed ms"; fi
gw_alive stall

rss() { awk '/^VmRSS/ { print $2 }' /proc/"$1"/status 2>/dev/null || echo 0; }
rss0=$(rss "$GW_PID")
run frame50mb &
bg=$!
peak=$rss0
while kill -0 "$bg" 2>/dev/null; do
    r=$(rss "$GW_PID")
    [ "$r" -gt "$peak" ] && peak=$r
    sleep 0.05
done
wait "$bg"
# (run ran in a subshell: read its results from the files)
TYPES=$(grep -o '"type":"[A-Z_]*"' "$T/frame50mb.s" | cut -d'"' -f4 | tr '\n' ' ' | sed 's/ $//')
LASTLINE=$(grep -v '^$' "$T/frame50mb.s" | tail -n1)
check_eq "frame50mb: the open message is closed, then RUN_ERROR" \
    "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_END RUN_ERROR" "$TYPES"
check_contains "frame50mb: RUN_ERROR code FRAME_TOO_LARGE, last" '"code":"FRAME_TOO_LARGE"' "$LASTLINE"
CHECKS=$((CHECKS + 1))
size=$(wc -c <"$T/frame50mb.s")
if [ "$size" -lt 65536 ]; then ok "frame50mb: the big frame never reached the client ($size bytes)"; else
    fail "frame50mb: the client got $size bytes"; fi
if [ -z "${AGW_SANITIZED:-}" ]; then # (sanitized builds keep freed memory in quarantine)
    CHECKS=$((CHECKS + 1))
    grew=$((peak - rss0))
    # limits.max_frame_bytes (1 MiB) plus a few MB.
    if [ "$grew" -lt 8192 ]; then ok "frame50mb: RSS bounded (+$grew KiB)"; else fail "frame50mb: RSS grew by $grew KiB"; fi
fi
gw_alive frame50mb

stop_pid "$GW_PID" >/dev/null
check_eq "SIGTERM exits 0" 0 "$STOP_STATUS"
for log in $LOGS; do
    check_eq "no sanitizer report in $(basename "$log")" 0 "$(grep -cE "$SAN_RE" "$log")"
done
finish
