#!/usr/bin/env bash
# The allocations a run costs (a mechanism, not a timing): the gateway, with bearer auth on, relays short
# runs (10 events) on kept-alive connections; an LD_PRELOAD library counts every malloc/calloc/realloc of the
# process, libraries included. After a warm-up, 1,000 runs must cost at most ALLOC_PER_RUN_MAX allocations
# each (doc/benchmarks.md, "What a run costs": 148 before the per-run work, 131 after, 70 since the body
# is validated without a tree and a run's small strings are not copied one by one, 61 since a stream's
# head is written by the gateway from fields built once, not by libevhtp from a header object per
# field: 66 before; 46 since a request's fields stay with the gateway's gate, libevhtp handed the
# request line and the framing alone: 60 before; 27 since the gate serves plain connections itself,
# libevhtp's objects freed at accept: 46 before). A change that adds allocations to the request
# path fails here. The same again with thread history on, which adds the writer thread's work (33;
# 52 before the gate served plain connections, 66 before the fields stayed with the gate, 72 before
# the head).
# The same library counts system calls (the wrappers a relayed run goes through). On kept-alive
# connections a run arms no event (its head, events and last chunk leave in one writev() of ours, and
# the client connection's write event stays disarmed; it cost two epoll_ctl() a run, arming and
# disarming, before): at most EPOLL_CTL_MAX over the 1,000 runs. Nor does it ask the socket how much
# it holds before reading (libevent's ioctl(FIONREAD), one a request before the gate read for
# itself): at most IOCTL_MAX. And the run's system calls in all (read, readv, writev, recv, epoll_wait,
# epoll_ctl, ioctl; 9.1 a run before this work, 6.1 after, 5.0 once a connection from the pool was
# no longer looked at with a recv(MSG_PEEK) before each reuse): at most SYSCALLS_PER_RUN_X10 / 10.
# That look is made now only where it can find something the loop has not seen (src/upstream.c,
# idle_unusable()): mostly a connection reused in the turn it went idle in, about one run in seven
# with 10 clients (136-138 measured over 1,000 runs, 998 before): at most PEEK_MAX.
. "$AGW_SRCDIR/tests/integration/lib.sh"

ALLOC_PER_RUN_MAX=30   # 27 measured (the counts are the same from run to run, 1 or 2 workers)
ALLOC_HISTORY_MAX=36  # 33 measured; doc/benchmarks.md, "What a run costs"
EPOLL_CTL_MAX=100     # over 1,000 runs (was 2,000)
IOCTL_MAX=100         # over 1,000 runs (was 1,000)
SYSCALLS_PER_RUN_X10=55 # tenths
# The bytes those allocations hand out (their usable sizes, summed): 15,400 a run measured (18,500
# before the gate served plain connections; 178,500 before a read went through a per-thread buffer
# instead of a new 16 or 64 KiB evbuffer chain for each request and each response head; src/io.c).
# History on: 25,700 (28,800; 187,300); new connections 30,600 (34,000; 194,000).
BYTES_PER_RUN_MAX=19000
ALLOC_FRESH_MAX=54       # a run on new connections (50 measured; 73 before the gate served plain
                         # connections, 87 before the fields stayed with the gate, 88 before the
                         # upstream's literal address was read once, 95 before the head)
# getpeername() calls over 1,000 runs: on new connections to an upstream written as an address,
# none (src/upstream.c, literal_address(): libevent's resolver path made one a connection, after
# an snprintf(), an sscanf() and an allocation)
GETPEERNAME_MAX=1000000
# Calls of the printf family (snprintf, sprintf, their v- and _chk forms) and of inet_ntop() over
# 1,000 runs, the daemon's and its libraries' (countalloc.c): a run that starts formats nothing
# (a rate-limit message or a client's address are made only when they are written: 1,021 calls
# over 1,000 runs on kept-alive connections before, 3,009 on new ones; one is the counter's own
# report)
FORMAT_MAX=100
# Header names compared case-insensitively over 1,000 runs (countalloc.c): the fields the gateway
# reads are found in one pass (agw_req_known_header(), src/http_server.c), not by one lookup each,
# which compared every field's name again: 7,000 measured on kept-alive connections, 8,000 on new
# ones, libevhtp's own (32,000 and 37,000 before; 10,000 and 11,000 while the pass compared names
# with strncasecmp() rather than agw_strieq_n()); 2,000 and 4,000 since libevhtp is no longer
# handed the fields (it compared each name it parsed with the few it looks for); none since it
# parses no request of a plain connection
STRCASECMP_MAX=500
FRESH_SYSCALLS_X10=120   # (11.3 measured; 16.3 before)
if [ -n "${AGW_SANITIZED:-}" ]; then
    echo "sanitized build: ASan owns malloc, nothing to count"
    exit 77
fi
CC=${CC:-cc}
"$CC" -shared -fPIC -O2 -o "$T/countalloc.so" "$AGW_SRCDIR/tests/integration/countalloc.c" -ldl ||
    { echo "cannot build the counting library"; exit 1; }

start_demo demo || exit 1
TOKEN=alloc-token
LOAD=$AGW_BUILDDIR/bench/agw-load
# measure NAME HISTORY MAX [LIMITS [LOAD_FLAGS]]: a gateway with <HISTORY> (the "history" section) and
# <LIMITS> (the "limits" section), 500 runs of warm-up, then 1,000 counted runs (agw-load with
# <LOAD_FLAGS>); at most MAX allocations per run, BYTES_PER_RUN_MAX bytes allocated per run, and the
# system-call bounds EPOLL_CTL_MAX, IOCTL_MAX, GETPEERNAME_MAX and SYSCALLS_PER_RUN_X10 as they are
# set when it is called.
# at_most WHAT VALUE MAX: one check, VALUE <= MAX.
at_most() {
    CHECKS=$((CHECKS + 1))
    if [ "$2" -le "$3" ]; then
        ok "$1: $2 (at most $3)"
    else
        fail "$1: $2, more than $3"
    fi
}
measure() {
    cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [ { "id": "k", "sha256": "$(printf %s $TOKEN | "$AGW_GATEWAY" hash-token)", "agents": ["*"] } ] },
  "log": { "level": "warn", "access": "off" },
  "history": $2,
  "limits": ${4:-{\}},
  "store": { "path": "$T/store" },
  "agents": { "short": { "upstreams": ["http://127.0.0.1:$DEMO_PORT/agent?events=10&size=100"] } }
}
JSON
    LD_PRELOAD="$T/countalloc.so" start_gateway "$T/gw.json" || exit 1
    local u=http://127.0.0.1:$GW_PORT/v1/ag-ui/agents/short/runs a0 a1 ok_runs
    count() {
        kill -USR2 "$GW_PID"
        for _ in $(seq 50); do
            n=$(grep -c '^ALLOCATIONS' "$GW_LOG")
            [ "$n" -ge "$1" ] && break
            sleep 0.1
        done
        grep '^ALLOCATIONS' "$GW_LOG" | sed -n "${1}p" | awk '{print $2, $8, $10, $12, $14, $16, $18, $20, $6, $22}'
    }
    "$LOAD" --url "$u" --header "Authorization: Bearer $TOKEN" --concurrency 10 --runs 500 ${5:-} >"$T/warm.json" ||
        fail "$1: warm-up runs"
    sleep 0.5 # the store's writer has applied and committed the warm-up
    a0=$(count 1)
    "$LOAD" --url "$u" --header "Authorization: Bearer $TOKEN" --concurrency 10 --runs 1000 ${5:-} >"$T/load.json" ||
        fail "$1: measured runs"
    sleep 0.5 # and the measured runs
    a1=$(count 2)
    ok_runs=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("runs_ok", d.get("runs")), d.get("runs_failed", 0))' "$T/load.json")
    check_eq "$1: 1,000 runs, none failed" "1000 0" "$ok_runs"
    read -r a0 e0 i0 s0 b0 g0 f0 c0 p0 k0 <<<"$a0"
    read -r a1 e1 i1 s1 b1 g1 f1 c1 p1 k1 <<<"$a1"
    SEPARATE_X10=$(( (p1 - p0) / 100 ))
    at_most "$1: allocations per run" $(((a1 - a0) / 1000)) "$3"
    at_most "$1: bytes allocated per run" $(((b1 - b0) / 1000)) "$BYTES_PER_RUN_MAX"
    at_most "$1: epoll_ctl() calls over 1,000 runs" $((e1 - e0)) "$EPOLL_CTL_MAX"
    at_most "$1: ioctl() calls over 1,000 runs" $((i1 - i0)) "$IOCTL_MAX"
    at_most "$1: getpeername() calls over 1,000 runs" $((g1 - g0)) "$GETPEERNAME_MAX"
    at_most "$1: printf-family and inet_ntop() calls over 1,000 runs" $((f1 - f0)) "$FORMAT_MAX"
    at_most "$1: strcasecmp() and strncasecmp() calls over 1,000 runs" $((c1 - c0)) "$STRCASECMP_MAX"
    if [ -n "${PEEK_MAX:-}" ]; then
        at_most "$1: pooled connections looked at (recv(MSG_PEEK)) over 1,000 runs" $((k1 - k0)) "$PEEK_MAX"
    fi
    CHECKS=$((CHECKS + 1))
    local sys_x10=$(( (s1 - s0) / 100 ))
    local sys_max="$((SYSCALLS_PER_RUN_X10 / 10)).$((SYSCALLS_PER_RUN_X10 % 10))"
    if [ "$sys_x10" -le "$SYSCALLS_PER_RUN_X10" ]; then
        ok "$1: system calls per run: $((sys_x10 / 10)).$((sys_x10 % 10)) (at most $sys_max)"
    else
        fail "$1: system calls per run: $((sys_x10 / 10)).$((sys_x10 % 10)), more than $sys_max"
    fi
    stop_pid "$GW_PID" >/dev/null
}
# The request path alone (the gateway's loop: what issue 13 counted).
PEEK_MAX=300 measure "history off" '{ "enabled": false }' "$ALLOC_PER_RUN_MAX"
SEPARATE_OFF_X10=$SEPARATE_X10
# With thread history recorded (the default): the loop's share (a capture, two hand-overs) plus the
# store's writer thread (parsing the input and the events, rebuilding, the SQLite commit).
BYTES_PER_RUN_MAX=30000 measure "history on" '{ "enabled": true }' "$ALLOC_HISTORY_MAX"
# What a run records is on the separate heap (src/mem.c), the capture and its buffers included
# (src/capture.c): made while the run streams and freed when it ends or waits, on the main heap
# they left holes among the idle streams' own objects (a 256-byte buffer each, 0.2 KiB of RSS per
# idle stream). Recording adds SEPARATE_HISTORY_MIN_X10 / 10 separate allocations a run at least:
# 5.0 measured (the input's and the events' hand-overs, the capture, its two buffers); 2.0 with
# the capture on the main heap.
SEPARATE_HISTORY_MIN_X10=45
if [ -z "${AGW_JEMALLOC:-}" ]; then
    ok "history on: no separate heap in this build (the C library's malloc)"
else
    CHECKS=$((CHECKS + 1))
    if [ $((SEPARATE_X10 - SEPARATE_OFF_X10)) -ge "$SEPARATE_HISTORY_MIN_X10" ]; then
        ok "history on: separate-heap allocations a run: $SEPARATE_X10 tenths, $SEPARATE_OFF_X10 without history"
    else
        fail "history on: separate-heap allocations a run: $SEPARATE_X10 tenths, $SEPARATE_OFF_X10 without history (at least $SEPARATE_HISTORY_MIN_X10 more)"
    fi
fi
# A new client connection and a new upstream connection for every run (no upstream connection kept
# idle): each connection costs its registration with epoll and its removal, and the upstream one the
# arming and disarming of its write event while it connects. Switching a new upstream connection to
# the exchange's own read event costs nothing (it cost a DEL and an ADD; 10 epoll_ctl() a run in all
# before this work, 6 after), nor does releasing an idle stream.
EPOLL_CTL_MAX=6500 IOCTL_MAX=100 SYSCALLS_PER_RUN_X10=$FRESH_SYSCALLS_X10 BYTES_PER_RUN_MAX=36000 \
    GETPEERNAME_MAX=100 \
    measure "new connections" '{ "enabled": false }' "$ALLOC_FRESH_MAX" \
    '{ "upstream_idle_connections": 0 }' --new-conn

# A paced stream, as an agent streams tokens: 200 events a millisecond apart, each its own write(),
# so that each of the gateway's reads holds one. The frames a read passes unchanged leave from where
# they were read, in one writev() with their chunk's framing (src/relay.c, write_run()): an event
# costs no allocation on the way through (a chain of the relay's output buffer was made and freed
# for each, 1.13 allocations an event in all before). At most PACED_ALLOC_PER_EVENT_X100 / 100 an
# event, the run's own allocations included (0.14 measured: 27 a run over 200 events).
PACED_ALLOC_PER_EVENT_X100=40
cat >"$T/paced.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [ { "id": "k", "sha256": "$(printf %s $TOKEN | "$AGW_GATEWAY" hash-token)", "agents": ["*"] } ] },
  "log": { "level": "warn", "access": "off" },
  "history": { "enabled": false },
  "agents": { "paced": { "upstreams": ["http://127.0.0.1:$DEMO_PORT/agent?events=200&size=100&delay_ms=1&write_each=1"] } }
}
JSON
LD_PRELOAD="$T/countalloc.so" start_gateway "$T/paced.json" || exit 1
u=http://127.0.0.1:$GW_PORT/v1/ag-ui/agents/paced/runs
"$LOAD" --url "$u" --header "Authorization: Bearer $TOKEN" --concurrency 5 --runs 10 >"$T/warm.json" ||
    fail "paced: warm-up runs"
a0=$(count 1)
"$LOAD" --url "$u" --header "Authorization: Bearer $TOKEN" --concurrency 5 --runs 50 >"$T/load.json" ||
    fail "paced: measured runs"
a1=$(count 2)
events=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["events"] if d.get("runs_ok") == 50 and d.get("runs_failed", 0) == 0 else 0)' "$T/load.json")
check_eq "paced: 50 runs, none failed, 10,000 events or more" yes \
    "$([ "$events" -ge 10000 ] && echo yes || echo "no: $events events")"
read -r a0 _ <<<"$a0"
read -r a1 _ <<<"$a1"
[ "$events" -gt 0 ] || events=1
at_most "paced: allocations per 100 events" $(((a1 - a0) * 100 / events)) "$PACED_ALLOC_PER_EVENT_X100"
stop_pid "$GW_PID" >/dev/null
finish
