#!/usr/bin/env bash
# /metrics: the latency histograms by agent (upstream connect, first byte, run duration) count what was run
# (a reused pooled connection has no connect time; a refused connection none either), and the whole
# exposition passes `promtool check metrics` (Prometheus's own linter), with every kind of series present.
. "$AGW_SRCDIR/tests/integration/lib.sh"

if ! command -v promtool >/dev/null 2>&1; then
    echo "SKIP: promtool is missing (Debian package prometheus; scripts/dev test installs it)"
    exit 77
fi
start_demo demo || exit 1
D=http://127.0.0.1:$DEMO_PORT
h() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "admin": { "address": "127.0.0.1", "port": 0 },
  "auth": { "keys": [ { "id": "web", "sha256": "$(h web-token)", "agents": ["*"], "rate_limit": { "concurrent_runs": 10 } } ] },
  "agents": { "a": { "upstreams": ["$D/agent"] }, "slow": { "upstreams": ["$D/agent?first_byte_delay_ms=300"] },
              "dead": { "upstreams": ["http://127.0.0.1:9/agent"], "retries": 0 } },
  "store": { "kind": "memory" }
}
JSON
start_gateway "$T/gw.json" || exit 1
wait_port_file "$T/gw.port" 2 || exit 1
ADMIN=$(sed -n 2p "$T/gw.port")
U=http://127.0.0.1:$GW_PORT/v1/ag-ui/agents
RUN='{"threadId":"t1","runId":"r1","messages":[{"id":"m1","role":"user","content":"hi"}]}'
run() { curl -sS -m 10 -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -H 'Authorization: Bearer web-token' -d "$RUN" "$U/$1/runs"; }
snap_metric() { awk -v n="$1" '$1 == n { print $2 }' "$T/metrics"; }

for i in 1 2 3 4 5 6; do check_eq "run $i on a" 200 "$(run a)"; done
check_eq "a run whose backend answers after 300 ms" 200 "$(run slow)"
check_eq "a run whose backend refuses the connection" 502 "$(run dead)"
curl -s -m 5 -o /dev/null -H 'Origin: http://x.test' "http://127.0.0.1:$GW_PORT/nope"
sleep 0.2
curl -sS -m 5 "http://127.0.0.1:$ADMIN/metrics" >"$T/metrics"

check_eq "run duration: one observation per run of a" 6 "$(snap_metric 'agw_run_duration_seconds_count{agent="a"}')"
check_eq "first byte: one per run of a" 6 "$(snap_metric 'agw_upstream_first_byte_seconds_count{agent="a"}')"
n=$(snap_metric 'agw_upstream_connect_seconds_count{agent="a"}')
# Each event loop opens its own connection to the backend and reuses it: at most one connect per loop.
if [ -n "$n" ] && [ "$n" -ge 1 ] && [ "$n" -le "${AGW_TEST_WORKERS:-2}" ] && [ "$n" -lt 6 ]; then
    ok "connect: only new connections are timed ($n for 6 runs)"
else
    fail "connect: expected 1..${AGW_TEST_WORKERS:-2} observations for 6 runs on pooled connections, got '$n'"
fi
check_eq "a connection to the slow backend, its first byte after 300 ms" "0 1" \
    "$(snap_metric 'agw_upstream_first_byte_seconds_bucket{agent="slow",le="0.25"}') $(snap_metric 'agw_upstream_first_byte_seconds_bucket{agent="slow",le="0.5"}')"
check_eq "a refused connection is not a connect time" "" "$(snap_metric 'agw_upstream_connect_seconds_count{agent="dead"}')"
check_eq "its run is a duration" 1 "$(snap_metric 'agw_run_duration_seconds_count{agent="dead"}')"
check_eq "+Inf bucket equals the count" "$(snap_metric 'agw_run_duration_seconds_count{agent="a"}')" \
    "$(snap_metric 'agw_run_duration_seconds_bucket{agent="a",le="+Inf"}')"

lint=$(promtool check metrics <"$T/metrics" 2>&1)
st=$?
check_eq "promtool check metrics passes (exit status)" 0 "$st"
check_eq "with nothing to say" "" "$lint"
for t in counter gauge histogram; do
    check_contains "the exposition has ${t}s" "# TYPE agw_" "$(grep " $t\$" "$T/metrics" | head -n1)"
done

stop_pid "$GW_PID" >/dev/null
check_eq "clean exit" 0 "$STOP_STATUS"
finish
