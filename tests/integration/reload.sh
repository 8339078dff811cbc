#!/usr/bin/env bash
# SIGHUP reloads the whole configuration atomically, while a stream runs: a key added and one revoked, an
# agent's upstream changed, an agent added, limits, timeouts and CORS changed; the run in flight keeps the
# settings it started with (its backend, no run timeout) and ends whole; a broken file, a file with an
# unknown key and a change only a restart applies are refused with the reason in the log, and the
# configuration in force stays. SIGUSR1 reopens the access log file (logrotate's convention) without losing
# a line.
. "$AGW_SRCDIR/tests/integration/lib.sh"

start_demo one || exit 1
D1=http://127.0.0.1:$DEMO_PORT
start_demo two || exit 1
D2=http://127.0.0.1:$DEMO_PORT
h() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
# config FILE KEYS DEMO_URL EXTRA_AGENTS ORIGIN MAX_BODY RUN_TIMEOUT
config() {
    cat >"$1" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [ $2 ] },
  "agents": { "demo": { "upstreams": ["$3/agent"] }, "slow": { "upstreams": ["$3/agent?events=60&delay_ms=100"] } $4 },
  "cors": { "allowed_origins": ["$5"] },
  "limits": { "max_body_bytes": $6 },
  "timeouts": { "run": "$7", "drain": "2s" },
  "store": { "kind": "memory" },
  "log": { "access": "$T/access.log" }
}
JSON
}
KEEP='{ "id": "keep", "sha256": "'$(h keep-token)'", "agents": ["*"] }'
OLD='{ "id": "old", "sha256": "'$(h old-token)'", "agents": ["*"] }'
NEW='{ "id": "new", "sha256": "'$(h new-token)'", "agents": ["*"] }'
config "$T/gw.json" "$KEEP, $OLD" "$D1" "" "http://a.test" 4096 0
start_gateway "$T/gw.json" || exit 1
U=http://127.0.0.1:$GW_PORT/v1/ag-ui/agents
J='Content-Type: application/json'
RUN='{"threadId":"t1","runId":"r1","messages":[{"id":"m1","role":"user","content":"hi"}]}'
BIG='{"threadId":"t1","runId":"r1","messages":[{"id":"m1","role":"user","content":"'$(printf '%0200d' 0)'"}]}'
run() { # run TOKEN AGENT [BODY]: prints the status
    curl -sS -m 10 -o "$T/out" -w '%{http_code}' -H "$J" -H "Authorization: Bearer $1" -d "${3:-$RUN}" "$U/$2/runs"
}
requests() { curl -s -m 5 "$1/_demo/stats" | grep -o '"requests":[0-9]*' | cut -d: -f2; }
preflight() {
    curl -sS -m 10 -o /dev/null -w '%{http_code}' -X OPTIONS -H "Origin: $1" \
        -H 'Access-Control-Request-Method: POST' "$U/demo/runs"
}
# hup TEXT: SIGHUP, then up to 10 s for TEXT in the log (counted from the signal on).
hup() {
    local before
    before=$(wc -l <"$GW_LOG")
    kill -HUP "$GW_PID"
    for _ in $(seq 100); do
        tail -n +"$((before + 1))" "$GW_LOG" | grep -qF "$1" && return 0
        sleep 0.1
    done
    return 1
}

check_eq "before: the old key works" 200 "$(run old-token demo)"
check_eq "before: the new key is unknown" 401 "$(run new-token demo)"
check_eq "before: a 200-byte body is within max_body_bytes" 200 "$(run keep-token demo "$BIG")"
check_eq "before: origin a.test may call" 204 "$(preflight http://a.test)"
check_eq "before: demo's runs go to backend one" "2 0" "$(requests "$D1") $(requests "$D2")"

# A stream that runs across every reload below (6 s).
curl -sS -N -m 30 -o "$T/slow.s" -H "$J" -H 'Authorization: Bearer keep-token' -d "$RUN" "$U/slow/runs" &
SLOW=$!
wait_grep "$T/slow.s" TEXT_MESSAGE_CONTENT || fail "the long stream did not start"

# 1. The new configuration: key "old" revoked and "new" added, demo and slow moved to backend two, an agent
# added, a smaller body limit, a run timeout, another CORS origin.
config "$T/gw.json" "$KEEP, $NEW" "$D2" ', "extra": { "upstreams": ["'"$D1"'/agent"] }' "http://b.test" 100 1s
hup "configuration 2 in force" || fail "the reload was not logged"
check_eq "after: the revoked key is refused" 401 "$(run old-token demo)"
check_eq "after: the added key works" 200 "$(run new-token demo)"
check_eq "after: the kept key still works" 200 "$(run keep-token demo)"
check_eq "after: demo's new runs go to backend two" 2 "$(requests "$D2")"
check_eq "after: the added agent serves" 200 "$(run keep-token extra)"
check_eq "after: the new body limit applies to new requests" 413 "$(run keep-token demo "$BIG")"
check_eq "after: origin a.test is no longer allowed" 403 "$(preflight http://a.test)"
check_eq "after: origin b.test is" 204 "$(preflight http://b.test)"
run keep-token slow >/dev/null
check_contains "after: a new run gets the new run timeout" '"code":"TIMEOUT"' "$(cat "$T/out")"

# 2. Refused files: the configuration in force stays.
printf '{ "listen": [ ' >"$T/gw.json"
hup "refused, the current configuration stays: invalid JSON" || fail "a broken file was not refused in the log"
config "$T/gw.json" "$KEEP, $OLD" "$D1" ', "bogus": 1' "http://a.test" 4096 0
hup "refused, the current configuration stays: agents.bogus: expects an object" || fail "an invalid agent was not refused in the log"
config "$T/gw.json" "$KEEP, $OLD" "$D1" "" "http://a.test" 4096 0
sed -i 's/"port": 0/"port": 1/' "$T/gw.json"
hup "refused, the current configuration stays: listen[0] changed, and only a restart applies that" ||
    fail "a listener change was not refused in the log"
check_eq "refused files changed nothing: the revoked key stays revoked" 401 "$(run old-token demo)"
check_eq "and the added key stays" 200 "$(run new-token demo)"
check_eq "and the body limit" 413 "$(run keep-token demo "$BIG")"

# 3. The stream that started under the first configuration ends whole on its backend, with no run timeout.
wait_done "$SLOW" || { sleep 10; wait_done "$SLOW"; } || fail "the long stream did not end"
check_eq "the run in flight got all its events" 60 "$(grep -c '"type":"TEXT_MESSAGE_CONTENT"' "$T/slow.s")"
check_contains "and ended with RUN_FINISHED (its settings: no run timeout)" '"type":"RUN_FINISHED"' "$(tail -n 2 "$T/slow.s")"
check_not_contains "no error" RUN_ERROR "$(cat "$T/slow.s")"

# 4. SIGUSR1: logrotate moves the file, then signals; lines go to the new file, none is lost.
curl -s -m 5 -o /dev/null -H 'X-Request-Id: before-rotate' "http://127.0.0.1:$GW_PORT/rotate-probe"
mv "$T/access.log" "$T/access.log.1"
curl -s -m 5 -o /dev/null -H 'X-Request-Id: during-rotate' "http://127.0.0.1:$GW_PORT/rotate-probe"
before=$(wc -l <"$GW_LOG")
kill -USR1 "$GW_PID"
for _ in $(seq 100); do tail -n +"$((before + 1))" "$GW_LOG" | grep -q 'SIGUSR1: access log' && break; sleep 0.1; done
check_contains "SIGUSR1 is logged" "SIGUSR1: access log $T/access.log reopened" "$(cat "$GW_LOG")"
curl -s -m 5 -o /dev/null -H 'X-Request-Id: after-rotate' "http://127.0.0.1:$GW_PORT/rotate-probe"
check_contains "a line before the move is in the moved file" '"request_id":"before-rotate"' "$(cat "$T/access.log.1")"
check_contains "a line between the move and the signal too" '"request_id":"during-rotate"' "$(cat "$T/access.log.1")"
check_contains "a line after the signal is in the new file" '"request_id":"after-rotate"' "$(cat "$T/access.log" 2>/dev/null)"
check_not_contains "and only there" after-rotate "$(cat "$T/access.log.1")"

metrics=$(curl -s -m 5 "http://127.0.0.1:$GW_PORT/metrics")
check_contains "one reload counted" "agw_config_reloads_total 1" "$metrics"
check_contains "three refusals counted" "agw_config_reloads_refused_total 3" "$metrics"

stop_pid "$GW_PID" >/dev/null
check_eq "clean exit (no configuration or pool left behind)" 0 "$STOP_STATUS"
check_not_contains "no configuration held at exit" "still held" "$(cat "$GW_LOG")"
finish
