#!/usr/bin/env bash
# Passive health: a backend that fails before the first byte is marked down for its agent's fail_timeout and
# tried after the others meanwhile; once that passed it is tried again, and it is back as soon as it answers.
# max_fails counts failures within fail_timeout; 0 never marks. The event loops share the view, and a reload
# keeps it; the runs of a phase go over one connection, one after the other, so that the round robin's turns
# are known.
. "$AGW_SRCDIR/tests/integration/lib.sh"

start_demo demo || exit 1
GOOD=http://127.0.0.1:$DEMO_PORT/agent
# A port nothing listens on (taken and let go), where another demo agent starts later.
LATE=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DEAD=http://127.0.0.1:$LATE/agent
cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "mode": "none" },
  "agents": {
    "one": { "upstreams": ["$DEAD", "$GOOD"], "balance": "round_robin", "fail_timeout": "2s" },
    "three": { "upstreams": ["$DEAD", "$GOOD"], "balance": "round_robin", "max_fails": 3, "fail_timeout": "1h" },
    "never": { "upstreams": ["$DEAD", "$GOOD"], "balance": "round_robin", "max_fails": 0 }
  },
  "history": { "enabled": false }
}
JSON
start_gateway "$T/gw.json" || exit 1
BODY='{"threadId":"t1","runId":"r1","messages":[{"id":"m1","role":"user","content":"hi"}]}'

# runs AGENT N: N runs of AGENT over one connection; sets CODES (the statuses) and CONNS (connections made).
runs() {
    local args=() i
    for i in $(seq "$2"); do
        [ "$i" -gt 1 ] && args+=(--next)
        args+=(-sS -m 10 -o /dev/null -w '%{http_code} %{num_connects}\n' -H 'Content-Type: application/json'
            -d "$BODY" "http://127.0.0.1:$GW_PORT/v1/ag-ui/agents/$1/runs")
    done
    curl "${args[@]}" >"$T/runs.out" 2>"$T/curl.err"
    CODES=$(awk '{print $1}' "$T/runs.out" | sort | uniq -c | awk '{print $2 "x" $1}' | tr '\n' ' ')
    CONNS=$(awk '{s += $2} END {print s}' "$T/runs.out")
}
# failures: connect failures logged so far against the dead backend.
failures() { grep -c "upstream 127.0.0.1:$LATE: connect" "$GW_LOG"; }

runs one 6
check_eq "one: six runs over one connection" 1 "$CONNS"
check_eq "one: every run answered (the dead backend's on the other)" "200x6 " "$CODES"
check_eq "one: the dead backend tried once, then not while it is down" 1 "$(failures)"
check_eq "one: marked down, logged once" 1 "$(grep -c "agent one: backend 127.0.0.1:$LATE marked down for 2000 ms" "$GW_LOG")"
check_eq "counted" 1 "$(metric agw_upstream_marked_down_total)"

before=$(failures)
runs three 12
check_eq "three: every run answered" "200x12 " "$CODES"
check_eq "three: three failures within fail_timeout mark it, then it is left alone" 3 $(($(failures) - before))
check_eq "three: counted" 2 "$(metric agw_upstream_marked_down_total)"

# A reload (SIGHUP) keeps what the loops know of each backend (same agent, same URL): the backend marked
# down for an hour is not tried again because the configuration was read again.
kill -HUP "$GW_PID"
for _ in $(seq 100); do grep -q "configuration 2 in force" "$GW_LOG" && break; sleep 0.1; done
check_contains "reloaded" "configuration 2 in force" "$(cat "$GW_LOG")"
before=$(failures)
runs three 6
check_eq "three, after the reload: every run answered" "200x6 " "$CODES"
check_eq "three, after the reload: still down, not tried" 0 $(($(failures) - before))

before=$(failures)
runs never 6
check_eq "never: every run answered" "200x6 " "$CODES"
check_eq "never (max_fails 0): tried on every turn of the round robin" 3 $(($(failures) - before))
check_eq "never: not counted" 2 "$(metric agw_upstream_marked_down_total)"

# The backend comes up; once fail_timeout passed, the next run on its turn reaches it, and it is back.
"$AGW_DEMO" --listen "127.0.0.1:$LATE" --port-file "$T/late.port" >"$T/late.log" 2>&1 &
PIDS="$PIDS $!"
wait_port_file "$T/late.port" || exit 1
sleep 2.2
runs one 4
check_eq "one, later: every run answered" "200x4 " "$CODES"
check_contains "one: back once it answers" "agent one: backend 127.0.0.1:$LATE answers again" "$(cat "$GW_LOG")"
check_contains "… the runs reached it" "POST /agent" "$(cat "$T/late.log")"

stop_pid "$GW_PID" >/dev/null
check_eq "clean exit" 0 "$STOP_STATUS"
finish
