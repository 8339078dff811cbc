#!/usr/bin/env bash
# CORS (doc/protocol.md#cors): a preflight from an allowed origin answered by the gateway itself (no token,
# no backend), a disallowed origin's preflight 403 without any CORS field, the method and header checks, the
# CORS fields on every answer to an allowed origin (a stream, 401, 404, 502, the HTTP edge's refusals) and on
# none to another origin, and a gateway without a "cors" object refusing every preflight.
. "$AGW_SRCDIR/tests/integration/lib.sh"

start_demo demo || exit 1
D=http://127.0.0.1:$DEMO_PORT
cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [ { "id": "web", "sha256": "$(printf %s web-token | sha256sum | cut -d' ' -f1)", "agents": ["*"] } ] },
  "agents": { "demo": { "upstreams": ["$D/agent"] }, "dead": { "upstreams": ["http://127.0.0.1:9/agent"], "retries": 0 } },
  "cors": { "allowed_origins": ["http://app.test:3000", "http://127.0.0.1:5173"], "max_age": "5m",
            "exposed_headers": ["X-Request-Id"] },
  "store": { "kind": "memory" },
  "limits": { "max_body_bytes": 2048 }
}
JSON
start_gateway "$T/gw.json" || exit 1
U=http://127.0.0.1:$GW_PORT/v1/ag-ui/agents
APP='Origin: http://app.test:3000'
RUN='{"threadId":"t1","runId":"r1","messages":[{"id":"m1","role":"user","content":"hi"}]}'
stat() { curl -s -m 5 "$D/_demo/stats" | grep -o "\"$1\":[0-9]*" | cut -d: -f2; }
# heads METHOD URL [curl args]: the answer's status line and header fields in $T/h, the body in $T/b.
heads() {
    local m=$1 u=$2
    shift 2
    curl -sS -m 10 -D "$T/h" -o "$T/b" -X "$m" "$u" "$@" 2>"$T/curl.err" || true
    tr -d '\r' <"$T/h" >"$T/h.txt"
    H=$(cat "$T/h.txt")
    STATUS=$(head -n1 "$T/h.txt" | cut -d' ' -f2)
}

# 1. The preflight a browser sends before POSTing a run with a bearer token.
heads OPTIONS "$U/demo/runs" -H "$APP" -H 'Access-Control-Request-Method: POST' \
    -H 'Access-Control-Request-Headers: authorization,content-type'
check_eq "preflight from an allowed origin: 204, without a token" 204 "$STATUS"
check_contains "it allows the origin" "Access-Control-Allow-Origin: http://app.test:3000" "$H"
check_contains "it lists the methods" "Access-Control-Allow-Methods: GET, POST, OPTIONS" "$H"
check_contains "and the headers" "Access-Control-Allow-Headers: Authorization, Content-Type, Accept, X-Request-Id, traceparent" "$H"
check_contains "for max_age" "Access-Control-Max-Age: 300" "$H"
check_contains "caches key on the origin" "Vary: Origin" "$H"
check_not_contains "no credentials unless configured" "Access-Control-Allow-Credentials" "$H"
check_eq "no backend was asked" 0 "$(stat requests)"

# 2. Refused preflights: another origin, a method or a header not allowed.
heads OPTIONS "$U/demo/runs" -H 'Origin: http://evil.test' -H 'Access-Control-Request-Method: POST'
check_eq "preflight from another origin: 403" 403 "$STATUS"
check_eq "it names the origin" '{"error":"forbidden: origin '\''http://evil.test'\'' is not allowed (cors.allowed_origins)"}' "$(cat "$T/b")"
check_not_contains "and carries no CORS field" "Access-Control-" "$H"
heads OPTIONS "$U/demo/runs" -H "$APP" -H 'Access-Control-Request-Method: DELETE'
check_eq "a method not allowed: 403" 403 "$STATUS"
check_contains "named" "method 'DELETE' is not allowed" "$(cat "$T/b")"
heads OPTIONS "$U/demo/runs" -H "$APP" -H 'Access-Control-Request-Method: POST' \
    -H 'Access-Control-Request-Headers: content-type, x-secret'
check_eq "a header not allowed: 403" 403 "$STATUS"
check_contains "named" "header 'x-secret' is not allowed" "$(cat "$T/b")"
heads OPTIONS "$U/demo/runs" -H 'Origin: http://app.test:3000/' -H 'Access-Control-Request-Method: POST'
check_eq "an origin is matched exactly (a trailing slash is another origin)" 403 "$STATUS"

# 3. Answers to an allowed origin carry the CORS fields: a stream, and the errors.
heads POST "$U/demo/runs" -H "$APP" -H 'Authorization: Bearer web-token' -H 'Content-Type: application/json' -d "$RUN"
check_eq "a run from an allowed origin" 200 "$STATUS"
check_contains "the stream carries Access-Control-Allow-Origin" "Access-Control-Allow-Origin: http://app.test:3000" "$H"
check_contains "and exposes the configured headers" "Access-Control-Expose-Headers: X-Request-Id" "$H"
check_contains "the stream is whole" RUN_FINISHED "$(cat "$T/b")"
heads POST "$U/demo/runs" -H "$APP" -H 'Content-Type: application/json' -d "$RUN"
check_eq "401" 401 "$STATUS"
check_contains "401 carries the CORS fields (the page can read why)" "Access-Control-Allow-Origin: http://app.test:3000" "$H"
check_contains "and its WWW-Authenticate" "WWW-Authenticate: Bearer" "$H"
heads POST "$U/nope/runs" -H "$APP" -H 'Authorization: Bearer web-token' -H 'Content-Type: application/json' -d "$RUN"
check_eq "404" 404 "$STATUS"
check_contains "404 carries the CORS fields" "Access-Control-Allow-Origin: http://app.test:3000" "$H"
heads POST "$U/dead/runs" -H 'Origin: http://127.0.0.1:5173' -H 'Authorization: Bearer web-token' -H 'Content-Type: application/json' -d "$RUN"
check_eq "502" 502 "$STATUS"
check_contains "502 carries the CORS fields" "Access-Control-Allow-Origin: http://127.0.0.1:5173" "$H"
heads GET "http://127.0.0.1:$GW_PORT/healthz" -H "$APP"
check_contains "so does /healthz" "Access-Control-Allow-Origin: http://app.test:3000" "$H"

# 4. Another origin, or none: the answer is the same, with no CORS field (the browser withholds it).
heads POST "$U/demo/runs" -H 'Origin: http://evil.test' -H 'Authorization: Bearer web-token' -H 'Content-Type: application/json' -d "$RUN"
check_eq "a run from another origin is served (a browser will not show it)" 200 "$STATUS"
check_not_contains "without a CORS field" "Access-Control-" "$H"
heads POST "$U/demo/runs" -H 'Authorization: Bearer web-token' -H 'Content-Type: application/json' -d "$RUN"
check_not_contains "no Origin, no CORS field" "Access-Control-" "$H"
heads OPTIONS "$U/demo/runs"
check_eq "a plain OPTIONS (no preflight) says what the route accepts" 204 "$STATUS"
check_contains "in Allow" "Allow: POST, OPTIONS" "$H"

# 5. The HTTP edge's own refusals carry them too, when the head said where the request came from: a body over
# limits.max_body_bytes (refused from its Content-Length, or from a chunk's size once the head was read), an
# Expect the gateway does not meet.
head -c 3000 /dev/zero | tr '\0' a >"$T/big"
heads POST "$U/demo/runs" -H "$APP" -H 'Authorization: Bearer web-token' -H 'Content-Type: application/json' \
    --data-binary @"$T/big"
check_eq "a body over the limit: 413 from the edge" 413 "$STATUS"
check_contains "… with the CORS fields of the origin" "Access-Control-Allow-Origin: http://app.test:3000" "$H"
check_contains "… and its exposed headers" "Access-Control-Expose-Headers: X-Request-Id" "$H"
check_contains "… and its JSON error, which the page can now read" "payload too large: the limit is 2048 bytes" \
    "$(cat "$T/b")"
heads POST "$U/demo/runs" -H "$APP" -H 'Content-Type: application/json' -H 'Transfer-Encoding: chunked' \
    --data-binary @"$T/big"
check_eq "a chunked body over the limit: 413" 413 "$STATUS"
check_contains "… with the CORS fields" "Access-Control-Allow-Origin: http://app.test:3000" "$H"
heads GET "http://127.0.0.1:$GW_PORT/healthz" -H 'Origin: http://127.0.0.1:5173' -H 'Expect: tea'
check_eq "an Expect it does not meet: 417" 417 "$STATUS"
check_contains "… with the CORS fields of that origin" "Access-Control-Allow-Origin: http://127.0.0.1:5173" "$H"
heads POST "$U/demo/runs" -H 'Origin: http://evil.test' -H 'Content-Type: application/json' --data-binary @"$T/big"
check_eq "from another origin: 413 too" 413 "$STATUS"
check_not_contains "… without a CORS field" "Access-Control-" "$H"

# 6. Without a "cors" object no origin is allowed.
stop_pid "$GW_PID" >/dev/null
sed -i '/"cors"/,/exposed_headers/d' "$T/gw.json"
start_gateway "$T/gw.json" || exit 1
heads OPTIONS "http://127.0.0.1:$GW_PORT/v1/ag-ui/agents/demo/runs" -H "$APP" -H 'Access-Control-Request-Method: POST'
check_eq "no cors configured: every preflight is 403" 403 "$STATUS"
check_not_contains "without a CORS field" "Access-Control-" "$H"
stop_pid "$GW_PID" >/dev/null
check_eq "clean exit" 0 "$STOP_STATUS"
finish
