#!/usr/bin/env bash
# Runs tests/interop/upstream_events.mjs: backends' events, well and badly formed
# (tests/interop/upstream_events.json, played by tests/interop/scripted_agent.py), through the real
# gateway into the official @ag-ui/client (npm, pinned by package-lock.json), on 127.0.0.1, bounded in
# time. What the client's schemas would refuse must come as the gateway's RUN_ERROR INVALID_EVENT.
# First, the client's schemas must be those of tests/interop/client_schemas.txt (client_schemas.mjs).
. "$AGW_SRCDIR/tests/integration/lib.sh"

interop_client upstream_events.mjs
interop_client client_schemas.mjs

# the client's schemas are those the gateway's tables were held against (test_schema)
(cd "$CACHE" && FILE="$AGW_SRCDIR/tests/interop/client_schemas.txt" timeout 60 node client_schemas.mjs) || exit 1

cases=$AGW_SRCDIR/tests/interop/upstream_events.json
python3 "$AGW_SRCDIR/tests/interop/scripted_agent.py" "$cases" "$T/agent.port" >"$T/agent.log" 2>&1 &
PIDS="$PIDS $!"
wait_port_file "$T/agent.port" || { cat "$T/agent.log"; exit 1; }
A=http://127.0.0.1:$(head -n1 "$T/agent.port")
agents=$(python3 -c 'import json, sys
print(", ".join("\"%s\": {\"upstreams\": [\"%s/case/%s\"]}" % (c["name"], sys.argv[2], c["name"])
                for c in json.load(open(sys.argv[1]))))' "$cases" "$A")
cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [ { "id": "interop", "sha256": "$(printf %s interop-token | sha256sum | cut -d' ' -f1)", "agents": ["*"] } ] },
  "history": { "enabled": false },
  "agents": { $agents }
}
JSON
start_gateway "$T/gw.json" || exit 1

(cd "$CACHE" && GW="http://127.0.0.1:$GW_PORT/v1/ag-ui" TOKEN=interop-token CASES="$cases" AGENT="$A" \
    timeout 120 node upstream_events.mjs)
st=$?
stop_pid "$GW_PID" >/dev/null
[ "$STOP_STATUS" = 0 ] || { echo "FAIL: the gateway did not exit cleanly ($STOP_STATUS)"; st=1; }
exit $st
