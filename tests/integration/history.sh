#!/usr/bin/env bash
# Thread history end to end (doc/protocol.md#history): runs through the real gateway and demo agent are
# recorded (input deduplicated, the assistant's answer rebuilt), GET …/threads/{id}/messages pages them
# (the query's errors are 400s), unknown threads and threads a key may not see are 404s, the embedded
# store survives a restart, a kill -9 during a load of 1,000 runs loses no run that ended more than a
# second before the kill (and the event loops do no storage I/O meanwhile), nor what a run still streaming
# relayed more than a second before it, a detached run is recorded to
# its end, a disk that refuses writes stops no run and the commits resume once it has room,
# history.enabled false turns it all off, and a store on a read-only path stops the start with a
# clear message.
. "$AGW_SRCDIR/tests/integration/lib.sh"

start_demo demo --log-level warn || exit 1
D=http://127.0.0.1:$DEMO_PORT
h() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
J='Content-Type: application/json'
AUTH='Authorization: Bearer all-token'
STORE=$T/store

# config FILE [EXTRA]: EXTRA is more top-level keys (with a trailing comma).
config() {
    cat >"$1" <<JSON
{
  "listen": [ { "address": "127.0.0.1", "port": 0 } ],
  "auth": { "keys": [ { "id": "all", "sha256": "$(h all-token)", "agents": ["*"] },
                      { "id": "demo-only", "sha256": "$(h demo-token)", "agents": ["demo"] } ] },
  "agents": { "demo": { "upstreams": ["$D/agent"] },
              "other": { "upstreams": ["$D/agent"] },
              "fast": { "upstreams": ["$D/agent?delay_ms=0"] },
              "slow": { "upstreams": ["$D/agent?events=30&delay_ms=30"], "on_client_disconnect": "detach" },
              "trickle": { "upstreams": ["$D/agent?events=200&delay_ms=50&size=1000"] } },
  ${2:-}
  "store": { "kind": "embedded", "path": "$STORE" },
  "timeouts": { "drain": "2s" },
  "log": { "access": "off" }
}
JSON
}
config "$T/gw.json"
start_gateway "$T/gw.json" || exit 1
G=http://127.0.0.1:$GW_PORT/v1/ag-ui

run() { # AGENT BODY [TOKEN]: a whole run, its stream in $T/stream
    curl -sS -m 10 -N -H "$J" -H "Authorization: Bearer ${3:-all-token}" -d "$2" "$G/agents/$1/runs" >"$T/stream"
}
msgs() { # THREAD [QUERY] [TOKEN]
    http GET "$G/threads/$1/messages${2:+?$2}" -H "Authorization: Bearer ${3:-all-token}"
}
# jq-free field access: python3 reads the body.
field() { printf %s "$BODY" | python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }

# ---- a run is recorded: the user's message, then the assistant's rebuilt answer ----
run demo '{"threadId":"t1","runId":"r1","messages":[{"id":"u1","role":"user","content":"Hello"}]}'
check_contains "the run streamed" "RUN_FINISHED" "$(cat "$T/stream")"
msgs t1
check_eq "200 for a known thread" 200 "$STATUS"
check_eq "two messages" "u1 msg_2" "$(field '" ".join(m["id"] for m in d["messages"])')"
check_eq "roles" "user assistant" "$(field '" ".join(m["role"] for m in d["messages"])')"
check_eq "the assistant's text, assembled" "Hello! How can I help you?" "$(field 'd["messages"][1]["content"]')"
check_eq "has_more false" False "$(field 'd["has_more"]')"
check_eq "cursors left out on a whole thread" "False False" "$(field '"next_cursor" in d, "prev_cursor" in d' | tr -d '(),')"
check_contains "JSON" "application/json" "$(curl -sS -m 5 -D - -o /dev/null -H "$AUTH" "$G/threads/t1/messages")"

# ---- the client resends the whole history: nothing twice; a second run adds its own ----
run demo '{"threadId":"t1","runId":"r2","messages":[{"id":"u1","role":"user","content":"Hello"},{"id":"msg_2","role":"assistant","content":"Hello! How can I help you?"},{"id":"u3","role":"user","content":"What is the weather in Paris?"}]}'
msgs t1
check_eq "deduplicated by id, the second run's messages after" "u1 msg_2 u3 msg_4 msg_tool_3 msg_5" \
    "$(field '" ".join(m["id"] for m in d["messages"])')"
check_eq "the tool call on its assistant message, arguments assembled" 'call_007 get_weather {"city":"Paris"}' \
    "$(field '" ".join([d["messages"][3]["toolCalls"][0]["id"], d["messages"][3]["toolCalls"][0]["function"]["name"], d["messages"][3]["toolCalls"][0]["function"]["arguments"]])')"
check_eq "the tool result after its owner" "tool call_007" "$(field 'd["messages"][4]["role"] + " " + d["messages"][4]["toolCallId"]')"
msgs t1 "run_id=r2"
check_eq "run_id filters" "u3 msg_4 msg_tool_3 msg_5" "$(field '" ".join(m["id"] for m in d["messages"])')"
msgs t1 "limit=2"
check_eq "limit 2: the first two" "u1 msg_2 True 1" \
    "$(field '" ".join(m["id"] for m in d["messages"]) + " " + str(d["has_more"]) + " " + str(d["next_cursor"])')"
msgs t1 "limit=2&after=1"
check_eq "after=1: the next page" "u3 msg_4" "$(field '" ".join(m["id"] for m in d["messages"])')"
msgs t1 "order=desc&limit=1"
check_eq "desc: the newest first" "assistant" "$(field 'd["messages"][0]["role"]')"

# ---- errors ----
msgs nope
check_eq "unknown thread: 404" "404 thread not found: nope" "$STATUS $(field 'd["error"]')"
msgs t1 "limit=abc"
check_eq "a bad limit: 400" 400 "$STATUS"
check_contains "names the parameter" "limit" "$BODY"
msgs t1 "colour=blue"
check_eq "an unknown parameter: 400" 400 "$STATUS"
check_contains "names it" "colour" "$BODY"
msgs t1 "order=sideways"
check_eq "a bad order: 400" 400 "$STATUS"
http GET "$G/threads/t1/messages"
check_eq "no token: 401" 401 "$STATUS"
http GET "$G/threads/t1/messages" -H "Authorization: Bearer wrong"
check_eq "a wrong token: 401" 401 "$STATUS"

# ---- a key sees only threads of agents it may use ----
msgs t1 "" demo-token
check_eq "a demo-only key sees a demo thread" 200 "$STATUS"
run other '{"threadId":"t2","runId":"r1","messages":[{"id":"u1","role":"user","content":"Hi"}]}'
msgs t2 "" demo-token
check_eq "but not a thread of another agent (404, as if unknown)" "404 thread not found: t2" "$STATUS $(field 'd["error"]')"
msgs t2
check_eq "the key for every agent sees it" 200 "$STATUS"

# ---- a detached run is recorded to its end ----
curl -sS -m 1 -N -H "$J" -H "$AUTH" -d '{"threadId":"t3","runId":"r1","messages":[{"id":"u1","role":"user","content":"Tell me something"}]}' \
    "$G/agents/slow/runs" >/dev/null 2>&1
sleep 1.5 # 30 events 30 ms apart: the run ends about 0.9 s after its start, with nobody reading
msgs t3
check_eq "a detached run: its answer is recorded whole" "u1 msg_2" "$(field '" ".join(m["id"] for m in d["messages"])')"
WANT=$(curl -sS -m 10 -N -H "$J" -d '{"threadId":"t3","runId":"r1","messages":[{"id":"u1","role":"user","content":"Tell me something"}]}' \
    "$D/agent?events=30" | python3 -c '
import json, sys
print("".join(json.loads(l[6:]).get("delta", "") for l in sys.stdin if l.startswith("data: ") and "TEXT_MESSAGE_CONTENT" in l))')
check_eq "the detached answer has all its 30 parts" "$WANT" "$(field 'd["messages"][1]["content"]')"

# ---- restart: a clean stop loses nothing; the history is served again ----
msgs t1
BEFORE=$BODY
stop_pid "$GW_PID" >/dev/null
check_eq "clean stop" 0 "$STOP_STATUS"
start_gateway "$T/gw.json" || exit 1
G=http://127.0.0.1:$GW_PORT/v1/ag-ui
msgs t1
check_eq "after a restart: 200" 200 "$STATUS"
check_eq "after a restart: the same page" "$BEFORE" "$BODY"

# ---- kill -9 during 1,000 runs: no run that ended more than a second before the kill is lost ----
# Meanwhile, the event loops never touch the disk: the kernel's storage accounting of each thread
# (/proc/PID/task/TID/io: bytes read from storage, pages dirtied for it) over the load is zero for
# every thread but the store's writer ("agw-store"), whose bytes show that the accounting counts.
storage_io() { # PID -> "LOOPS_READ LOOPS_WRITTEN WRITER_READ WRITER_WRITTEN"
    python3 - "$1" <<'PY'
import os, sys
pid = sys.argv[1]
loops, writer = [0, 0], [0, 0]
for tid in os.listdir("/proc/%s/task" % pid):
    try:
        comm = open("/proc/%s/task/%s/comm" % (pid, tid)).read().strip()
        kv = dict(l.split(": ") for l in open("/proc/%s/task/%s/io" % (pid, tid)).read().splitlines())
    except OSError:
        continue
    acc = writer if comm == "agw-store" else loops
    acc[0] += int(kv["read_bytes"])
    acc[1] += int(kv["write_bytes"])
print(*loops, *writer)
PY
}
IO_BEFORE=$(storage_io "$GW_PID")
# A run still streaming at the kill (200 events 50 ms apart, a few KiB: far from a hand-over by size):
# what it relayed more than a second before the kill must be there after it. Its text deltas, each
# with the time it arrived.
python3 - "$G" "$T/trickle" <<'PY' &
import http.client, json, sys, time, urllib.parse
base, out = sys.argv[1], sys.argv[2]
u = urllib.parse.urlparse(base)
f = open(out, "w")
conn = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
conn.request("POST", u.path + "/agents/trickle/runs",
             json.dumps({"threadId": "trickle", "runId": "r1",
                         "messages": [{"id": "u1", "role": "user", "content": "Take your time"}]}),
             {"Content-Type": "application/json", "Authorization": "Bearer all-token"})
r = conn.getresponse()
try:
    for line in r:
        if line.startswith(b"data: ") and b"TEXT_MESSAGE_CONTENT" in line:
            f.write("%.3f %s\n" % (time.time(), json.dumps(json.loads(line[6:])["delta"])))
            f.flush()
except Exception:
    pass # the kill
PY
TRICKLE_PID=$!
sleep 1
python3 - "$G" "$T/ended" <<'PY' &
import http.client, json, sys, threading, time, urllib.parse
base, out = sys.argv[1], sys.argv[2]
u = urllib.parse.urlparse(base)
lock = threading.Lock()
ended = open(out, "w")
count = [0]
def worker(k):
    conn = None
    for i in range(k, 1000, 8):
        body = json.dumps({"threadId": "load-%d" % i, "runId": "r1",
                           "messages": [{"id": "u1", "role": "user", "content": "Hello"}]})
        try:
            conn = conn or http.client.HTTPConnection(u.hostname, u.port, timeout=5)
            conn.request("POST", u.path + "/agents/fast/runs", body,
                         {"Content-Type": "application/json", "Authorization": "Bearer all-token"})
            r = conn.getresponse()
            data = r.read()
            if r.status == 200 and b"RUN_FINISHED" in data:
                with lock:
                    ended.write("%d %.3f\n" % (i, time.time()))
                    ended.flush()
                    count[0] += 1
        except Exception:
            return
        # At most ~260 runs/s over 8 connections, then, past the 600 the kill waits for, ~30 runs/s:
        # the kill comes during the load even when a busy machine makes the waiting shell slow.
        time.sleep(0.03 if count[0] < 600 else 0.25)
ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
PY
LOAD_PID=$!
for _ in $(seq 600); do [ "$(cat "$T/ended" 2>/dev/null | wc -l)" -ge 600 ] && break; sleep 0.02; done
IO_AFTER=$(storage_io "$GW_PID")
KILL_AT=$(date +%s.%N)
kill -9 "$GW_PID"
wait "$LOAD_PID" "$TRICKLE_PID" 2>/dev/null
N_ENDED=$(wc -l <"$T/ended")
check_eq "the kill came during the load (600..999 runs ended)" yes \
    "$([ "$N_ENDED" -ge 600 ] && [ "$N_ENDED" -lt 1000 ] && echo yes || echo "no: $N_ENDED")"
start_gateway "$T/gw.json" || exit 1
G=http://127.0.0.1:$GW_PORT/v1/ag-ui
# One python process checks them all (one per run would take minutes).
python3 - "$G" "$T/ended" "$KILL_AT" >"$T/lost" <<'PY'
import http.client, sys, urllib.parse
base, ended, kill_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
u = urllib.parse.urlparse(base)
conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
lost = checked = 0
for line in open(ended):
    i, at = line.split()
    if float(at) >= kill_at - 1.0:
        continue
    checked += 1
    conn.request("GET", "%s/threads/load-%s/messages" % (u.path, i), headers={"Authorization": "Bearer all-token"})
    r = conn.getresponse()
    body = r.read()
    if r.status != 200 or b"How can I help you?" not in body:
        lost += 1
print(lost, checked)
PY
# The streaming run: its assistant message holds at least every delta that arrived more than 1 s
# before the kill, in order (what came after may or may not be there).
msgs trickle
check_eq "kill -9 mid-run: the streaming run's thread is there" 200 "$STATUS"
TRICKLE=$(printf %s "$BODY" | python3 -c '
import json, sys
kill_at, deltas = float(sys.argv[1]), [l.split(" ", 1) for l in open(sys.argv[2])]
want = "".join(json.loads(d) for at, d in deltas if float(at) < kill_at - 1.0)
if len(want) < 20:
    print("no: too few deltas before the kill (%d chars)" % len(want)); sys.exit()
got = [m for m in json.load(sys.stdin)["messages"] if m["role"] == "assistant"]
got = got[0].get("content", "") if got else ""
print("yes" if got.startswith(want) else "no: %d chars kept of the %d relayed before kill - 1 s" % (len(got), len(want)))
' "$KILL_AT" "$T/trickle")
check_eq "kill -9 mid-run: what a streaming run relayed more than 1 s before is kept" yes "$TRICKLE"
# Its deltas (1,000 bytes, 50 ms apart) were committed in pieces of 4 KiB or more: in the segment files
# (history.texts/), which the restart after the kill found whole.
check_eq "kill -9 mid-run: the streamed answer's pieces are in history.texts" yes \
    "$([ -s "$STORE/history.texts/00000001" ] && echo yes || echo "no: $(ls -la "$STORE/history.texts" 2>&1 | tr '\n' ' ')")"
read -r lost checked <"$T/lost"
check_eq "kill -9: every run ended more than 1 s before it is there ($checked checked)" 0 "$lost"
check_eq "kill -9: runs were checked" yes "$([ "$checked" -ge 100 ] && echo yes || echo "no: $checked")"
read -r lr0 lw0 wr0 ww0 <<<"$IO_BEFORE"
read -r lr1 lw1 wr1 ww1 <<<"$IO_AFTER"
check_eq "the event loops read and wrote no storage during the load (bytes read, written)" "0 0" \
    "$((lr1 - lr0)) $((lw1 - lw0))"
check_eq "the store's writer did (its bytes are counted)" yes \
    "$([ $((ww1 - ww0)) -gt 0 ] && echo yes || echo "no: $IO_BEFORE -> $IO_AFTER")"
stop_pid "$GW_PID" >/dev/null

# ---- a second gateway on the same store is refused ----
start_gateway "$T/gw.json" || exit 1
"$AGW_GATEWAY" -c "$T/gw.json" >"$T/second.log" 2>&1
check_eq "a second gateway on the same store: exit 1" 1 "$?"
check_contains "says the store is in use" "is in use by another gateway" "$(cat "$T/second.log")"
stop_pid "$GW_PID" >/dev/null

# ---- a disk that refuses writes: runs go on, the commits are retried, and resume ----
# The gateway's file-size limit is lowered under it (prlimit), which fails the store's writes as a
# full disk does (and would kill a process that did not ignore SIGXFSZ).
start_gateway "$T/gw.json" || exit 1
G=http://127.0.0.1:$GW_PORT/v1/ag-ui
prlimit --pid "$GW_PID" --fsize=4096:
for i in 1 2 3; do
    run demo "{\"threadId\":\"full$i\",\"runId\":\"r1\",\"messages\":[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hello\"}]}"
    check_contains "disk full: run $i streams to its end" "RUN_FINISHED" "$(cat "$T/stream")"
done
errors=0
for _ in $(seq 50); do
    errors=$(metric agw_history_commit_errors_total)
    [ "${errors:-0}" -ge 2 ] && break
    sleep 0.1
done
check_eq "disk full: commits fail and are retried" yes "$([ "${errors:-0}" -ge 2 ] && echo yes || echo "no: $errors")"
check_eq "disk full: the gateway is alive" 0 "$(kill -0 "$GW_PID"; echo $?)"
msgs full3
check_eq "disk full: the thread is served from memory" "u1 msg_2" "$(field '" ".join(m["id"] for m in d["messages"])')"
check_contains "disk full: logged" "commit failed" "$(cat "$GW_LOG")"
commits=$(metric agw_history_commits_total)
prlimit --pid "$GW_PID" --fsize=unlimited:
wait_grep "$GW_LOG" "commits succeed again"
check_eq "room again: commits resume" yes "$([ "$(metric agw_history_commits_total)" -gt "$commits" ] && echo yes || echo no)"
check_eq "no thread gave up its changes" 0 "$(metric agw_history_threads_unsaved_total)"
stop_pid "$GW_PID" >/dev/null
check_eq "room again: a clean stop" 0 "$STOP_STATUS"
start_gateway "$T/gw.json" || exit 1
G=http://127.0.0.1:$GW_PORT/v1/ag-ui
msgs full1
check_eq "after the restart: what waited for the disk was written" "200 u1 msg_2" "$STATUS $(field '" ".join(m["id"] for m in d["messages"])')"
stop_pid "$GW_PID" >/dev/null

# ---- history off ----
config "$T/off.json" '"history": { "enabled": false },'
start_gateway "$T/off.json" || exit 1
G=http://127.0.0.1:$GW_PORT/v1/ag-ui
run demo '{"threadId":"t9","runId":"r1","messages":[{"id":"u1","role":"user","content":"Hello"}]}'
msgs t9
check_eq "history off: 404" 404 "$STATUS"
check_contains "says history is off" "history.enabled" "$BODY"
stop_pid "$GW_PID" >/dev/null

# ---- a store on a read-only path stops the start ----
# As root (as CI runs) permission bits bind only without CAP_DAC_OVERRIDE: the gateway is then started
# without it (and without CAP_DAC_READ_SEARCH), as a user would be.
AS_USER=()
[ "$(id -u)" = 0 ] && AS_USER=(setpriv --inh-caps=-dac_override,-dac_read_search
    --bounding-set=-dac_override,-dac_read_search --)
mkdir -p "$T/ro" && chmod 500 "$T/ro"
STORE=$T/ro/store
config "$T/ro.json"
"${AS_USER[@]}" "$AGW_GATEWAY" -c "$T/ro.json" >"$T/ro.log" 2>&1
check_eq "read-only store path: exit 1" 1 "$?"
check_contains "names the path" "$T/ro/store" "$(cat "$T/ro.log")"
check_contains "says why" "Permission denied" "$(cat "$T/ro.log")"
chmod 700 "$T/ro"
# The same path made, but read-only: the gateway cannot make its files there.
mkdir -p "$T/ro/store" && chmod 500 "$T/ro/store"
"${AS_USER[@]}" "$AGW_GATEWAY" -c "$T/ro.json" >"$T/ro2.log" 2>&1
check_eq "read-only store directory: exit 1" 1 "$?"
check_contains "names the directory" "$T/ro/store/" "$(cat "$T/ro2.log")"
check_contains "says why" "Permission denied" "$(cat "$T/ro2.log")"
chmod 700 "$T/ro/store"
# A file where the directory should be.
: >"$T/ro-file"
STORE=$T/ro-file/store
config "$T/ro.json"
"$AGW_GATEWAY" -c "$T/ro.json" >"$T/ro.log" 2>&1
check_eq "unusable store path: exit 1" 1 "$?"
check_contains "names the path" "$T/ro-file" "$(cat "$T/ro.log")"
printf 'not a database, just text\n%.0s' $(seq 100) >"$T/bad.db.txt"
mkdir -p "$T/bad" && cp "$T/bad.db.txt" "$T/bad/history.db"
STORE=$T/bad
config "$T/bad.json"
"$AGW_GATEWAY" -c "$T/bad.json" >"$T/bad.log" 2>&1
check_eq "a corrupt store: exit 1" 1 "$?"
check_contains "says it is not a database" "not a database" "$(cat "$T/bad.log")"

finish
