#!/usr/bin/env python3
"""A resource not written in Rust, for fencing-gate's tests and docs: Python's
standard-library HTTP server that appends each write to a journal file.

    python3 upstream.py JOURNAL [PORT]

Listens on 127.0.0.1:PORT (0, the default, picks a free port) and prints
"listening on PORT" once ready. Every request that is not GET or HEAD appends
one line to JOURNAL, after its body has been read and any delay has passed:

    <start> <end> <method> <path> token=<Fencing-Token or -> <body>

(start and end in seconds since the epoch, to the microsecond). A query of
delay_ms=N holds the request N ms before it is recorded and answered, as a
slow write does; slow_answer=1 answers in two chunks a second apart and then
journals "ANSWERED" for it; close=1 records the write and closes the connection without
an answer. Bodies may be chunked; a request's trailers are recorded after its
body, as " [trailer NAME: VALUE]". GET /headers answers the request's headers
as JSON; GET /trailers a chunked body with a trailer; GET /stream two
chunks a second apart; GET /upgrade switches
to an echo protocol (101); any other GET, the journal.
"""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

JOURNAL = sys.argv[1]
LOCK = threading.Lock()
CONNECTIONS = iter(range(1, 1 << 62))  # each connection's number, for conn=1


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        with LOCK:
            self.number = next(CONNECTIONS)

    def body(self):
        """The request's body, framed by Content-Length or chunked."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while True:
                        trailer = self.rfile.readline()
                        if trailer in (b"\r\n", b"\n", b""):
                            return body
                        body += b" [trailer " + trailer.strip() + b"]"
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def do_GET(self):
        if self.path == "/headers":
            return self.answer(200, json.dumps(dict(self.headers.items())).encode())
        if self.path == "/trailers":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Trailer", "X-Checksum")
            self.end_headers()
            self.wfile.write(b"5\r\nhello\r\n0\r\nX-Checksum: abc\r\n\r\n")
            return
        if self.path == "/upgrade":
            return self.upgrade()
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"first\n", b"second\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
                time.sleep(1)
            self.wfile.write(b"0\r\n\r\n")
            return
        with LOCK:
            data = open(JOURNAL, "rb").read() if os.path.exists(JOURNAL) else b""
        self.answer(200, data)

    def do_HEAD(self):
        self.answer(200, b"", head=True)

    def write(self):
        start = time.time()
        body = self.body()
        query = parse_qs(urlsplit(self.path).query)
        delay = int(query.get("delay_ms", ["0"])[0])
        if delay:
            time.sleep(delay / 1000)
        token = self.headers.get("Fencing-Token", "-")
        if "close" in query:
            self.record(start, token, body)
            self.close_connection = True
            self.connection.shutdown(2)  # no answer at all
            return
        self.record(start, token, body)
        if "slow_answer" in query:
            return self.slow_answer(token)
        self.answer(200, ("recorded %s\n" % token).encode())
        if "hangup" in query:
            self.wfile.flush()
            self.close_connection = True

    def slow_answer(self, token):
        """Answers in two chunks a second apart, then journals ANSWERED."""
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for part in (b"recorded\n", b"%s\n" % token.encode()):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
                time.sleep(1)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        finally:
            with LOCK:
                with open(JOURNAL, "a") as journal:
                    journal.write("%.6f %.6f ANSWERED %s token=%s \n" % (
                        time.time(), time.time(), urlsplit(self.path).path, token))

    def record(self, start, token, body):
        line = "%.6f %.6f %s %s token=%s %s\n" % (
            start, time.time(), self.command, urlsplit(self.path).path, token, body.decode("utf-8", "replace"))
        with LOCK:
            with open(JOURNAL, "a") as journal:
                journal.write(line)
                journal.flush()
                os.fsync(journal.fileno())

    def upgrade(self):
        """Switches to an echo protocol: each line sent comes back upper-cased."""
        self.send_response(101)
        self.send_header("Upgrade", "echo")
        self.send_header("Connection", "Upgrade")
        self.end_headers()
        self.wfile.flush()
        for line in self.rfile:
            self.wfile.write(line.upper())
            self.wfile.flush()
        self.close_connection = True

    do_POST = do_PUT = do_PATCH = do_DELETE = write

    def answer(self, status, body, head=False):
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        if "conn" in parse_qs(urlsplit(self.path).query):
            self.send_header("X-Connection", str(self.number))
        self.end_headers()
        if not head:
            self.wfile.write(body)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that left mid-request (the tests do that on purpose)


server = Server(("127.0.0.1", int(sys.argv[2]) if len(sys.argv) > 2 else 0), Handler)
print("listening on %d" % server.server_address[1], flush=True)
server.serve_forever()
