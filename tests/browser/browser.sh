#!/usr/bin/env bash
# A real browser: headless Chromium (Debian's) loads a page served on 127.0.0.1 from another port than the
# gateway; the page runs the official @ag-ui/client HttpAgent (bundled with esbuild) against the gateway with a
# bearer token, through CORS, and renders the conversations (text, a server-side tool, a frontend tool, and a
# message over the body limit, whose 413 the page must be able to read), which browser.mjs reads back. The same page from an origin that is not allowed must fail. Skips (77) only when
# Chromium is missing or cannot start; everything else that goes wrong fails.
. "$AGW_SRCDIR/tests/integration/lib.sh"

CHROMIUM=${CHROMIUM:-$(command -v chromium || true)}
if [ -z "$CHROMIUM" ]; then
    echo "SKIP: ******** no chromium on this machine: the browser test did not run (scripts/dev test installs it) ********"
    exit 77
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "node and npm are needed (scripts/dev test installs them)"
    exit 1
fi

# Node modules once per lock file, outside the source tree (like tests/interop).
cache=${AGW_NODE_CACHE:-$AGW_BUILDDIR/node-cache}-browser
src=$AGW_SRCDIR/tests/browser
node_modules "$src" "$cache" || exit 1
cp "$src/app.mjs" "$src/browser.mjs" "$cache/"
mkdir -p "$T/web"
cp "$src/page.html" "$T/web/"
(cd "$cache" && timeout 60 node_modules/.bin/esbuild app.mjs --bundle --format=iife --platform=browser \
    --target=es2020 --log-level=warning --outfile="$T/web/app.js") || { echo "FAIL: esbuild"; exit 1; }

start_demo demo || exit 1
(cd "$T/web" && CHROMIUM=$CHROMIUM TOKEN=browser-token timeout 120 node "$cache/browser.mjs") >"$T/driver.out" 2>&1 &
DRIVER=$!
wait_port_file "$T/web/page.port" || { cat "$T/driver.out"; exit 1; }
PAGE_PORT=$(head -n1 "$T/web/page.port")
cat >"$T/gw.json" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [ { "id": "browser", "sha256": "$(printf %s browser-token | sha256sum | cut -d' ' -f1)", "agents": ["demo"] } ] },
  "agents": { "demo": { "upstreams": ["http://127.0.0.1:$DEMO_PORT/agent"] } },
  "cors": { "allowed_origins": ["http://127.0.0.1:$PAGE_PORT"] },
  "limits": { "max_body_bytes": "64KiB" },
  "store": { "kind": "memory" }
}
JSON
start_gateway "$T/gw.json" || exit 1
cp "$T/gw.port" "$T/web/gw.port.tmp" && mv "$T/web/gw.port.tmp" "$T/web/gw.port"
wait "$DRIVER"
st=$?
cat "$T/driver.out"
if [ "$st" = 77 ]; then
    echo "SKIP: ******** Chromium could not start: the browser test did not run ********"
    exit 77
fi
[ "$st" = 0 ] || fail "the browser driver (exit status $st)"
check_contains "the gateway answered the other origin's preflight 403" '"method":"OPTIONS","path":"/v1/ag-ui/agents/demo/runs"' \
    "$(grep '"status":403' "$GW_LOG")"
check_contains "and the allowed origin's runs 200" '"key":"browser","status":200' "$(cat "$GW_LOG")"
n=$(curl -s -m 5 "http://127.0.0.1:$GW_PORT/metrics" | awk '$1 == "agw_requests_total{agent=\"\",status=\"204\"}" { print $2 }')
[ "${n:-0}" -ge 1 ] && ok "the browser's preflights were answered 204 by the gateway ($n)" ||
    fail "no preflight answered 204 (the browser must have sent one for Authorization and a JSON body)"
stop_pid "$GW_PID" >/dev/null
check_eq "clean exit" 0 "$STOP_STATUS"
finish
