#!/usr/bin/env bash
# Bounded accepts: a loop takes at most AGW_ACCEPT_BATCH (64) connections in one turn, then runs its
# other ready work before it accepts more. 300 connections queued while the gateway is stopped are
# all accepted and answered once it runs again, in 4 or more turns (agw_accept_yields_total counts
# the turns that stopped at 64: 4 with one loop; 3 or more when two loops share the burst), and a
# connection already open before the burst is answered too.
. "$AGW_SRCDIR/tests/integration/lib.sh"

cat >"$T/gw.json" <<JSON
{ "listen": [ { "address": "127.0.0.1", "port": 0 } ], "auth": { "mode": "none" },
  "agents": { "a": { "upstreams": ["http://127.0.0.1:9/agent"] } } }
JSON
start_gateway "$T/gw.json" || exit 1

check_eq "no yield before the burst" 0 "$(metric agw_accept_yields_total)"
# The client: one connection opened first, then (on a line from the test) 300 more that the stopped
# gateway cannot accept; when it runs again, a request on every connection, every answer read.
mkfifo "$T/go"
python3 - "$GW_PORT" 300 "$T/go" >"$T/burst.out" 2>&1 <<'PY' &
import socket, sys, time
port, n, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
first = socket.create_connection(("127.0.0.1", port), timeout=20)
first.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
first.recv(4096)
print("first answered", flush=True)
open(go).read()  # the gateway is stopped now
socks = []
for _ in range(n):
    s = socket.socket()
    s.settimeout(20)
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    socks.append(s)
# every handshake completes in the kernel's backlog (1,024) while the gateway is stopped: each
# socket is then writable; said before the test lets the gateway run again
import select
poller = select.poll()
for s in socks:
    poller.register(s, select.POLLOUT)
pending, deadline = len(socks), time.monotonic() + 10
while pending > 0 and time.monotonic() < deadline:
    for fd, ev in poller.poll(100):
        poller.unregister(fd)
        pending -= 1
print("connected", len(socks) - pending, flush=True)
open(go).read()  # and running again
answered = 0
for s in [first] + socks:
    s.setblocking(True)
    s.settimeout(20)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        data = s.makefile("rb").read()  # to the end: the answer closes the connection
        if data.startswith(b"HTTP/1.1 200"):
            answered += 1
    except OSError as e:
        print("error:", e, flush=True)
print("answered", answered, flush=True)
PY
CLIENT=$!
PIDS="$PIDS $CLIENT"
wait_grep "$T/burst.out" "first answered" || fail "the first connection was not answered"
kill -STOP "$GW_PID"
echo go >"$T/go"
wait_grep "$T/burst.out" "connected 300" || fail "the 300 connects did not complete in the backlog"
kill -CONT "$GW_PID"
echo go >"$T/go"
wait_done "$CLIENT" || fail "the client did not finish in 10 s"
check_contains "every connection of the burst answered, and the one before it" "answered 301" \
    "$(cat "$T/burst.out")"
y=$(metric agw_accept_yields_total)
CHECKS=$((CHECKS + 1))
if [ -n "$y" ] && [ "$y" -ge 3 ]; then
    ok "300 queued connections taken in batches of 64 ($y yields)"
else
    fail "300 queued connections: expected 3 or more accept yields (batches of 64), got '$y'"
fi
stop_pid "$GW_PID" >/dev/null
check_eq "the gateway stops cleanly" 0 "$STOP_STATUS"
finish
