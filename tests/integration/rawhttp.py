#!/usr/bin/env python3
"""rawhttp.py: send EXACT bytes to an HTTP/1.1 server and report, machine-readably, what came back.

Test tooling for tests/integration/edge.sh (python3, stdlib only). One connection (or --conns N of them)
to 127.0.0.1:PORT; the actions are applied in order:

  --send STR          bytes given as a Python-escaped string: \\r \\n \\t \\0 \\xNN \\\\ are understood
  --send-hex HEX      bytes given in hex ("474554" or "47 45 54")
  --send-file FILE    the bytes of FILE
  --send-repeat N STR STR (escaped) repeated N times
  --sleep S           pause S seconds (consecutive --send* without a --sleep between them go out in ONE write)
  --drip S            every later --send* goes out one byte at a time, S seconds between bytes
  --shutdown-wr       shutdown(SHUT_WR) after the last action

Reading (single connection): the answer is read while the request is still being written (a server may
answer and close early). Reading stops at EOF, at a reset, after --max-responses final responses (then
--linger S more seconds are given to the server to close), or --read-timeout S seconds after the last action
(default 5). --no-read / --hold S: never read; keep the connection S seconds (until killed with --hold 0 = for
ever), then close.

Output: one "key=value" line per fact (values escaped like the input: \\r \\n \\xNN, so one line each), in
--out FILE or on stdout. --get KEY (repeatable) prints only those values, space-separated.

  responses   final (non-1xx) responses fully received
  interim     1xx responses received
  statuses    final statuses in order, comma-separated ("200,404"); "" when none
  end         eof: the server closed; reset: ECONNRESET or EPIPE (on a read, or on a write before the EOF was
              seen); open: stopped after --max-responses with the connection still open; timeout:
              --read-timeout ran out with the connection open; refused: no connection
  end_ms      when the end happened, in ms since the connection was made
  sent        bytes written; send_error: the error that stopped writing (or "")
  first_byte_ms  first byte of the answer (-1: none)
  partial     1 when bytes follow the last complete response (an incomplete or unparseable answer)
  trailing    those bytes (escaped, at most 300)
  rN.status rN.line rN.ms rN.body rN.body_len rN.h.<lower-case name> (repeated fields joined with ", ")
  rN.chunked  1 when the body was chunked; rN.events: AG-UI event types of a text/event-stream body
              (space-separated; at most the first 20 and the last 20); rN.events_count; rN.last_event
  rN.interim  statuses of the 1xx answers that came before response N

--conns N (with --hold S or --read-timeout S): N connections, made without blocking (those still pending after
--connect-timeout count as failed), each applying the same actions; prints connected, connect_failed,
connect_ms, and over the connections: eof, reset, open, statuses (status:count,...), max_end_ms. --ready-file F
gets the connect figures once every connection is made and its bytes are sent.

--batch DIR: runs every DIR/*.args case at once, one connection each (python starts once: slow on a loaded
machine). A case file holds NUL-separated arguments: the case's name, then the options above (no --port,
--conns, --batch); its summary goes to its --out, else DIR/<name>.out.

Examples (the shell expands nothing: the escapes are rawhttp's):
  rawhttp.py --port P --send 'GET /healthz HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n' --max-responses 1 --get statuses
  rawhttp.py --port P --send 'GET /healthz HTTP/1.1\\r\\nHost: x\\r\\n' --send-repeat 30000 'a:\\r\\n' --get statuses --get end
  rawhttp.py --port P --drip 1 --send 'GET / HTTP/1.1\\r\\nHost: x\\r\\n' --read-timeout 10 --get end_ms
(An argument that starts with "-" is given as --send=-1\\r\\n.)
"""

import argparse
import errno
import os
import resource
import selectors
import signal
import socket
import sys
import time


def unescape(s):
    """Python-style escapes of a str into bytes; every other character is its UTF-8 encoding."""
    out = bytearray()
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c != "\\" or i + 1 == n:
            out += c.encode("utf-8")
            i += 1
            continue
        e = s[i + 1]
        simple = {"r": b"\r", "n": b"\n", "t": b"\t", "0": b"\0", "\\": b"\\", "'": b"'", '"': b'"', "e": b"\x1b"}
        if e in simple:
            out += simple[e]
            i += 2
        elif e == "x" and i + 3 < n + 1:
            out.append(int(s[i + 2:i + 4], 16))
            i += 4
        else:
            out += b"\\" + e.encode("utf-8")
            i += 2
    return bytes(out)


def escape(b, limit=None):
    if limit is not None and len(b) > limit:
        b = b[:limit]
    out = []
    for x in b:
        if x == 0x5C:
            out.append("\\\\")
        elif x == 0x0D:
            out.append("\\r")
        elif x == 0x0A:
            out.append("\\n")
        elif 0x20 <= x < 0x7F:
            out.append(chr(x))
        else:
            out.append("\\x%02x" % x)
    return "".join(out)


class Response:
    def __init__(self):
        self.line = b""
        self.status = 0
        self.headers = []
        self.body = bytearray()
        self.chunked = False
        self.ms = -1
        self.interim = []

    def header(self, name):
        if isinstance(name, str):
            name = name.encode("latin-1")
        vals = [v for (k, v) in self.headers if k.lower() == name.lower()]
        return b", ".join(vals) if vals else None


class Parser:
    """Incremental HTTP/1.x response parser: heads, 1xx interim answers, Content-Length, chunked and
    close-delimited bodies. Keeps every body (bounded by --max-body)."""

    def __init__(self, max_body):
        self.buf = bytearray()
        self.pos = 0
        self.done = []  # complete final responses
        self.interim_count = 0
        self.pending_interim = []
        self.cur = None  # response being read (head complete)
        self.mode = None  # "length", "chunked", "close"
        self.left = 0
        self.chunk_state = "size"
        self.max_body = max_body
        self.broken = False  # the bytes are not an HTTP response

    def _add_body(self, data):
        room = self.max_body - len(self.cur.body)
        if room > 0:
            self.cur.body += data[:room]
        self.cur.body_len += len(data)

    def feed(self, data, now_ms):
        self.buf += data
        while not self.broken and self._step(now_ms):
            pass
        if self.pos > 1 << 20:
            del self.buf[:self.pos]
            self.pos = 0

    def _line(self):
        i = self.buf.find(b"\n", self.pos)
        if i < 0:
            return None
        line = bytes(self.buf[self.pos:i])
        self.pos = i + 1
        return line[:-1] if line.endswith(b"\r") else line

    def _finish(self, now_ms):
        self.cur.ms = now_ms
        self.done.append(self.cur)
        self.cur = None
        self.mode = None

    def _step(self, now_ms):
        if self.cur is None:
            if self.pos >= len(self.buf):
                return False
            if not bytes(self.buf[self.pos:self.pos + 5]).startswith(b"HTTP/"[: len(self.buf) - self.pos]):
                self.broken = True
                return False
            end = self.buf.find(b"\r\n\r\n", self.pos)
            end2 = self.buf.find(b"\n\n", self.pos)
            if end < 0 and end2 < 0:
                return False
            if end < 0 or (0 <= end2 < end):
                head, nxt = bytes(self.buf[self.pos:end2]), end2 + 2
            else:
                head, nxt = bytes(self.buf[self.pos:end]), end + 4
            lines = head.replace(b"\r\n", b"\n").split(b"\n")
            r = Response()
            r.body_len = 0
            r.line = lines[0]
            parts = lines[0].split(b" ", 2)
            try:
                r.status = int(parts[1])
            except (IndexError, ValueError):
                self.broken = True
                return False
            for ln in lines[1:]:
                k, _, v = ln.partition(b":")
                r.headers.append((k.strip(), v.strip()))
            self.pos = nxt
            if 100 <= r.status < 200 and r.status != 101:
                self.interim_count += 1
                self.pending_interim.append(r.status)
                return True
            r.interim = self.pending_interim
            self.pending_interim = []
            self.cur = r
            te = (r.header("Transfer-Encoding") or b"").lower()
            cl = r.header("Content-Length")
            if r.status in (204, 304):
                self._finish(now_ms)
            elif b"chunked" in te:
                r.chunked = True
                self.mode = "chunked"
                self.chunk_state = "size"
            elif cl is not None:
                try:
                    self.left = int(cl)
                except ValueError:
                    self.broken = True
                    return False
                self.mode = "length"
                if self.left == 0:
                    self._finish(now_ms)
            else:
                self.mode = "close"
            return True
        if self.mode == "length":
            take = min(self.left, len(self.buf) - self.pos)
            if take == 0:
                return False
            self._add_body(bytes(self.buf[self.pos:self.pos + take]))
            self.pos += take
            self.left -= take
            if self.left == 0:
                self._finish(now_ms)
            return True
        if self.mode == "close":
            if self.pos >= len(self.buf):
                return False
            self._add_body(bytes(self.buf[self.pos:]))
            self.pos = len(self.buf)
            return False
        # chunked
        if self.chunk_state == "size":
            save = self.pos
            line = self._line()
            if line is None:
                return False
            try:
                n = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                self.pos = save
                self.broken = True
                return False
            if n == 0:
                self.chunk_state = "trailer"
            else:
                self.left = n
                self.chunk_state = "data"
            return True
        if self.chunk_state == "data":
            take = min(self.left, len(self.buf) - self.pos)
            if take == 0:
                return False
            self._add_body(bytes(self.buf[self.pos:self.pos + take]))
            self.pos += take
            self.left -= take
            if self.left == 0:
                self.chunk_state = "crlf"
            return True
        if self.chunk_state == "crlf":
            line = self._line()
            if line is None:
                return False
            self.chunk_state = "size"
            return True
        if self.chunk_state == "trailer":
            line = self._line()
            if line is None:
                return False
            if line == b"":
                self._finish(now_ms)
            return True
        return False

    def eof(self, now_ms):
        if self.cur is not None and self.mode == "close":
            self._finish(now_ms)


def sse_events(body):
    import json

    types = []
    for line in bytes(body).split(b"\n"):
        if line.startswith(b"data:"):
            try:
                ev = json.loads(line[5:].strip())
                types.append(str(ev.get("type", "?")) if isinstance(ev, dict) else "?")
            except ValueError:
                types.append("?")
    return types


def build_steps(actions):
    """[(kind, value)] -> list of ("data", bytes, drip) / ("sleep", s), consecutive data merged."""
    steps = []
    drip = 0.0
    for kind, val in actions:
        if kind == "drip":
            drip = float(val)
            continue
        if kind == "sleep":
            steps.append(("sleep", float(val), 0))
            continue
        if kind == "send":
            data = unescape(val)
        elif kind == "send-hex":
            data = bytes.fromhex(val.replace(" ", ""))
        elif kind == "send-file":
            with open(val, "rb") as f:
                data = f.read()
        elif kind == "send-repeat":
            n, s = val
            data = unescape(s) * int(n)
        else:
            raise SystemExit("unknown action " + kind)
        if drip > 0:
            for i in range(len(data)):
                steps.append(("data", data[i:i + 1], 0))
                steps.append(("sleep", drip, 0))
        elif steps and steps[-1][0] == "data" and steps[-1][2] == 0:
            steps[-1] = ("data", steps[-1][1] + data, 0)
        else:
            steps.append(("data", data, 0))
    return steps


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, n)) if hard != resource.RLIM_INFINITY else max(soft, n)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def connect(host, port, rcvbuf, timeout):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    s.connect((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setblocking(False)
    return s


def run_one(args, steps):
    out = {}
    t0 = time.monotonic()

    def ms():
        return int((time.monotonic() - t0) * 1000)

    try:
        s = connect(args.host, args.port, args.rcvbuf, 5)
    except OSError as e:
        return {"connect_error": e.strerror or str(e), "responses": 0, "statuses": "", "end": "refused",
                "end_ms": ms()}
    t0 = time.monotonic()
    p = Parser(args.max_body)
    sel = selectors.DefaultSelector()
    sent = 0
    send_error = ""
    first_byte = -1
    end = None
    end_ms = -1
    reading = not args.no_read
    queue = list(steps)
    cur = b""
    wake = 0.0  # for sleeps
    done_sending_at = None
    stop_at_max = None
    reset_seen = False
    sel.register(s, selectors.EVENT_READ)

    def set_end(kind):
        nonlocal end, end_ms
        if end is None:
            end, end_ms = kind, ms()

    while end is None:
        now = time.monotonic()
        # advance the sending side
        while not cur and queue and now >= wake and not send_error:
            kind, val, _ = queue.pop(0)
            if kind == "sleep":
                wake = now + val
            else:
                cur = val
        if not cur and not queue and done_sending_at is None and now >= wake:
            done_sending_at = now
            if args.shutdown_wr and not send_error:
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError as e:
                    send_error = errno.errorcode.get(e.errno, str(e))
        if send_error and done_sending_at is None:
            done_sending_at = now
            queue = []
            cur = b""
        if cur:
            try:
                n = s.send(cur[:65536])
                sent += n
                cur = cur[n:]
            except BlockingIOError:
                pass
            except OSError as e:
                send_error = errno.errorcode.get(e.errno, str(e))
                # The error is reported once, to whichever call comes first: a later recv() sees a
                # plain EOF, so remember that the connection was reset.
                if e.errno in (errno.ECONNRESET, errno.EPIPE):
                    reset_seen = True
                cur = b""
        # deadlines
        if done_sending_at is not None:
            if args.no_read:
                hold = args.hold
                if hold > 0 and now - done_sending_at >= hold:
                    set_end("held")
                    break
            elif now - done_sending_at >= args.read_timeout:
                set_end("timeout")
                break
        if stop_at_max is not None and now >= stop_at_max:
            set_end("open")
            break
        # wait for readability (or the next send / sleep)
        tmo = 0.05
        if cur:
            tmo = 0.001 if not reading else 0.005
        if not reading:
            time.sleep(0.05 if not cur else 0.001)
            continue
        events = sel.select(tmo)
        if not events:
            continue
        try:
            data = s.recv(262144)
        except BlockingIOError:
            continue
        except OSError as e:
            if e.errno in (errno.ECONNRESET, errno.EPIPE):
                set_end("reset")
            else:
                set_end(errno.errorcode.get(e.errno, "error"))
            break
        if not data:
            p.eof(ms())
            set_end("reset" if reset_seen else "eof")
            break
        if first_byte < 0:
            first_byte = ms()
        p.feed(data, ms())
        if args.max_responses and len(p.done) >= args.max_responses and stop_at_max is None:
            stop_at_max = time.monotonic() + args.linger
    try:
        s.close()
    except OSError:
        pass
    out["responses"] = len(p.done)
    out["interim"] = p.interim_count
    out["statuses"] = ",".join(str(r.status) for r in p.done)
    out["end"] = end
    out["end_ms"] = end_ms
    out["sent"] = sent
    out["send_error"] = send_error
    out["first_byte_ms"] = first_byte
    rest = bytes(p.buf[p.pos:])
    out["partial"] = 1 if (rest or p.cur is not None or p.broken) else 0
    out["trailing"] = escape(rest, 300)
    if p.cur is not None:  # an incomplete last response: show what was read of it
        out["incomplete.status"] = p.cur.status
        out["incomplete.events"] = " ".join(sse_events(p.cur.body)[-20:])
    for i, r in enumerate(p.done, 1):
        k = "r%d." % i
        out[k + "status"] = r.status
        out[k + "line"] = escape(r.line)
        out[k + "ms"] = r.ms
        out[k + "interim"] = ",".join(str(x) for x in r.interim)
        out[k + "chunked"] = 1 if r.chunked else 0
        out[k + "body_len"] = r.body_len
        out[k + "body"] = escape(bytes(r.body), args.print_body)
        for name in sorted({h[0].lower() for h in r.headers}):
            out[k + "h." + escape(name)] = escape(r.header(name))
        if b"text/event-stream" in (r.header("Content-Type") or b""):
            ev = sse_events(r.body)
            out[k + "events_count"] = len(ev)
            shown = ev if len(ev) <= 40 else ev[:20] + ["..."] + ev[-20:]
            out[k + "events"] = " ".join(shown)
            out[k + "last_event"] = ev[-1] if ev else ""
        if args.body_dir:
            with open(os.path.join(args.body_dir, "r%d.body" % i), "wb") as f:
                f.write(bytes(r.body))
    return out


def flush_all(socks, data, parsers, gone, deadline):
    """Writes <data> on every socket (not gone yet) before <deadline>, reading what comes meanwhile."""
    sel = selectors.DefaultSelector()
    left = {}
    for s in socks:
        if s not in gone:
            left[s] = data
            sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
    while left and time.monotonic() < deadline:
        for key, mask in sel.select(0.05):
            s = key.fileobj
            if s not in left:
                continue
            if mask & selectors.EVENT_READ:
                try:
                    got = s.recv(65536)
                except BlockingIOError:
                    got = b"-"
                except OSError:
                    got = None
                if got is None or got == b"":
                    gone[s] = "reset" if got is None else "eof"
                    sel.unregister(s)
                    del left[s]
                    continue
                if got != b"-":
                    parsers[s].feed(got, 0)
            if mask & selectors.EVENT_WRITE:
                try:
                    n = s.send(left[s][:65536])
                    left[s] = left[s][n:]
                except BlockingIOError:
                    pass
                except OSError:
                    left[s] = b""  # the server closed: its answer (or reset) is read later
                if not left[s]:
                    sel.unregister(s)
                    del left[s]
    sel.close()


def run_many(args, steps):
    """--conns N: N connections, same bytes on each (sleeps apply to all). Connections are made without
    blocking: the ones a full accept queue leaves pending after --connect-timeout count as connect_failed."""
    raise_nofile(args.conns + 64)
    t0 = time.monotonic()
    pending = {}
    socks = []
    failed = 0
    first_error = ""
    sel = selectors.DefaultSelector()
    for _ in range(args.conns):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if args.rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, args.rcvbuf)
        s.setblocking(False)
        rc = s.connect_ex((args.host, args.port))
        if rc == 0:
            socks.append(s)
        elif rc in (errno.EINPROGRESS, errno.EAGAIN):
            pending[s] = True
            sel.register(s, selectors.EVENT_WRITE)
        else:
            failed += 1
            first_error = first_error or os.strerror(rc)
            s.close()
    deadline = time.monotonic() + args.connect_timeout
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(0.05):
            s = key.fileobj
            sel.unregister(s)
            del pending[s]
            rc = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if rc == 0:
                socks.append(s)
            else:
                failed += 1
                first_error = first_error or os.strerror(rc)
                s.close()
    for s in list(pending):
        failed += 1
        first_error = first_error or "connect timed out"
        sel.unregister(s)
        s.close()
    sel.close()
    parsers = {s: Parser(4096) for s in socks}
    gone = {}  # socket -> "eof" / "reset", for connections the server ended while we were still writing
    for kind, val, _ in steps:
        if kind == "sleep":
            time.sleep(val)
            continue
        flush_all(socks, val, parsers, gone, time.monotonic() + args.send_timeout)
    if args.shutdown_wr:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
    res = {"connected": len(socks), "connect_failed": failed, "connect_error": first_error,
           "connect_ms": int((time.monotonic() - t0) * 1000)}
    if args.ready_file:
        with open(args.ready_file + ".tmp", "w") as f:
            f.write("\n".join("%s=%s" % kv for kv in res.items()) + "\n")
        os.rename(args.ready_file + ".tmp", args.ready_file)
    ends = {"eof": 0, "reset": 0, "open": 0}
    statuses = {}
    max_end = -1
    start = time.monotonic()
    if args.no_read:
        while args.hold <= 0 or time.monotonic() - start < args.hold:
            time.sleep(0.1)
        ends["open"] = len(socks)
    else:
        sel = selectors.DefaultSelector()
        for s in socks:
            if s not in gone:
                sel.register(s, selectors.EVENT_READ)
        for kind in gone.values():
            ends[kind] += 1
        live = set(socks) - set(gone)
        limit = args.hold if args.hold > 0 else args.read_timeout
        while live and time.monotonic() - start < limit:
            for key, _ in sel.select(0.1):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = None
                now_ms = int((time.monotonic() - t0) * 1000)
                if data:
                    parsers[s].feed(data, now_ms)
                    continue
                ends["reset" if data is None else "eof"] += 1
                max_end = max(max_end, now_ms)
                sel.unregister(s)
                live.discard(s)
        ends["open"] = len(live)
        for p in parsers.values():
            for r in p.done:
                statuses[r.status] = statuses.get(r.status, 0) + 1
    for s in socks:
        try:
            s.close()
        except OSError:
            pass
    res.update(ends)
    res["statuses"] = ",".join("%d:%d" % kv for kv in sorted(statuses.items()))
    res["max_end_ms"] = max_end
    return res


class Ordered(argparse.Action):
    def __call__(self, parser, ns, values, option_string=None):
        ns.actions = list(getattr(ns, "actions", None) or []) + [(self.dest, values)]


def make_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int)
    for name in ("send", "send-hex", "send-file", "sleep", "drip"):
        ap.add_argument("--" + name, dest=name, action=Ordered)
    ap.add_argument("--send-repeat", dest="send-repeat", action=Ordered, nargs=2, metavar=("N", "STR"))
    ap.add_argument("--shutdown-wr", action="store_true")
    ap.add_argument("--read-timeout", type=float, default=5.0)
    ap.add_argument("--max-responses", type=int, default=0)
    ap.add_argument("--linger", type=float, default=0.0)
    ap.add_argument("--no-read", action="store_true")
    ap.add_argument("--hold", type=float, default=-1, help="keep the connection S seconds without reading")
    ap.add_argument("--rcvbuf", type=int, default=0, help="SO_RCVBUF before connecting")
    ap.add_argument("--max-body", type=int, default=64 << 20, help="bytes of each body kept")
    ap.add_argument("--print-body", type=int, default=2000, help="bytes of each body printed")
    ap.add_argument("--body-dir", help="write each complete body to DIR/rN.body")
    ap.add_argument("--conns", type=int, default=0)
    ap.add_argument("--ready-file")
    ap.add_argument("--send-timeout", type=float, default=5.0, help="with --conns: to write each step")
    ap.add_argument("--connect-timeout", type=float, default=3.0, help="with --conns: for all connections")
    ap.add_argument("--batch", metavar="DIR", help="run every DIR/*.args case at once (see below)")
    ap.add_argument("--out")
    ap.add_argument("--get", action="append", default=[])
    ap.set_defaults(actions=[])
    return ap


def fix_args(args):
    if args.hold >= 0 and args.conns == 0:
        args.no_read = True
    if args.hold < 0:
        args.hold = 0
    return args


def write_result(args, res):
    lines = ["%s=%s" % (k, v) for k, v in res.items()]
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.rename(args.out + ".tmp", args.out)
    if args.get:
        print(" ".join(str(res.get(k, "")) for k in args.get))
    elif not args.out:
        print("\n".join(lines))


def run_batch(ap, top):
    """--batch DIR: every DIR/*.args file holds one case, its arguments separated by NUL bytes: the case's
    name, then rawhttp arguments (no --port, no --conns). All cases run at once, each on its own connection;
    each summary goes to DIR/<name>.out (or the case's --out)."""
    import threading

    cases = []
    for fn in sorted(os.listdir(top.batch)):
        if not fn.endswith(".args"):
            continue
        with open(os.path.join(top.batch, fn), "rb") as f:
            argv = f.read().decode("utf-8").split("\0")
        if argv and argv[-1] == "":
            argv.pop()
        name, rest = argv[0], argv[1:]
        args = fix_args(ap.parse_args(["--port", str(top.port)] + rest))
        if not args.out:
            args.out = os.path.join(top.batch, name + ".out")
        cases.append((name, args))

    def one(args):
        try:
            res = run_one(args, build_steps(args.actions))
        except Exception as e:  # a tool failure must show as such, never as a passing case
            res = {"end": "tool-error", "error": escape(repr(e).encode())}
        write_result(args, res)

    threads = [threading.Thread(target=one, args=(a,), daemon=True) for _, a in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main():
    ap = make_parser()
    args = fix_args(ap.parse_args())
    if args.port is None:
        ap.error("--port is required")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.batch:
        run_batch(ap, args)
        return
    steps = build_steps(args.actions)
    res = run_many(args, steps) if args.conns else run_one(args, steps)
    write_result(args, res)


if __name__ == "__main__":
    main()
