#!/usr/bin/env bash
# The server skeleton: /healthz, 404/405/413/415/505, request ids, the read timeout, metrics, a clean
# shutdown on SIGTERM (and, when valgrind is installed, no leak over a start / requests / SIGTERM cycle).
. "$AGW_SRCDIR/tests/integration/lib.sh"

cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "admin": { "address": "127.0.0.1", "port": 0 },
  "auth": { "mode": "none" },
  "agents": { "a": { "upstreams": ["http://127.0.0.1:9/agent"] } },
  "limits": { "max_body_bytes": 1024 },
  "timeouts": { "request": "1s" },
  "log": { "level": "info", "access": "$T/access.log" }
}
JSON

start_gateway "$T/gw.json" || exit 1
ADMIN_PORT=$(sed -n 2p "$T/gw.port")
G=http://127.0.0.1:$GW_PORT

# The descriptor table is grown to the open-file limit at start (src/main.c, grow_fd_table): growing
# it later, with several threads, stalls the thread that needs a descriptor. /proc says its size.
fdsize=$(awk '/^FDSize:/ {print $2}' "/proc/$GW_PID/status" 2>/dev/null)
limit=$(awk '/^Max open files/ {print $4}' "/proc/$GW_PID/limits" 2>/dev/null)
if [ -n "$fdsize" ] && [ -n "$limit" ] && [ "$limit" != unlimited ]; then
    want=$((limit < 1048576 ? limit : 1048576))
    check_eq "descriptor table grown to the open-file limit ($limit) at start" yes \
        "$([ "$fdsize" -ge "$want" ] && echo yes || echo "no: FDSize $fdsize")"
fi

http GET $G/healthz
check_eq "healthz status" 200 "$STATUS"
check_eq "healthz body" '{"status":"ok"}' "$BODY"
curl -s -D "$T/h" -o /dev/null $G/healthz
check_contains "healthz is JSON" "Content-Type: application/json" "$(cat "$T/h")"
check_contains "every answer carries a request id" "X-Request-Id:" "$(cat "$T/h")"
curl -s -D "$T/h" -o /dev/null -H 'X-Request-Id: abc-123' $G/healthz
check_contains "a sane client request id is kept" "X-Request-Id: abc-123" "$(cat "$T/h")"

http GET $G/nope
check_eq "unknown path" 404 "$STATUS"
check_contains "404 is a JSON error" '"error":"not found' "$BODY"
http GET $G/healthzx
check_eq "no prefix match" 404 "$STATUS"
http FOO $G/nope
check_eq "a method libevhtp has no name for is quoted as sent" \
    '404 {"error":"not found: no route for FOO /nope"}' "$STATUS $BODY"
http FOO $G/healthz
check_eq "… and is refused where the path is known" 405 "$STATUS"
http GET $G/v1/ag-ui/agents/a/runs/
check_eq "trailing slash is another path" 404 "$STATUS"
http GET $G/v1/ag-ui/agents/a%2Fb/runs
check_eq "an encoded slash in an id" 400 "$STATUS"

http GET $G/v1/ag-ui/agents/a/runs
check_eq "wrong method" 405 "$STATUS"
check_contains "405 is a JSON error" '"error":"method not allowed' "$BODY"
curl -s -D "$T/h" -o /dev/null $G/v1/ag-ui/agents/a/runs
check_contains "405 says what is allowed" "Allow: POST, OPTIONS" "$(cat "$T/h")"
http DELETE $G/healthz
check_eq "DELETE /healthz" 405 "$STATUS"

head -c 5000 /dev/zero | tr '\0' a >"$T/big"
http POST $G/v1/ag-ui/agents/a/runs -H 'Content-Type: application/json' --data-binary @"$T/big"
check_eq "body over limits.max_body_bytes (from Content-Length)" 413 "$STATUS"
check_eq "413 is a JSON error that names the limit" \
    '{"error":"payload too large: the limit is 1024 bytes"}' "$BODY"
http POST $G/v1/ag-ui/agents/a/runs -H 'Content-Type: application/json' -H 'Transfer-Encoding: chunked' \
    --data-binary @"$T/big"
check_eq "chunked body over the limit" 413 "$STATUS"

http GET $G/healthz --http1.0
check_eq "HTTP/1.0" 505 "$STATUS"
http GET $G/healthz -H 'Expect: tea'
check_eq "Expect other than 100-continue" 417 "$STATUS"
# Expect: 100-continue: the interim answer, then the request's own answer on the same connection.
printf '{"x":"%s"}' "$(head -c 600 /dev/zero | tr '\0' a)" >"$T/cont.json"
curl -sS -m 5 -v -o "$T/cont.body" -w '%{http_code}' -H 'Expect: 100-continue' -H 'Content-Type: application/json' \
    --data-binary @"$T/cont.json" $G/v1/ag-ui/agents/a/runs >"$T/cont.status" 2>"$T/cont.err"
check_contains "Expect: 100-continue gets 100 Continue" "HTTP/1.1 100 Continue" "$(cat "$T/cont.err")"
check_eq "… then the request is answered (422: no threadId)" 422 "$(cat "$T/cont.status")"
check_contains "… with its reason phrase (libevhtp has none for 422)" "HTTP/1.1 422 Unprocessable Content" "$(cat "$T/cont.err")"
curl -s -I -o /dev/null -D "$T/head.h" $G/healthz
check_contains "HEAD: the length of the body a GET gets" "Content-Length: 15" "$(tr -d '\r' <"$T/head.h")"

# A client that sends half a request and stalls is disconnected after timeouts.request.
start=$(date +%s%N)
exec 3<>/dev/tcp/127.0.0.1/"$GW_PORT"
printf 'GET /healthz HTTP/1.1\r\nHost: x\r\n' >&3
timeout 10 cat <&3 >/dev/null
exec 3>&-
elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
CHECKS=$((CHECKS + 1))
if [ "$elapsed" -lt 4000 ]; then ok "slow client closed after ~1 s ($elapsed ms)"; else fail "slow client kept for $elapsed ms"; fi

http GET http://127.0.0.1:$ADMIN_PORT/metrics
check_eq "metrics on the admin listener" 200 "$STATUS"
check_contains "metrics count requests" 'agw_requests_total{agent="",status="404"}' "$BODY"
http GET http://127.0.0.1:$ADMIN_PORT/healthz
check_eq "healthz on the admin listener" 200 "$STATUS"
http GET $G/metrics
check_eq "no metrics on the public listener when an admin one exists" 404 "$STATUS"
http POST http://127.0.0.1:$ADMIN_PORT/v1/ag-ui/agents/a/runs
check_eq "the admin listener serves no runs" 404 "$STATUS"

check_contains "access log has JSON lines" '"status":404' "$(cat "$T/access.log")"

stop_pid "$GW_PID" >/dev/null
st=$STOP_STATUS
check_eq "SIGTERM exits 0" 0 "$st"
check_contains "drain is logged" "draining" "$(cat "$GW_LOG")"

if command -v valgrind >/dev/null 2>&1 && [ -z "${AGW_SANITIZED:-}" ]; then
    rm -f "$T/gw.port"
    valgrind --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=99 \
        "$AGW_GATEWAY" "${GW_ARGS[@]}" -c "$T/gw.json" --port-file "$T/gw.port" >"$T/vg.log" 2>&1 &
    VG=$!
    PIDS="$PIDS $VG"
    wait_port_file "$T/gw.port" 2 || { cat "$T/vg.log"; exit 1; }
    P=$(head -n1 "$T/gw.port")
    for _ in 1 2 3; do
        curl -s -m 10 -o /dev/null http://127.0.0.1:$P/healthz
        curl -s -m 10 -o /dev/null http://127.0.0.1:$P/nope
        curl -s -m 10 -o /dev/null -H 'Content-Type: application/json' -d '{"threadId":"t","runId":"r","messages":[]}' \
            http://127.0.0.1:$P/v1/ag-ui/agents/a/runs
    done
    stop_pid "$VG" >/dev/null
    st=$STOP_STATUS
    check_eq "valgrind: no leak and no error over start / requests / SIGTERM" 0 "$st"
    [ "$st" = 0 ] || tail -n 40 "$T/vg.log"
fi

finish
