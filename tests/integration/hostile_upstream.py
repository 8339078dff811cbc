#!/usr/bin/env python3
"""hostile_upstream.py: a mock AG-UI backend that misbehaves on demand (python3, stdlib only).

    hostile_upstream.py --port-file FILE [--listen-port 0]

Listens on 127.0.0.1 (port 0 = ephemeral; the bound port and "\\n" go to FILE once listening). Every
connection reads one request (head, then a Content-Length body) and answers according to the request path
(the query is ignored):

  /ssh              "SSH-2.0-x\\r\\n", then silence until the client goes: not HTTP at all
  /garbage          a TLS alert record (an https server spoken to in plain HTTP), then close
  /badstatus        "HTTP/1.1 2OO OK" and an SSE head, then close
  /bighead          a 200 head with 64 KiB of header fields (over limits.max_header_bytes), then a stream
  /interim33        33 "HTTP/1.1 100 Continue" interim answers, then a valid stream
  /reset-mid-frame  200 + RUN_STARTED, TEXT_MESSAGE_START, TEXT_MESSAGE_CONTENT, then half a frame, then an
                    RST (SO_LINGER 0 + close)
  /reset-on-cue     200 + RUN_STARTED, TEXT_MESSAGE_START, TEXT_MESSAGE_CONTENT; then, once the file "cue"
                    beside --port-file exists (at most 10 s), two more TEXT_MESSAGE_CONTENT frames and at
                    once an RST: stopped meanwhile (SIGSTOP), the gateway finds bytes and reset together
  /stall            200 + RUN_STARTED, then silence until the client goes (at most 60 s)
  /frame50mb        200 + RUN_STARTED, TEXT_MESSAGE_START, then ONE TEXT_MESSAGE_CONTENT frame of 50 MB,
                    written as fast as the client reads (stops when the client goes)
  /ok               a valid short run (RUN_STARTED ... RUN_FINISHED)
  /head-alone       the head in a write of its own, RUN_STARTED 30 µs after it in another, then 50 ms of
                    silence and RUN_FINISHED: an agent that starts its run, then waits for its model

Streams are chunked. Each answer is logged on stderr (path, bytes written, how it ended). GET
/_stats answers JSON {"connections": N, "by_path": {...}}.
"""

import argparse
import json
import os
import socket
import socketserver
import struct
import sys
import threading
import time

STATS = {"connections": 0, "by_path": {}}
CUE = None  # the file /reset-on-cue waits for (main())
LOCK = threading.Lock()


def frame(ev):
    return b"data: " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n"


def chunk(data):
    return b"%x\r\n" % len(data) + data + b"\r\n"


SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")


def ids(body):
    try:
        j = json.loads(body or b"{}")
        return j.get("threadId", "t"), j.get("runId", "r")
    except ValueError:
        return "t", "r"


def wait_client_gone(sock, limit):
    """Reads (and drops) until the client closes, at most <limit> seconds."""
    sock.settimeout(0.2)
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            if not sock.recv(65536):
                return "client closed"
        except socket.timeout:
            continue
        except OSError:
            return "client reset"
    return "gave up"


class Handler(socketserver.BaseRequestHandler):
    def read_request(self):
        s = self.request
        s.settimeout(10)
        buf = b""
        while b"\r\n\r\n" not in buf:
            got = s.recv(65536)
            if not got:
                return None, None, None
            buf += got
            if len(buf) > 1 << 20:
                return None, None, None
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        method, target = parts[0], parts[1] if len(parts) > 1 else b"/"
        length = 0
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v.strip())
        while len(body) < length:
            got = s.recv(65536)
            if not got:
                break
            body += got
        return method, target.decode("latin-1").split("?")[0], body

    def handle(self):
        s = self.request
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with LOCK:
            STATS["connections"] += 1
        try:
            method, path, body = self.read_request()
        except (OSError, ValueError):
            return
        if path is None:
            return
        with LOCK:
            STATS["by_path"][path] = STATS["by_path"].get(path, 0) + 1
        written = [0]

        def send(data):
            s.sendall(data)
            written[0] += len(data)

        how = "answered"
        try:
            how = self.answer(path, body, send) or how
        except OSError as e:
            how = "client gone while writing (%s)" % (e.strerror or e)
        sys.stderr.write("hostile_upstream: %s %s: %d bytes, %s\n" % (method.decode(), path, written[0], how))
        sys.stderr.flush()

    def answer(self, path, body, send):
        s = self.request
        thread, run = ids(body)
        started = frame({"type": "RUN_STARTED", "threadId": thread, "runId": run})
        if path == "/_stats":
            with LOCK:
                b = json.dumps(STATS).encode()
            send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                 b"Connection: close\r\n\r\n" % len(b) + b)
            return None
        if path == "/ssh":
            send(b"SSH-2.0-x\r\n")
            return wait_client_gone(s, 30)
        if path == "/garbage":
            send(b"\x15\x03\x01\x00\x02\x02\x32")  # TLS alert: decode_error
            return "closed"
        if path == "/badstatus":
            send(b"HTTP/1.1 2OO OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            return "closed"
        if path == "/bighead":
            pad = b"".join(b"X-Pad-%04d: %s\r\n" % (i, b"p" * 100) for i in range(600))  # ~66 KiB
            send(SSE_HEAD[:-2] + pad + b"\r\n" + chunk(started))
            return wait_client_gone(s, 10)
        if path == "/interim33":
            send(b"HTTP/1.1 100 Continue\r\n\r\n" * 33)
            send(SSE_HEAD + chunk(started)
                 + chunk(frame({"type": "RUN_FINISHED", "threadId": thread, "runId": run})) + b"0\r\n\r\n")
            return "closed"
        if path == "/reset-mid-frame":
            send(SSE_HEAD + chunk(started)
                 + chunk(frame({"type": "TEXT_MESSAGE_START", "messageId": "m-reset", "role": "assistant"}))
                 + chunk(frame({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m-reset", "delta": "Hel"})))
            time.sleep(0.3)
            send(chunk(b'data: {"type":"TEXT_MESSAGE_CONTENT","messageId":"m-re'))
            time.sleep(0.3)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
            return "reset (SO_LINGER 0)"
        if path == "/reset-on-cue":
            send(SSE_HEAD + chunk(started)
                 + chunk(frame({"type": "TEXT_MESSAGE_START", "messageId": "m-cue", "role": "assistant"}))
                 + chunk(frame({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m-cue", "delta": "Hel"})))
            deadline = time.time() + 10
            while not os.path.exists(CUE) and time.time() < deadline:
                time.sleep(0.02)
            send(chunk(frame({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m-cue", "delta": "lo"}))
                 + chunk(frame({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m-cue", "delta": " there"})))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
            return "reset on cue (SO_LINGER 0)"
        if path == "/stall":
            send(SSE_HEAD + chunk(started))
            return wait_client_gone(s, 60)
        if path == "/frame50mb":
            send(SSE_HEAD + chunk(started)
                 + chunk(frame({"type": "TEXT_MESSAGE_START", "messageId": "m-big", "role": "assistant"}))
                 + chunk(b'data: {"type":"TEXT_MESSAGE_CONTENT","messageId":"m-big","delta":"'))
            piece = chunk(b"x" * 65536)
            s.settimeout(20)
            for _ in range(800):  # 50 MiB
                send(piece)
            send(chunk(b'"}\n\n') + chunk(frame({"type": "TEXT_MESSAGE_END", "messageId": "m-big"}))
                 + chunk(frame({"type": "RUN_FINISHED", "threadId": thread, "runId": run})) + b"0\r\n\r\n")
            return "the whole 50 MB frame was taken"
        if path == "/head-alone":
            send(SSE_HEAD)
            t = time.perf_counter() + 30e-6
            while time.perf_counter() < t:
                pass
            send(chunk(started))
            time.sleep(0.05)
            send(chunk(frame({"type": "RUN_FINISHED", "threadId": thread, "runId": run})) + b"0\r\n\r\n")
            return None
        if path == "/ok":
            send(SSE_HEAD + chunk(started)
                 + chunk(frame({"type": "RUN_FINISHED", "threadId": thread, "runId": run})) + b"0\r\n\r\n")
            return None
        b = b'{"error":"hostile_upstream: unknown path"}'
        send(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
             b"Connection: close\r\n\r\n" % len(b) + b)
        return None


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--listen-port", type=int, default=0)
    args = ap.parse_args()
    global CUE
    CUE = os.path.join(os.path.dirname(os.path.abspath(args.port_file)), "cue")
    srv = Server(("127.0.0.1", args.listen_port), Handler)
    with open(args.port_file + ".tmp", "w") as f:
        f.write("%d\n" % srv.server_address[1])
    os.rename(args.port_file + ".tmp", args.port_file)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    srv.serve_forever()


if __name__ == "__main__":
    main()
