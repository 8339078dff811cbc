#!/usr/bin/env bash
# Runs tests/interop/interop.mjs: the official @ag-ui/client (npm, pinned by package-lock.json) against the
# real gateway (plain and TLS listeners) in front of the real demo agent, on 127.0.0.1, bounded in time.
. "$AGW_SRCDIR/tests/integration/lib.sh"

interop_client interop.mjs

# A CA and a certificate for the TLS listener.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$T/ca.key" 2>/dev/null
openssl req -x509 -new -key "$T/ca.key" -out "$T/ca.pem" -days 2 -subj /CN=interop-ca 2>/dev/null
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$T/key.pem" 2>/dev/null
openssl req -new -key "$T/key.pem" -out "$T/req.csr" -subj /CN=localhost 2>/dev/null
printf 'subjectAltName=DNS:localhost\n' >"$T/ext"
openssl x509 -req -in "$T/req.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial -out "$T/cert.pem" \
    -days 2 -extfile "$T/ext" 2>/dev/null

start_demo demo || exit 1
D=http://127.0.0.1:$DEMO_PORT
agent() { printf '"%s": { "upstreams": ["%s/agent%s"] }' "$1" "$D" "$2"; }
cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 },
              { "address": "127.0.0.1", "port": 0, "tls": { "cert": "$T/cert.pem", "key": "$T/key.pem" } } ],
  "auth": { "keys": [ { "id": "interop", "sha256": "$(printf %s interop-token | sha256sum | cut -d' ' -f1)", "agents": ["*"] } ] },
  "agents": {
    $(agent demo ""), $(agent bytewise "?bytewise=1"), $(agent crlf "?crlf=1&comments=1"),
    $(agent bare "?lifecycle=none&done=1"), $(agent multiline "?multiline=1"),
    $(agent cloudbase "?dialect=cloudbase&fail=1"), $(agent drop "?drop_after=4"),
    $(agent hitl "?wait_decision=1"), $(agent reasoning "?reasoning=1"),
    $(agent activity "?activity=1&reasoning=1&metadata=1"), $(agent subagent "?subagent=1"), $(agent hitlstream "?wait_decision=1&decision=stream"),
    $(agent hitlempty "?wait_decision=1&decision=empty"), $(agent hitlrefuse "?wait_decision=1&decision=refuse"),
    "legacy": { "upstreams": ["$D/send-message?dialect=ag-kit"], "protocol": "ag-kit" }
  }
}
JSON
start_gateway "$T/gw.json" || exit 1
wait_port_file "$T/gw.port" 2 || exit 1
TLS_PORT=$(sed -n 2p "$T/gw.port")

(cd "$CACHE" && GW="http://127.0.0.1:$GW_PORT/v1/ag-ui" GWTLS="https://localhost:$TLS_PORT/v1/ag-ui" DEMO="$D" \
    TOKEN=interop-token NODE_EXTRA_CA_CERTS="$T/ca.pem" timeout 120 node interop.mjs)
st=$?
stop_pid "$GW_PID" >/dev/null
[ "$STOP_STATUS" = 0 ] || { echo "FAIL: the gateway did not exit cleanly ($STOP_STATUS)"; st=1; }
exit $st
