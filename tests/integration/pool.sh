#!/usr/bin/env bash
# The upstream connection pool against the demo agent: kept-alive connections are reused; one the
# backend closes while it waits in the pool is dropped (hangup=idle); one the backend closes as the
# next request arrives (hangup=next) is retried on a fresh connection, once. Under valgrind when it
# is installed: the pooled connections' read events and buffers are freed at shutdown. A plain TCP
# connection's read event is edge-triggered (epoll reports it once per arrival, not at every look
# while bytes wait): a response that comes in one write larger than a read is still read whole, and
# every pooled connection is registered so (the loop's epoll, seen in /proc).
. "$AGW_SRCDIR/tests/integration/lib.sh"

start_demo demo || exit 1
D=http://127.0.0.1:$DEMO_PORT
# One event loop: each loop keeps its own pool, and sequential runs must meet the same one.
cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "mode": "none" },
  "log": { "level": "debug" },
  "workers": 1,
  "agents": {
    "keep": { "upstreams": ["$D/agent?events=3"] },
    "hidle": { "upstreams": ["$D/agent?events=3&hangup=idle"] },
    "hnext": { "upstreams": ["$D/agent?events=3&hangup=next"] },
    "slow": { "upstreams": ["$D/agent?events=3&delay_ms=1000"] },
    "burst": { "upstreams": ["$D/agent?events=400&size=1000&framing=length"] }
  }
}
JSON
VG=()
if command -v valgrind >/dev/null 2>&1 && [ -z "${AGW_SANITIZED:-}" ]; then
    VG=(valgrind --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=99
        --log-file="$T/vg.log")
fi
rm -f "$T/gw.port"
GW_LOG=$T/gw.log
"${VG[@]}" "$AGW_GATEWAY" -c "$T/gw.json" --port-file "$T/gw.port" >"$GW_LOG" 2>&1 &
GW_PID=$!
PIDS="$PIDS $GW_PID"
wait_port_file "$T/gw.port" || { cat "$GW_LOG" >&2; exit 1; }
GW_PORT=$(head -n1 "$T/gw.port")
U=http://127.0.0.1:$GW_PORT/v1/ag-ui/agents
RUN_BODY='{"threadId":"t1","runId":"r1","messages":[{"id":"m1","role":"user","content":"Hi"}],"tools":[],"context":[],"state":{},"forwardedProps":{}}'

# run AGENT: one run; prints its last event type.
run() {
    curl -sS -N -m 30 -H 'Content-Type: application/json' -d "$RUN_BODY" "$U/$1/runs" 2>>"$T/curl.err" |
        grep -o '"type":"[A-Z_]*"' | tail -n1 | cut -d'"' -f4
}
# stat FIELD: sets V to the demo agent's counter. Each call is one more accepted connection (curl's
# own), which NSTAT counts so that upstream() can leave them out.
NSTAT=0
stat() {
    http GET "$D/_demo/stats"
    NSTAT=$((NSTAT + 1))
    V=$(printf %s "$BODY" | grep -o "\"$1\":[0-9]*" | cut -d: -f2)
}
# upstream: sets UP to the connections the demo agent accepted from the gateway so far.
upstream() {
    stat accepted
    UP=$((V - NSTAT))
}

# Reuse: three runs in a row over one upstream connection.
upstream
a0=$UP
r=""
for _ in 1 2 3; do r="$r$(run keep) "; done
check_eq "three runs complete" "RUN_FINISHED RUN_FINISHED RUN_FINISHED " "$r"
upstream
check_eq "and share one upstream connection" $((a0 + 1)) "$UP"

# Waves of runs at once: each run of the first wave needs its own connection; those all go back to
# the pool (limits.upstream_idle_connections, 256 by default), and the second wave takes them again.
# A slow run lasts about 3 s: on a loaded machine, starting 80 curl processes can take longer than a
# second, and runs that ended before the last ones began would leave their connections to them.
wave() {
    local i
    for i in $(seq 80); do
        (run slow >"$T/wave.$i") &
    done
    wait
    cat "$T"/wave.* | sort | uniq -c | awk '{print $1, $2}'
    rm -f "$T"/wave.*
}
upstream
a0=$UP
check_eq "a wave of 80 runs at once completes" "80 RUN_FINISHED" "$(wave)"
upstream
check_eq "and opens a connection per run" $((a0 + 80)) "$UP"
check_eq "a second wave completes" "80 RUN_FINISHED" "$(wave)"
upstream
check_eq "on the 80 pooled connections, none opened" $((a0 + 80)) "$UP"

# The client's side: three runs on one kept-alive client connection. Each run's head, events and last
# chunk leave in one write, and libevhtp completes the request from the write event the head armed; if
# it did not, the second run would never be read.
out=$(curl -sS -v -m 20 -H 'Content-Type: application/json' -d "$RUN_BODY" "$U/keep/runs" \
    --next -H 'Content-Type: application/json' -d "$RUN_BODY" "$U/keep/runs" \
    --next -H 'Content-Type: application/json' -d "$RUN_BODY" "$U/keep/runs" 2>&1; echo "curl-exit=$?")
check_eq "three runs on one client connection: all complete" 3 "$(printf %s "$out" | grep -c '"type":"RUN_FINISHED"')"
check_eq "three runs on one client connection: reused" 2 "$(printf %s "$out" | grep -c 'Re-using existing connection')"
# (curl quietly retries on a new connection when a reused one dies: count the connections it made)
check_eq "three runs on one client connection: one connection made" 1 "$(printf %s "$out" | grep -c '^\* Connected to')"
check_contains "three runs on one client connection: curl saw well-formed bodies" "curl-exit=0" "$out"

# A response of about 450 KB in one write, with a Content-Length and the connection kept: the gateway
# reads 64 KiB at a time, and with an edge-triggered read event nothing more arrives to report the rest
# (no new bytes, no close). It is read all the same, twice in a row on the same connection.
burst() {
    curl -sS -N -m 15 -H 'Content-Type: application/json' -d "$RUN_BODY" "$U/burst/runs" 2>>"$T/curl.err" |
        grep -c '"type":"TEXT_MESSAGE_CONTENT"'
}
upstream
a0=$UP
check_eq "a 450 KB response in one write is read whole" 400 "$(burst)"
check_eq "and again on the pooled connection" 400 "$(burst)"
upstream
check_eq "on one upstream connection" $((a0 + 1)) "$UP"

# How the loop's epoll holds each upstream connection now pooled (all of them plain TCP): the
# gateway's sockets whose peer is the demo agent, their descriptors, and the events each epoll
# instance of the process watches for them. EPOLLET is bit 31, EPOLLIN bit 0.
epoll_regs() {
    python3 - "$GW_PID" "$DEMO_PORT" <<'PY'
import os, sys
pid, port = sys.argv[1], int(sys.argv[2])
inodes = set()
for line in open("/proc/%s/net/tcp" % pid).readlines()[1:]:
    f = line.split()
    if int(f[2].split(":")[1], 16) == port and f[3] == "01":  # remote port, ESTABLISHED
        inodes.add(f[9])
fds, epolls = set(), []
for fd in os.listdir("/proc/%s/fd" % pid):
    try:
        link = os.readlink("/proc/%s/fd/%s" % (pid, fd))
    except OSError:
        continue
    if link.startswith("socket:[") and link[8:-1] in inodes:
        fds.add(fd)
    elif link == "anon_inode:[eventpoll]":
        epolls.append(fd)
seen = {}
for ep in epolls:
    for line in open("/proc/%s/fdinfo/%s" % (pid, ep)):
        f = line.split()
        if f and f[0] == "tfd:" and f[1] in fds:
            seen[f[1]] = int(f[3], 16)
et = sum(1 for v in seen.values() if v & 0x80000000 and v & 1)
print(len(fds), len(seen), et)
PY
}
read -r n_up n_reg n_et <<<"$(epoll_regs)"
if [ "${n_up:-0}" -ge 80 ] && [ "$n_reg" = "$n_up" ] && [ "$n_et" = "$n_up" ]; then
    ok "every pooled upstream connection ($n_up) is watched, edge-triggered"
else
    fail "pooled upstream connections: $n_up, watched $n_reg, edge-triggered $n_et"
fi

# hangup=idle: the backend closes the pooled connection while it is idle. The gateway notices (the
# idle connection's read event), drops it, and the next run opens a fresh one at once.
upstream
a0=$UP
check_eq "hangup=idle: first run" RUN_FINISHED "$(run hidle)"
sleep 0.5
check_eq "hangup=idle: the next run" RUN_FINISHED "$(run hidle)"
upstream
check_eq "hangup=idle: on a new connection" $((a0 + 2)) "$UP"
check_not_contains "hangup=idle: no stale connection was tried" "stale" "$(cat "$GW_LOG")"

# hangup=next: the pooled connection looks fine until the request is on it; the backend closes it
# unanswered. The request never reached the agent's logic: it is sent again on a fresh connection.
upstream
a0=$UP
stat requests
q0=$V
check_eq "hangup=next: first run" RUN_FINISHED "$(run hnext)"
check_eq "hangup=next: the next run, retried" RUN_FINISHED "$(run hnext)"
check_contains "hangup=next: the stale connection is logged" "pooled connection was stale, reconnecting" \
    "$(cat "$GW_LOG")"
upstream
check_eq "hangup=next: two connections" $((a0 + 2)) "$UP"
stat requests
check_eq "hangup=next: two runs answered" $((q0 + 2)) "$V"

# hangup=idle, back to back: the backend closes each connection as soon as its response is out, and
# one client starts its next run at once (agw-load), often before that close has arrived. A
# connection back in the pool a moment ago is reused without a look of its own (a recv(MSG_PEEK):
# src/upstream.c, idle_unusable()), so the first run to meet a closed one sends its request again
# on a fresh connection; from then on the pool looks at every connection before it reuses it
# (PEEK_STALE_MS), and finds the next ones closed. Every run ends; few are retried (45 of 50 would
# be without the look: 436 of 500 measured).
s0=$(grep -c "pooled connection was stale" "$GW_LOG")
"$AGW_BUILDDIR/bench/agw-load" --url "$U/hidle/runs" --concurrency 1 --runs 50 >"$T/hidle.json" 2>>"$T/load.err"
check_eq "hangup=idle, 50 runs back to back: every one finished" "50 0" \
    "$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("runs_ok"), d.get("runs_failed"))' "$T/hidle.json")"
s1=$(grep -c "pooled connection was stale" "$GW_LOG")
check_eq "hangup=idle, back to back: at most 10 of the 50 retried" yes \
    "$([ $((s1 - s0)) -le 10 ] && echo yes || echo "no: $((s1 - s0))")"
check_eq "no client saw an error" "" "$(cat "$T/curl.err")"

stop_pid "$GW_PID" >/dev/null
st=$STOP_STATUS
check_eq "SIGTERM exits 0 with pooled connections open${VG:+ (valgrind: no leak, no error)}" 0 "$st"
[ "$st" = 0 ] || tail -n 40 "$T/vg.log" 2>/dev/null

finish
