#!/usr/bin/env bash
# TLS termination and upstream TLS, with real peers: openssl s_client and curl against the TLS listener
# (versions, ciphers, ALPN, SNI, resumption, mTLS required/optional), a full run over TLS, certificates
# reloaded on SIGHUP under a running stream, and https upstreams verified against the right and a wrong CA
# (a second gateway is the https backend). The client's token never reaches a backend; the configured one does.
. "$AGW_SRCDIR/tests/integration/lib.sh"
command -v openssl >/dev/null || { echo "openssl is required"; exit 1; }

# ---- certificates ---------------------------------------------------------------------------------
cd "$T" || exit 1
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() { # ca NAME
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$1" 2>/dev/null
}
cert() { # cert NAME CA CN SAN USAGE
    key "$1.key"
    openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$3" 2>/dev/null
    printf 'subjectAltName=%s\nextendedKeyUsage=%s\n' "$4" "$5" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" -days 2 \
        -extfile "$1.ext" 2>/dev/null
}
ca ca
ca otherca
cert server ca localhost "DNS:localhost,IP:127.0.0.1" serverAuth
cert other ca other.test "DNS:other.test" serverAuth
cert server2 ca localhost-reloaded "DNS:localhost,IP:127.0.0.1" serverAuth
cert client ca client-1 "DNS:client-1" clientAuth
cert badclient otherca client-2 "DNS:client-2" clientAuth
cp server.pem live.pem
cp server.key live.key
cd - >/dev/null || exit 1

start_demo demo || exit 1
D=http://127.0.0.1:$DEMO_PORT
h() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
export AGW_TEST_BACKEND_TOKEN=backend-secret
cat >"$T/gw.json" <<JSON
{
  "listen": [
    { "address": "127.0.0.1", "port": 0,
      "tls": { "cert": "$T/live.pem", "key": "$T/live.key",
               "certificates": [ { "cert": "$T/other.pem", "key": "$T/other.key" } ] } },
    { "address": "127.0.0.1", "port": 0,
      "tls": { "cert": "$T/server.pem", "key": "$T/server.key", "client_ca": "$T/ca.pem", "verify": "require" } },
    { "address": "127.0.0.1", "port": 0,
      "tls": { "cert": "$T/server.pem", "key": "$T/server.key", "client_ca": "$T/ca.pem", "verify": "optional" } },
    { "address": "127.0.0.1", "port": 0, "tls": { "cert": "$T/other.pem", "key": "$T/other.key" } }
  ],
  "auth": { "keys": [ { "id": "web", "sha256": "$(h web-token)", "agents": ["*"] } ] },
  "agents": {
    "demo": { "upstreams": ["$D/agent"],
              "upstream_headers": { "Authorization": "Bearer \${AGW_TEST_BACKEND_TOKEN}" } },
    "slow": { "upstreams": ["$D/agent?events=30&delay_ms=100"] }
  }
}
JSON
start_gateway "$T/gw.json" || exit 1
wait_port_file "$T/gw.port" 4 || exit 1
P1=$GW_PORT
P2=$(sed -n 2p "$T/gw.port")
P3=$(sed -n 3p "$T/gw.port")
P4=$(sed -n 4p "$T/gw.port")
RUN='{"threadId":"t1","runId":"r1","messages":[{"id":"m1","role":"user","content":"Hello"}]}'

# s_client PORT ARGS...: prints its output (handshake summary); never waits for input.
s_client() {
    local port=$1
    shift
    timeout 10 openssl s_client -connect 127.0.0.1:"$port" -CAfile "$T/ca.pem" "$@" </dev/null 2>&1
}

out=$(s_client "$P1" -tls1_3)
check_contains "TLS 1.3 accepted" "New, TLSv1.3" "$out"
check_contains "TLS 1.3 certificate verifies" "Verify return code: 0 (ok)" "$out"
out=$(s_client "$P1" -tls1_2)
check_contains "TLS 1.2 accepted" "New, TLSv1.2" "$out"
# The client is allowed old versions (security level 0) so that the refusal is the server's.
out=$(s_client "$P1" -tls1_1 -cipher 'DEFAULT:@SECLEVEL=0')
check_not_contains "TLS 1.1 refused" "New, TLSv1" "$out"
check_contains "TLS 1.1 refused by the server" "alert protocol version" "$out"
out=$(s_client "$P1" -tls1 -cipher 'DEFAULT:@SECLEVEL=0')
check_contains "TLS 1.0 refused by the server" "alert protocol version" "$out"
out=$(s_client "$P1" -tls1_2 -cipher 'AES128-SHA')
check_not_contains "non-AEAD cipher refused" "Cipher is AES128-SHA" "$out"
check_contains "non-AEAD cipher: handshake failure" "handshake failure" "$out"
out=$(s_client "$P1" -tls1_2 -cipher 'ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256')
check_contains "AEAD cipher accepted" "Cipher is ECDHE-ECDSA-AES128-GCM-SHA256" "$out"
out=$(s_client "$P1" -alpn h2,http/1.1)
check_contains "ALPN selects http/1.1" "ALPN protocol: http/1.1" "$out"
out=$(s_client "$P1" -alpn h2)
check_contains "ALPN without http/1.1 is refused" "no application protocol" "$out"
out=$(s_client "$P1" -servername other.test)
check_contains "SNI other.test picks its certificate" "subject=CN = other.test" "$out"
out=$(s_client "$P1" -servername localhost)
check_contains "SNI localhost picks the default certificate" "subject=CN = localhost" "$out"
out=$(s_client "$P1" -servername unknown.test)
check_contains "an unknown SNI name gets the default certificate" "subject=CN = localhost" "$out"
s_client "$P1" -tls1_2 -sess_out "$T/sess" >/dev/null
out=$(s_client "$P1" -tls1_2 -sess_in "$T/sess")
check_contains "TLS 1.2 session resumption" "Reused, TLSv1.2" "$out"

# mTLS: required and optional.
out=$(curl -sS -m 10 --cacert "$T/ca.pem" https://localhost:"$P2"/healthz 2>&1)
check_not_contains "mTLS required: no certificate, no answer" '"status":"ok"' "$out"
out=$(curl -sS -m 10 --cacert "$T/ca.pem" --cert "$T/client.pem" --key "$T/client.key" https://localhost:"$P2"/healthz 2>&1)
check_eq "mTLS required: a valid client certificate" '{"status":"ok"}' "$out"
out=$(curl -sS -m 10 --cacert "$T/ca.pem" --cert "$T/badclient.pem" --key "$T/badclient.key" https://localhost:"$P2"/healthz 2>&1)
check_not_contains "mTLS required: a certificate from another CA is refused" '"status":"ok"' "$out"
out=$(curl -sS -m 10 --cacert "$T/ca.pem" https://localhost:"$P3"/healthz 2>&1)
check_eq "mTLS optional: no certificate is fine" '{"status":"ok"}' "$out"
out=$(curl -sS -m 10 --cacert "$T/ca.pem" --cert "$T/badclient.pem" --key "$T/badclient.key" https://localhost:"$P3"/healthz 2>&1)
check_not_contains "mTLS optional: a presented certificate must verify" '"status":"ok"' "$out"

# A full run over TLS; the backend sees the configured credentials, never the client's token.
curl -sS -N -m 20 --cacert "$T/ca.pem" -o "$T/s" -H 'Authorization: Bearer web-token' \
    -H 'Content-Type: application/json' -d "$RUN" https://localhost:"$P1"/v1/ag-ui/agents/demo/runs
check_contains "a run over TLS" '"type":"RUN_FINISHED"' "$(cat "$T/s")"
http GET $D/_demo/last-request
check_contains "the backend gets the agent's configured credentials" '"authorization":"Bearer backend-secret"' "$BODY"
check_not_contains "the backend never sees the client's token" 'web-token' "$BODY"
http POST https://localhost:"$P1"/v1/ag-ui/agents/demo/runs --cacert "$T/ca.pem" -H 'Content-Type: application/json' -d "$RUN"
check_eq "401 over TLS too" 401 "$STATUS"

# One TLS connection served by the gate like a plain one: a run of 3 s (its stream sheds its request's
# start after 0.5 s), then at once a second request on the same connection, answered; then a malformed
# request, refused with 400 and the connection closed after the answer.
out=$(python3 - "$P1" "$T/ca.pem" "$RUN" <<'PY'
import socket, ssl, sys
port, ca, run = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
ctx = ssl.create_default_context(cafile=ca)
s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=20), server_hostname="localhost")
def post(agent):
    return (b"POST /v1/ag-ui/agents/%s/runs HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer web-token\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (agent, len(run)) + run)
def read_until(end):
    buf = b""
    while not buf.endswith(end):
        d = s.recv(65536)
        if not d:
            return buf + b" EOF"
        buf += d
    return buf
first = read_until(b"\r\n0\r\n\r\n") if s.sendall(post(b"slow")) is None else b""
second = read_until(b"\r\n0\r\n\r\n") if s.sendall(post(b"demo")) is None else b""
s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nBad Field\r\n\r\n")
third, end = b"", "closed"
try:
    while True:
        d = s.recv(65536)
        if not d:
            break
        third += d
except (ssl.SSLError, OSError) as e:
    end = type(e).__name__
print("first:", first.count(b"TEXT_MESSAGE_CONTENT"), b"RUN_FINISHED" in first,
      "second:", second.split(b"\r\n")[0].decode(), b"RUN_FINISHED" in second,
      "third:", third.split(b"\r\n")[0].decode(), b"connection: close" in third.lower(), end)
PY
)
check_eq "TLS: a run that shed, the next request on its connection, then a refusal that closes it" \
    "first: 30 True second: HTTP/1.1 200 OK True third: HTTP/1.1 400 Bad Request True closed" "$out"

# SIGHUP: a stream running across the reload completes; a new connection sees the new certificate.
curl -sS -N -m 30 --cacert "$T/ca.pem" -o "$T/slow" -H 'Authorization: Bearer web-token' \
    -H 'Content-Type: application/json' -d "$RUN" https://localhost:"$P1"/v1/ag-ui/agents/slow/runs &
SLOW=$!
sleep 1
cp "$T/server2.pem" "$T/live.pem"
cp "$T/server2.key" "$T/live.key"
kill -HUP "$GW_PID"
sleep 0.5
out=$(s_client "$P1" -servername localhost)
check_contains "after SIGHUP a new connection sees the new certificate" "subject=CN = localhost-reloaded" "$out"
wait "$SLOW"
check_eq "the stream running across SIGHUP completed" 30 "$(grep -c '"type":"TEXT_MESSAGE_CONTENT"' "$T/slow")"
check_contains "and ended cleanly" '"type":"RUN_FINISHED"' "$(tail -n 2 "$T/slow")"
printf 'not a certificate\n' >"$T/live.pem"
kill -HUP "$GW_PID"
sleep 0.5
check_contains "a bad certificate on SIGHUP is refused and logged" "refused, the current configuration stays: listen[0].tls" "$(cat "$GW_LOG")"
out=$(s_client "$P1" -servername localhost)
check_contains "and the previous certificate stays in service" "subject=CN = localhost-reloaded" "$out"

# https upstreams: a second gateway uses the first one's TLS listener as its backend.
cat >"$T/gw2.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "mode": "none" },
  "store": { "kind": "memory" },
  "agents": {
    "good": { "upstreams": ["https://localhost:$P1/v1/ag-ui/agents/demo/runs"], "ca_file": "$T/ca.pem",
              "upstream_headers": { "Authorization": "Bearer web-token" }, "retries": 0 },
    "ip": { "upstreams": ["https://127.0.0.1:$P1/v1/ag-ui/agents/demo/runs"], "ca_file": "$T/ca.pem",
              "upstream_headers": { "Authorization": "Bearer web-token" }, "retries": 0 },
    "wrongca": { "upstreams": ["https://localhost:$P1/v1/ag-ui/agents/demo/runs"], "ca_file": "$T/otherca.pem",
                 "retries": 0 },
    "wrongname": { "upstreams": ["https://localhost:$P4/v1/ag-ui/agents/demo/runs"],
                   "ca_file": "$T/ca.pem", "retries": 0 }
  }
}
JSON
GW1_PID=$GW_PID
GW1_LOG=$GW_LOG
mv "$T/gw.port" "$T/gw1.port"
start_gateway "$T/gw2.json" || exit 1
U=http://127.0.0.1:$GW_PORT/v1/ag-ui/agents
curl -sS -N -m 20 -o "$T/s2" -H 'Content-Type: application/json' -d "$RUN" "$U/good/runs"
check_contains "https upstream verified with the right CA" '"type":"RUN_FINISHED"' "$(cat "$T/s2")"
curl -sS -N -m 20 -o "$T/s3" -H 'Content-Type: application/json' -d "$RUN" "$U/ip/runs"
check_contains "https upstream by IP address (certificate IP SAN)" '"type":"RUN_FINISHED"' "$(cat "$T/s3")"
http POST "$U/wrongca/runs" -H 'Content-Type: application/json' -d "$RUN"
check_eq "https upstream with a wrong CA" 502 "$STATUS"
check_contains "502 says why" "certificate verify failed" "$BODY"
check_contains "and the log says why" "TLS handshake with localhost:$P1 failed: certificate verify failed" "$(cat "$GW_LOG")"
http POST "$U/wrongname/runs" -H 'Content-Type: application/json' -d "$RUN"
check_eq "https upstream whose certificate names another host" 502 "$STATUS"
check_contains "hostname mismatch is named" "hostname mismatch" "$BODY"

stop_pid "$GW_PID" >/dev/null
check_eq "clean exit (upstream TLS)" 0 "$STOP_STATUS"
stop_pid "$GW1_PID" >/dev/null
check_eq "clean exit (TLS listeners)" 0 "$STOP_STATUS"
[ "$STOP_STATUS" = 0 ] || tail -n 30 "$GW1_LOG"
finish
