#!/usr/bin/env bash
# A disk that fills and empties under load: runs through a sanitized gateway recording thread history
# while its store's disk refuses writes for a while and then has room again, over and over (the
# gateway's file-size limit lowered and lifted with prlimit, which fails the database's writes as a
# full disk does). Checks that no run fails, that the commits fail and resume, that the gateway's
# memory stays bounded (threads past history.cache_threads give up their unwritten changes, counted),
# that it drains cleanly with no sanitizer report, and that afterwards the database passes SQLite's
# integrity check and a fresh gateway serves every thread drawn from it. See doc/internals/store.md
# ("Durability") and doc/benchmarks.md.
#
# usage: bench/full-disk.sh [--build DIR] [--cycles N] [--full-s S] [--room-s S] [--cache N]
#   BUILD (env) or --build: a built tree (default <srcdir>/_build-san; any build works, the sanitizers
#   make it a check). --cycles (15) of --full-s (2) seconds full and --room-s (2) with room;
#   history.cache_threads --cache (50). The load: 20 concurrent runs of 40 events of 300 bytes, a new
#   thread every 3 runs, for the whole time. RSS_TOLERANCE_KIB (65536): the growth allowed from the
#   second cycle to the last.
# Needs bash, python3 (with its sqlite3 module), curl, prlimit (util-linux). Everything runs on
# 127.0.0.1 with ephemeral ports, in a temporary directory; every process started here is stopped on
# exit. Exit status 0 only when every check held.
set -u

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$SRC/_build-san}
CYCLES=15
FULL_S=2
ROOM_S=2
CACHE=50
RSS_TOLERANCE_KIB=${RSS_TOLERANCE_KIB:-65536}

while [ $# -gt 0 ]; do
    case "$1" in
    --build) BUILD=$2; shift ;;
    --cycles) CYCLES=$2; shift ;;
    --full-s) FULL_S=$2; shift ;;
    --room-s) ROOM_S=$2; shift ;;
    --cache) CACHE=$2; shift ;;
    -h | --help) sed -n '2,/^set -u$/{/^set -u$/d;p}' "$0"; exit 0 ;;
    *) echo "bench/full-disk.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for f in src/agui-gateway src/agui-demo-agent bench/agw-load; do
    [ -x "$BUILD/$f" ] || { echo "bench/full-disk.sh: $BUILD/$f is not built (make -C $BUILD)" >&2; exit 2; }
done
command -v prlimit >/dev/null || { echo "bench/full-disk.sh: needs prlimit (util-linux)" >&2; exit 2; }

T=$(mktemp -d "${TMPDIR:-/tmp}/agw-full-disk.XXXXXX")
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
FAILED=0
check() { # NAME OK(yes/no) DETAIL
    if [ "$2" = yes ]; then echo "ok: $1 ($3)"; else echo "FAIL: $1 ($3)"; FAILED=1; fi
}
wait_file() { for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
metric() { curl -sS -m 5 "http://127.0.0.1:$PORT/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }

TOKEN=full-disk-token-0123456789
SHA=$(printf %s "$TOKEN" | "$BUILD/src/agui-gateway" hash-token)
export ASAN_OPTIONS="log_path=$T/asan:detect_leaks=1:quarantine_size_mb=64"
export UBSAN_OPTIONS="log_path=$T/ubsan:print_stacktrace=1"
"$BUILD/src/agui-demo-agent" --listen 127.0.0.1:0 --port-file "$T/demo.port" --log-level warn \
    >"$T/demo.log" 2>&1 &
PIDS+=($!)
wait_file "$T/demo.port" || { echo "the demo agent did not start" >&2; exit 1; }
config() {
    cat >"$T/gw.json" <<EOF
{"listen": [{"address": "127.0.0.1", "port": 0}],
 "auth": {"keys": [{"id": "b", "sha256": "$SHA", "agents": ["*"]}]},
 "log": {"level": "info", "access": "off"},
 "history": {"enabled": true, "cache_threads": $CACHE},
 "store": {"kind": "embedded", "path": "$T/store"},
 "agents": {"a": {"upstreams": ["http://127.0.0.1:$(head -n1 "$T/demo.port")/agent?events=40&size=300&ids=run&write_each=1"]}}}
EOF
}
config
"$BUILD/src/agui-gateway" -c "$T/gw.json" --port-file "$T/gw.port" >"$T/gw.log" 2>&1 &
GP=$!
PIDS+=($GP)
wait_file "$T/gw.port" || { echo "the gateway did not start: $(tail -3 "$T/gw.log")" >&2; exit 1; }
PORT=$(head -n1 "$T/gw.port")
SECS=$((CYCLES * (FULL_S + ROOM_S) + 2))
"$BUILD/bench/agw-load" --url "http://127.0.0.1:$PORT/v1/ag-ui/agents/a/runs" \
    --header "Authorization: Bearer $TOKEN" --concurrency 20 --seconds "$SECS" --runs-per-thread 3 \
    >"$T/load.json" 2>"$T/load.err" &
LP=$!
PIDS+=($LP)
rss_first=""
for i in $(seq "$CYCLES"); do
    prlimit --pid "$GP" --fsize=65536:
    sleep "$FULL_S"
    prlimit --pid "$GP" --fsize=unlimited:
    sleep "$ROOM_S"
    rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$GP/status")
    [ "$i" = 2 ] && rss_first=$rss
    echo "cycle $i: RSS $rss KiB, commits $(metric agw_history_commits_total), failed $(metric agw_history_commit_errors_total), threads given up $(metric agw_history_threads_unsaved_total), cached $(metric agw_history_cached_threads)"
done
wait "$LP"
errors=$(metric agw_history_commit_errors_total)
commits=$(metric agw_history_commits_total)
unsaved=$(metric agw_history_threads_unsaved_total)
kill -TERM "$GP"
wait "$GP"
status=$?
read -r runs_ok runs_failed < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["runs_ok"], d["runs_failed"])' "$T/load.json")
check "every run streamed to its end" "$([ "$runs_failed" = 0 ] && [ "$runs_ok" -gt 0 ] && echo yes || echo no)" "$runs_ok ok, $runs_failed failed"
check "commits failed while the disk was full" "$([ "${errors:-0}" -ge "$CYCLES" ] && echo yes || echo no)" "$errors failed"
check "and resumed once it had room" "$([ "${commits:-0}" -ge "$CYCLES" ] && echo yes || echo no)" "$commits made"
check "threads past the cache gave up their changes, counted" "$([ "${unsaved:-0}" -gt 0 ] && echo yes || echo no)" "$unsaved"
check "RSS bounded" "$([ $((rss - rss_first)) -le "$RSS_TOLERANCE_KIB" ] && echo yes || echo no)" "cycle 2: $rss_first KiB, last: $rss KiB, tolerance $RSS_TOLERANCE_KIB"
check "a clean drain" "$([ "$status" = 0 ] && echo yes || echo no)" "exit status $status"
reports=$(cat "$T"/asan* "$T"/ubsan* 2>/dev/null | wc -l)
check "no sanitizer report" "$([ "$reports" = 0 ] && echo yes || echo no)" "$reports lines"
integrity=$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("PRAGMA integrity_check").fetchone()[0])' "$T/store/history.db")
check "the database's integrity" "$([ "$integrity" = ok ] && echo yes || echo no)" "$integrity"
# A fresh gateway on the same store serves every thread the database holds (up to 300 drawn at random).
"$BUILD/src/agui-gateway" -c "$T/gw.json" --port-file "$T/gw2.port" >"$T/gw2.log" 2>&1 &
GP=$!
PIDS+=($GP)
wait_file "$T/gw2.port" || { echo "the second gateway did not start: $(tail -3 "$T/gw2.log")" >&2; exit 1; }
PORT=$(head -n1 "$T/gw2.port")
served=$(python3 - "$T/store/history.db" "$PORT" "$TOKEN" <<'EOF'
import json, sqlite3, sys, urllib.error, urllib.request
db, port, token = sys.argv[1:]
ids = [r[0] for r in sqlite3.connect(db).execute("SELECT id FROM threads ORDER BY random() LIMIT 300")]
bad = 0
for i in ids:
    req = urllib.request.Request("http://127.0.0.1:%s/v1/ag-ui/threads/%s/messages?limit=200" % (port, i),
                                 headers={"Authorization": "Bearer " + token})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            if not json.load(r)["messages"]:
                bad += 1
    except urllib.error.HTTPError:
        bad += 1
print(len(ids), bad)
EOF
)
read -r drawn bad <<<"$served"
check "a fresh gateway serves the threads stored" "$([ "${drawn:-0}" -gt 0 ] && [ "$bad" = 0 ] && echo yes || echo no)" "$drawn drawn, $bad not served"
kill -TERM "$GP"
wait "$GP"
[ "$FAILED" = 0 ] && echo "PASS" || echo "FAIL"
exit "$FAILED"
