#!/usr/bin/env bash
# Memory per idle TLS stream: nginx terminating TLS vs the gateway terminating TLS, same certificate, same
# stalled upstream (the demo agent with stall=1), one worker / one event loop each, N streams held open.
# usage: BUILD=_build bash bench/tls-idle.sh [N]   (default 2000). Needs nginx, python3, openssl.
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$SRC/_build}
N=${1:-2000}
NGINX=${NGINX:-/usr/sbin/nginx}
T=$(mktemp -d "${TMPDIR:-/tmp}/agw-tls-bench.XXXXXX")
PIDS=""
trap 'for p in $PIDS; do kill "$p" 2>/dev/null; done; sleep 0.5; rm -rf "$T"' EXIT
ulimit -n 16384 2>/dev/null || ulimit -n "$(ulimit -Hn)"

rss() { awk '/VmRSS/ {print $2}' /proc/"$1"/status; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 100); do curl -sk -o /dev/null -m 1 "$1" && return 0; sleep 0.1; done; return 1; }

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$T/key.pem" -out "$T/cert.pem" \
    -days 2 -subj /CN=localhost -addext subjectAltName=DNS:localhost 2>/dev/null

"$BUILD/src/agui-demo-agent" --listen 127.0.0.1:0 --port-file "$T/demo.port" --log-level warn >"$T/demo.log" 2>&1 &
PIDS="$PIDS $!"
for _ in $(seq 100); do [ -s "$T/demo.port" ] && break; sleep 0.1; done
DEMO_PORT=$(cat "$T/demo.port")

# nginx: the run.sh configuration with an ssl listener (same protocols as the gateway).
NGINX_PORT=$(free_port)
mkdir -p "$T/nginx"
sed -e "s|@DIR@|$T/nginx|g" -e "s|@PORT@|$NGINX_PORT ssl|g" -e "s|@UPSTREAM_PORT@|$DEMO_PORT|g" \
    -e "s|^    server {|    ssl_certificate $T/cert.pem; ssl_certificate_key $T/key.pem; ssl_protocols TLSv1.2 TLSv1.3;\n    server {|" \
    "$SRC/bench/nginx.conf.in" >"$T/nginx/nginx.conf"
"$NGINX" -p "$T/nginx" -c "$T/nginx/nginx.conf" -e "$T/nginx/nginx-error.log" >/dev/null 2>&1 &
NGINX_PID=$!
PIDS="$PIDS $NGINX_PID"
wait_up "https://127.0.0.1:$NGINX_PORT/healthz" || { cat "$T/nginx/nginx-error.log"; exit 1; }
NGINX_WORKER=$(pgrep -P "$NGINX_PID" | head -n1)

cat >"$T/gw.json" <<JSON
{ "listen": [ { "address": "127.0.0.1", "port": 0, "tls": { "cert": "$T/cert.pem", "key": "$T/key.pem" } } ],
  "auth": { "mode": "none" }, "log": { "level": "warn", "access": "off" },
  "agents": { "idle": { "upstreams": ["http://127.0.0.1:$DEMO_PORT/agent?stall=1"] } } }
JSON
"$BUILD/src/agui-gateway" -c "$T/gw.json" --port-file "$T/gw.port" >"$T/gw.log" 2>&1 &
GW_PID=$!
PIDS="$PIDS $GW_PID"
for _ in $(seq 100); do [ -s "$T/gw.port" ] && break; sleep 0.1; done
GW_PORT=$(head -n1 "$T/gw.port")
wait_up "https://127.0.0.1:$GW_PORT/healthz" || { cat "$T/gw.log"; exit 1; }

measure() { # NAME PID PORT PATH
    local before after out
    before=$(rss "$2")
    python3 "$SRC/bench/tls_idle.py" --port "$3" --path "$4" --ca "$T/cert.pem" -n "$N" --hold 60 >"$T/load.out" 2>"$T/load.err" &
    local lp=$!
    for _ in $(seq 1200); do grep -q ready "$T/load.out" 2>/dev/null && break; kill -0 $lp 2>/dev/null || break; sleep 0.1; done
    sleep 1
    after=$(rss "$2")
    out=$(cat "$T/load.out")
    kill -TERM $lp 2>/dev/null
    wait $lp 2>/dev/null
    awk -v n="$1" -v b="$before" -v a="$after" -v c="$N" -v o="$out" \
        'BEGIN { printf "| %s | %s | %d | %d | %.2f |\n", n, o, b, a, (a - b) / c }'
}

echo "| proxy | streams | RSS before (KiB) | RSS with streams (KiB) | KiB per idle TLS stream |"
echo "|---|---|---|---|---|"
measure "nginx (worker)" "$NGINX_WORKER" "$NGINX_PORT" "/agent?stall=1"
measure "gateway" "$GW_PID" "$GW_PORT" "/v1/ag-ui/agents/idle/runs"
