"""A recording HTTP proxy for tests against a real model server: `python _recording_proxy.py UPSTREAM LOG`.

Why: a real server (llama.cpp) does not tell us what it was sent. This sits
between omnigent and the server, forwards each request unchanged, and appends
one JSON line per request to LOG: the path, the JSON body and the upstream's
status. The upstream's answer is read whole and passed back (streams
included: the SSE body arrives in one piece, which the openai SDK parses the
same way). It prints `listening on PORT` once ready and serves until killed.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


def main(upstream: str, log_path: str) -> None:
    target = urlsplit(upstream)
    lock = threading.Lock()  # one connection per thread (keep-alive clients): one writer at a time

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet: the LOG file is the record
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
            try:
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                status, reply_headers = resp.status, resp.getheaders()
            finally:
                conn.close()
            try:
                sent = json.loads(body) if body else None
            except ValueError:
                sent = body.decode(errors="replace")
            with lock, open(log_path, "a") as log:
                log.write(json.dumps({"method": self.command, "path": self.path, "body": sent,
                                      "status": status}) + "\n")
            self.send_response(status)
            for key, value in reply_headers:
                if key.lower() not in _HOP:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
