#!/usr/bin/env bash
# A backend that writes a response's events one write() each, microseconds apart (as the demo agent
# with write_each does, and agents that answer at once), is read in a burst: the read that finds
# the socket readable again within the loop's batching window of the last is held back for the
# loop's nap, and takes the rest of the burst at once (src/upstream.c, burst(); src/loop.c,
# agw_loop_hold()). Checked here by its counter, agw_event_loop_holds_total, not by a timing:
# - short bursting runs are held (some holds over 300 runs; none at all is the failure);
# - only a response's first reads are: a long bursting response (3,000 events, each its own write)
#   is held at most BURST_READS - 1 = 7 times, however its reads come;
# - a run relayed with holds is the same bytes as without (a gateway with batch_window_us 0, which
#   holds nothing: its counter stays 0);
# - a head that comes alone does not start a burst: a backend that writes its head, then RUN_STARTED
#   30 µs later in a write of its own, then nothing for 50 ms (hostile_upstream.py /head-alone) has
#   RUN_STARTED read at once (no hold over 20 runs; when the two writes reach the gateway in one read,
#   there is nothing to hold either way, so this can only fail when the rule is broken).
. "$AGW_SRCDIR/tests/integration/lib.sh"

start_demo demo || exit 1
python3 "$AGW_SRCDIR/tests/integration/hostile_upstream.py" --port-file "$T/hostile.port" 2>"$T/hostile.log" &
PIDS="$PIDS $!"
wait_port_file "$T/hostile.port" || exit 1
HOSTILE=http://127.0.0.1:$(head -n1 "$T/hostile.port")
LOAD=$AGW_BUILDDIR/bench/agw-load
D=http://127.0.0.1:$DEMO_PORT/agent
config() { # config WINDOW_US
    cat <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [ { "id": "k", "sha256": "$(printf %s burst-token | sha256sum | cut -d' ' -f1)", "agents": ["*"] } ] },
  "log": { "level": "warn", "access": "off" },
  "history": { "enabled": false },
  "batch_window_us": $1,
  "agents": { "short": { "upstreams": ["$D?events=10&size=100&write_each=1"] },
              "long": { "upstreams": ["$D?events=3000&size=100&write_each=1"] },
              "same": { "upstreams": ["$D?events=200&size=50&write_each=1&ids=run"] },
              "lone": { "upstreams": ["$HOSTILE/head-alone"] } }
}
JSON
}
AUTH="Authorization: Bearer burst-token"
BODY='{"threadId":"t","runId":"r","messages":[{"id":"m1","role":"user","content":"hi"}]}'
runs() { # runs AGENT N CONCURRENCY: N runs through agw-load, all of which must succeed
    "$LOAD" --url "http://127.0.0.1:$GW_PORT/v1/ag-ui/agents/$1/runs" --header "$AUTH" \
        --concurrency "$3" --runs "$2" --duration 60 >"$T/load.json" 2>"$T/load.err"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["runs_ok"], d["runs_failed"])' \
        "$T/load.json" 2>/dev/null
}
holds() { metric agw_event_loop_holds_total; }

config 100 >"$T/gw.json"
start_gateway "$T/gw.json" || exit 1
check_eq "the counter is there, at 0" 0 "$(holds)"
check_eq "300 short bursting runs relayed" "300 0" "$(runs short 300 10)"
h1=$(holds)
check_eq "short bursting runs were held (holds: $h1)" yes "$([ "${h1:-0}" -gt 0 ] && echo yes || echo no)"
check_eq "10 long bursting runs relayed" "10 0" "$(runs long 10 5)"
h2=$(holds)
check_eq "a long burst is held only in its first reads (holds: $((h2 - h1)) over 10 runs, at most 70)" yes \
    "$([ $((h2 - h1)) -le 70 ] && echo yes || echo no)"
curl -sS -m 20 -N -H "$AUTH" -H 'Content-Type: application/json' -d "$BODY" \
    "http://127.0.0.1:$GW_PORT/v1/ag-ui/agents/same/runs" >"$T/held.sse"
h3=$(holds)
finished=0
for i in $(seq 20); do
    curl -sS -m 10 -N -H "$AUTH" -H 'Content-Type: application/json' -d "$BODY" \
        "http://127.0.0.1:$GW_PORT/v1/ag-ui/agents/lone/runs" | grep -q RUN_FINISHED && finished=$((finished + 1))
done
check_eq "20 runs whose head came alone, each to its end" 20 "$finished"
check_eq "an event just after a head that came alone is not held" 0 "$(($(holds) - h3))"
stop_pid "$GW_PID" >/dev/null

config 0 >"$T/gw0.json"
start_gateway "$T/gw0.json" || exit 1
curl -sS -m 20 -N -H "$AUTH" -H 'Content-Type: application/json' -d "$BODY" \
    "http://127.0.0.1:$GW_PORT/v1/ag-ui/agents/same/runs" >"$T/plain.sse"
check_eq "200 short bursting runs relayed without a window" "200 0" "$(runs short 200 10)"
check_eq "without a window nothing is held" 0 "$(holds)"
check_eq "a run relayed with holds is the same bytes as without ($(wc -c <"$T/held.sse") bytes)" same \
    "$(cmp -s "$T/held.sse" "$T/plain.sse" && [ -s "$T/held.sse" ] && echo same || echo different)"
check_contains "the run reached its end" "RUN_FINISHED" "$(tail -c 300 "$T/plain.sse")"
stop_pid "$GW_PID" >/dev/null
finish
