#!/usr/bin/env python3
"""scripted_agent.py: an AG-UI backend that answers every run with a script of events (python3, stdlib).

    scripted_agent.py CASES_JSON PORT_FILE

CASES_JSON is a list of {"name", "expect", "events"}; a POST to /case/<name> is answered 200 with that
case's events as one Server-Sent-Events stream (Content-Length, then close), each event's "threadId" of
"T" and "runId" of "R" replaced by the request's. Listens on 127.0.0.1, an ephemeral port written to
PORT_FILE once listening.
"""

import http.server
import json
import socketserver
import sys

CASES = {c["name"]: c["events"] for c in json.load(open(sys.argv[1]))}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(n) or b"{}")
        events = CASES.get(self.path.rsplit("/", 1)[-1])
        if events is None:
            self.send_error(404)
            return
        out = b""
        for ev in events:
            ev = dict(ev)
            if ev.get("threadId") == "T":
                ev["threadId"] = body.get("threadId")
            if ev.get("runId") == "R":
                ev["runId"] = body.get("runId")
            out += b"data: " + json.dumps(ev).encode() + b"\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(out)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


server = Server(("127.0.0.1", 0), Handler)
with open(sys.argv[2], "w") as f:
    f.write("%d\n" % server.server_address[1])
server.serve_forever()
