# Shared helpers for the integration tests (sourced, POSIX sh + bash features used: local).
# Every test runs on 127.0.0.1 with ephemeral ports, in its own temporary directory, bounded in time, and
# stops every process it started (trap on EXIT).
set -u

: "${AGW_GATEWAY:?run through make check}"
: "${AGW_DEMO:?run through make check}"
: "${AGW_SRCDIR:?run through make check}"

T=$(mktemp -d "${TMPDIR:-/tmp}/agw-test.XXXXXX")
# The daemons run in it: the default thread-history store (var/agui-gateway, relative) lands there too.
cd "$T" || exit 99
# AGW_TEST_WORKERS=N: every gateway a test starts runs N event loops (--workers), whatever the
# machine's cores; scripts/dev test runs the suite with 2 (plain build) and 1 (sanitized build).
GW_ARGS=()
[ -n "${AGW_TEST_WORKERS:-}" ] && GW_ARGS=(--workers "$AGW_TEST_WORKERS")
PIDS=""
FAILS=0
CHECKS=0

cleanup() {
    for p in $PIDS; do
        kill "$p" 2>/dev/null
    done
    for p in $PIDS; do
        # Give each process 5 s to exit, then kill it hard.
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null
    done
    [ -n "${AGW_KEEP_TMP:-}" ] && echo "kept $T" >&2 || rm -rf "$T"
}
trap cleanup EXIT

FAILED=""
fail() {
    echo "FAIL: $*" >&2
    FAILS=$((FAILS + 1))
    FAILED="$FAILED
FAIL: $*"
}

ok() {
    echo "ok: $*"
}

# check DESCRIPTION EXPECTED ACTUAL
check_eq() {
    CHECKS=$((CHECKS + 1))
    if [ "$2" = "$3" ]; then ok "$1"; else fail "$1: expected '$2', got '$3'"; fi
}

# check_contains DESCRIPTION NEEDLE HAYSTACK
check_contains() {
    CHECKS=$((CHECKS + 1))
    case "$3" in
    *"$2"*) ok "$1" ;;
    *) fail "$1: '$2' not found in: $(printf %s "$3" | head -c 600)" ;;
    esac
}

check_not_contains() {
    CHECKS=$((CHECKS + 1))
    case "$3" in
    *"$2"*) fail "$1: '$2' unexpectedly found in: $(printf %s "$3" | head -c 600)" ;;
    *) ok "$1" ;;
    esac
}

# node_modules SRC CACHE: installs the node modules pinned by SRC/package.json and SRC/package-lock.json
# into CACHE (outside the source tree), once per lock file: npm ci again only when either file changed.
# Tests that share a CACHE may run at once (make check -j): the first installs under a lock (CACHE.lock),
# the others wait for it and find the modules there.
node_modules() {
    local src=$1 cache=$2 sum
    sum=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -d' ' -f1)
    mkdir -p "$cache"
    (
        flock -w 900 9 || { echo "node_modules: $cache.lock still held after 900 s"; exit 1; }
        [ "$(cat "$cache/.sum" 2>/dev/null)" = "$sum" ] && [ -d "$cache/node_modules" ] && exit 0
        cp "$src/package.json" "$src/package-lock.json" "$cache/"
        (cd "$cache" && timeout 600 npm ci --no-audit --no-fund --loglevel=error) || { echo "npm ci failed"; exit 1; }
        echo "$sum" >"$cache/.sum"
    ) 9>"$cache.lock"
}

# interop_client MJS: for a test that runs the official client: skips it (77) without node and npm,
# installs the pinned node modules of tests/interop into CACHE (node_modules) and copies
# tests/interop/MJS beside them; sets CACHE.
interop_client() {
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "node and npm are needed (scripts/dev test installs them)"
        exit 77
    fi
    # Node modules are installed once per lock file into a cache folder outside the source tree.
    CACHE=${AGW_NODE_CACHE:-$AGW_BUILDDIR/node-cache}
    node_modules "$AGW_SRCDIR/tests/interop" "$CACHE" || exit 1
    cp "$AGW_SRCDIR/tests/interop/$1" "$CACHE/$1"
}

# wait_port_file FILE [LINES]: waits (10 s max) until FILE has LINES lines; prints nothing.
wait_port_file() {
    local f=$1 n=${2:-1}
    for _ in $(seq 100); do
        if [ -s "$f" ] && [ "$(wc -l <"$f")" -ge "$n" ]; then return 0; fi
        sleep 0.1
    done
    echo "timeout waiting for $f" >&2
    return 1
}

# start_demo NAME [ARGS...]: starts the demo agent on an ephemeral port; sets DEMO_PORT and DEMO_PID.
start_demo() {
    local name=$1
    shift
    rm -f "$T/$name.port"
    "$AGW_DEMO" --listen 127.0.0.1:0 --port-file "$T/$name.port" "$@" >"$T/$name.log" 2>&1 &
    DEMO_PID=$!
    PIDS="$PIDS $DEMO_PID"
    wait_port_file "$T/$name.port" || { cat "$T/$name.log" >&2; return 1; }
    DEMO_PORT=$(head -n1 "$T/$name.port")
}

# start_gateway CONFIG [ARGS...]: starts the daemon; sets GW_PORT (first listener), GW_PID, GW_LOG.
start_gateway() {
    local cfg=$1
    shift
    rm -f "$T/gw.port"
    GW_LOG="$T/gw.log"
    "$AGW_GATEWAY" "${GW_ARGS[@]}" -c "$cfg" --port-file "$T/gw.port" "$@" >"$GW_LOG" 2>&1 &
    GW_PID=$!
    PIDS="$PIDS $GW_PID"
    wait_port_file "$T/gw.port" || { cat "$GW_LOG" >&2; return 1; }
    GW_PORT=$(head -n1 "$T/gw.port")
}

# stop_pid PID: SIGTERM, wait up to 10 s; sets STOP_STATUS to the exit status ("killed" if it had to be
# killed) and prints it. Call it directly, not in $(...): only the shell that started a process can wait for
# its status.
stop_pid() {
    local p=$1
    kill -TERM "$p" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
        kill -9 "$p"
        STOP_STATUS=killed
    else
        wait "$p" 2>/dev/null
        STOP_STATUS=$?
    fi
    echo "$STOP_STATUS"
}

# http METHOD URL [curl args...]: prints "STATUS\nBODY" (bounded to 10 s).
http() {
    local m=$1 u=$2
    shift 2
    curl -sS -m 10 -o "$T/body" -w '%{http_code}' -X "$m" "$u" "$@" >"$T/status" 2>"$T/curl.err" || true
    STATUS=$(cat "$T/status")
    BODY=$(cat "$T/body" 2>/dev/null)
}

# wait_grep FILE TEXT: up to 10 s for TEXT to appear in FILE.
wait_grep() {
    for _ in $(seq 100); do
        grep -qF -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}
# metric NAME [PORT]: the value of a series on the gateway's /metrics (PORT: $GW_PORT); empty when absent.
metric() { curl -sS -m 5 "http://127.0.0.1:${2:-$GW_PORT}/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }

# wait_done PID: up to 10 s for a background process to end.
wait_done() {
    for _ in $(seq 100); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    return 1
}

# A human-in-the-loop conversation (the demo agent's wait_decision knob): the run body asks for something
# that needs a confirmation; the decision body is decision-only (no user input, one tool message).
TOOLS='[{"name":"confirmAction","description":"Ask the user to confirm","parameters":{"type":"object","properties":{"action":{"type":"string"}}}}]'
# run_body THREAD RUN
run_body() {
    printf '{"threadId":"%s","runId":"%s","messages":[{"id":"m1","role":"user","content":"Please delete the temporary files"}],"tools":%s}' \
        "$1" "$2" "$TOOLS"
}
# decision_body THREAD RUN CONTENT: CONTENT is a JSON string.
decision_body() {
    printf '{"threadId":"%s","runId":"%s","messages":[{"id":"a1","role":"assistant","content":"","toolCalls":[{"id":"call_003","type":"function","function":{"name":"confirmAction","arguments":"{\\"action\\":\\"delete temporary files\\",\\"count\\":15}"}}]},{"id":"d1","role":"tool","toolCallId":"call_003","content":%s}],"tools":%s}' \
        "$1" "$2" "$3" "$TOOLS"
}
APPROVE='"{\"approved\":true}"'

finish() {
    # The failures again at the end, where a log's tail (CI prints the last lines) shows them.
    [ -n "$FAILED" ] && echo "failed checks:$FAILED"
    echo "$((CHECKS - FAILS)) passed, $FAILS failed"
    [ "$FAILS" -eq 0 ]
}
