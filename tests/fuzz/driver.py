"""Runs fuzz inputs against a live server and checks what came back.

One `Fuzz` holds a server started by `run_server` on a real socket (with its
store), an in-process test client on an app built from the same state (the
bulk: fast, no sockets), and the checks:
- every HTTP answer is < 500, and every 4xx is `{"error": {"code", "message"}}`;
- every websocket is refused with a 4xx, or closed with 1000/1001/1009/4xxx,
  and a runner websocket sent a bad frame is closed by the server;
- a well-behaved client (`steady_client`) keeps being answered, each request
  within `LIVENESS_BOUND`, for as long as the fuzz runs;
- afterwards the server still answers and the store passes `PRAGMA integrity_check`.
A failed check is recorded with the seed and index that rebuild the input.
"""

from __future__ import annotations

import dataclasses

import json
import logging
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import h11
import httpx
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError, open_websocket_url

from .inputs import HttpCase, Targets, WsCase, tar_gz, AGENT_YAML

LIVENESS_BOUND = 5.0  # seconds: a well-behaved request answered later than this is a failure
WS_WAIT = 2.0         # seconds to wait for the server's close after a bad frame
OK_CLOSES = {1000, 1001, 1009}  # 1009: hypercorn's own close for a frame over its limit


@dataclass
class Tally:
    http: Counter = field(default_factory=Counter)   # status code -> count
    ws: Counter = field(default_factory=Counter)     # "refused 403" / "closed 4000" / "open" -> count
    other: Counter = field(default_factory=Counter)  # "cut": the server closed the connection mid-upload
    failures: list[str] = field(default_factory=list)
    steady: list[float] = field(default_factory=list)  # latencies of the well-behaved client (s)

    @property
    def inputs(self) -> int:
        return sum(self.http.values()) + sum(self.ws.values()) + sum(self.other.values())

    def by_class(self) -> dict[str, int]:
        out: Counter = Counter()
        for status, n in self.http.items():
            out[f"{status // 100}xx"] += n
        return dict(sorted(out.items()))


async def make_targets(base_url: str, token: str) -> Targets:
    """A session with one message, its agent and that item: real ids for the inputs to aim at."""
    headers = {"Origin": "omnigent://internal", "Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers) as http:
        created = (await http.post("/v1/sessions", data={"metadata": "{}"},
                                   files={"bundle": ("a.tar.gz", tar_gz([("agent.yaml", AGENT_YAML)]))})).json()
        sid = created["session_id"]
        posted = (await http.post(f"/v1/sessions/{sid}/events", json={
            "type": "message", "data": {"role": "user", "content": "hello"}})).json()
        host = (await http.post("/v1/hosts", json={"name": "fuzz", "workspace_roots": ["/srv"]})).json()
        spare = (await http.post("/v1/hosts", json={"name": "spare"})).json()
        uploaded = (await http.post(f"/v1/sessions/{sid}/files", files={"file": ("a.txt", b"fuzz")})).json()
    return Targets(session_id=sid, agent_id=created["agent_id"], item_id=posted["item_id"], token=token,
                   host_id=host["host_id"], host_secret=host["host_secret"], spare_host_id=spare["host_id"],
                   file_id=uploaded["id"])


def with_approval(store, targets: Targets) -> Targets:
    """A pending approval and an "always" rule of the target session, as the agent loop makes them
    (no route creates one), so the approval answers and revocations reach past their 404s."""
    approval = store.create_approval(targets.session_id, "turn_fuzz", 1, "call_fuzz", "shell",
                                     '{"command": "ls"}', "ls", None, None)
    rule = store.add_rule(targets.session_id, "shell", "make")
    return dataclasses.replace(targets, approval_id=approval["id"], rule_id=rule["id"])


def check_http(tally: Tally, where: str, status: int, body: bytes, method: str) -> None:
    tally.http[status] += 1
    if status >= 500:
        tally.failures.append(f"{where}: HTTP {status}: {body[:200]!r}")
    elif status >= 400 and method != "HEAD":
        try:
            error = json.loads(body)["error"]
            ok = isinstance(error["code"], str) and isinstance(error["message"], str)
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            tally.failures.append(f"{where}: HTTP {status} without the error shape: {body[:200]!r}")


async def run_inproc(client, case: HttpCase, tally: Tally, where: str) -> None:
    path, _, query = case.path.partition("?")
    try:
        resp = await client.open(unquote(path) + ("?" + query if query else ""), method=case.method,
                                 headers=list(case.headers), data=case.body)
    except (ValueError, UnicodeError):  # the test client cannot build this request at all
        tally.other["unsendable in-process"] += 1
        return
    check_http(tally, where, resp.status_code, await resp.get_data(), case.method)


async def run_socket(http: httpx.AsyncClient, case: HttpCase, tally: Tally, where: str) -> None:
    """One request over the real socket; a connection the server cuts mid-upload counts as refused."""
    try:
        resp = await http.request(case.method, case.path, headers=list(case.headers), content=case.body)
    except (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError):
        tally.other["cut mid-upload"] += 1  # the server answered early and closed while we still sent
        return
    check_http(tally, where, resp.status_code, resp.content, case.method)


async def run_ws(base_url: str, case: WsCase, tally: Tally, where: str) -> None:
    url = "ws" + base_url[4:] + case.path
    try:
        headers = [(k, v) for k, v in case.headers if k.lower() != "host"]  # the library sends its own
        async with open_websocket_url(url, extra_headers=headers, connect_timeout=5,
                                      disconnect_timeout=2, max_message_size=64 * 1024 * 1024) as ws:
            closed = None
            try:
                for message in case.messages:
                    await ws.send_message(message)
                with trio.move_on_after(WS_WAIT if case.expect_close else 0.05):
                    while True:
                        await ws.get_message()
            except ConnectionClosed as exc:
                closed = exc.reason.code
            if closed is None:
                closed = ws.closed.code if ws.closed else None
    except ConnectionRejected as exc:
        tally.ws[f"refused {exc.status_code}"] += 1
        if exc.status_code >= 500:
            tally.failures.append(f"{where}: websocket refused with HTTP {exc.status_code}")
        return
    except (h11.LocalProtocolError, ValueError, UnicodeError):  # the client library refuses to send it
        tally.other["unsendable websocket"] += 1
        return
    except (HandshakeError, OSError, trio.TooSlowError) as exc:
        tally.ws["handshake failed"] += 1
        tally.failures.append(f"{where}: websocket handshake failed: {exc!r}")
        return
    if closed is None:
        tally.ws["open"] += 1
        if case.expect_close:
            tally.failures.append(f"{where}: the server kept a {case.kind} websocket open after a bad frame")
        return
    tally.ws[f"closed {closed}"] += 1
    if closed not in OK_CLOSES and not 4000 <= closed < 5000:
        tally.failures.append(f"{where}: websocket closed with {closed}")


async def steady_client(base_url: str, t: Targets, tally: Tally, stop: trio.Event) -> None:
    """What a well-behaved client does, over and over, each request within LIVENESS_BOUND."""
    calls = [("GET", "/health", None), ("GET", f"/v1/sessions/{t.session_id}", None),
             ("GET", f"/v1/sessions/{t.session_id}/items", None), ("GET", "/v1/sessions?limit=5", None),
             ("PATCH", f"/v1/sessions/{t.session_id}", {"title": "steady"})]
    headers = {"Origin": "omnigent://internal", "Authorization": f"Bearer {t.token}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=LIVENESS_BOUND * 2) as http:
        i = 0
        while not stop.is_set():
            method, path, body = calls[i % len(calls)]
            i += 1
            started = trio.current_time()
            with trio.move_on_after(LIVENESS_BOUND) as scope:
                try:
                    resp = await http.request(method, path, json=body)
                    if resp.status_code != 200:
                        tally.failures.append(f"steady {method} {path}: HTTP {resp.status_code} {resp.text[:200]}")
                except httpx.HTTPError as exc:
                    tally.failures.append(f"steady {method} {path}: {exc!r}")
            if scope.cancelled_caught:
                tally.failures.append(f"steady {method} {path}: no answer within {LIVENESS_BOUND} s")
            tally.steady.append(trio.current_time() - started)
            await trio.sleep(0.01)


async def final_checks(base_url: str, db: Path, tally: Tally) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=LIVENESS_BOUND) as http:
        try:
            if (await http.get("/health")).json() != {"status": "ok"}:
                tally.failures.append("after the fuzz: /health does not say ok")
        except httpx.HTTPError as exc:
            tally.failures.append(f"after the fuzz: /health failed: {exc!r}")
    con = sqlite3.connect(db)
    try:
        result = con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()
    if result != "ok":
        tally.failures.append(f"store integrity_check: {result}")


async def raw_request(host: str, port: int, case: HttpCase, tally: Tally, where: str) -> None:
    """`case` over a plain TCP stream, reading the answer while the body is still going out.

    A server that refuses a 40 MiB body answers 413 and closes before taking it
    all; an HTTP client library then reports only the broken pipe. Reading
    concurrently keeps the status.
    """
    head = f"{case.method} {case.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in case.headers)
    head += f"Content-Length: {len(case.body)}\r\nConnection: close\r\n\r\n"
    answer = bytearray()
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        async def send() -> None:
            try:
                await stream.send_all(head.encode("latin-1"))
                view = memoryview(case.body)
                for start in range(0, len(view), 1 << 16):
                    await stream.send_all(view[start:start + (1 << 16)])
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the server stopped reading: its answer (413) is what counts

        async def receive() -> None:
            try:
                while not _complete(answer) and (chunk := await stream.receive_some(1 << 16)):
                    answer.extend(chunk)
            except trio.BrokenResourceError:
                pass
            nursery.cancel_scope.cancel()  # the answer is in: stop sending too

        with trio.move_on_after(60) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                nursery.start_soon(receive)
    if scope.cancelled_caught or not answer.startswith(b"HTTP/1.1 "):
        tally.failures.append(f"{where}: no HTTP answer ({bytes(answer[:80])!r})")
        tally.other["no answer"] += 1
        return
    status = int(answer[9:12])
    check_http(tally, where, status, bytes(answer).partition(b"\r\n\r\n")[2], case.method)


class ErrorLog(logging.Handler):
    """Fails the fuzz on any ERROR the server logs: a handler's crash may still end as a clean close."""

    def __init__(self, tally: Tally) -> None:
        super().__init__(logging.ERROR)
        self.tally = tally

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" ({record.exc_info[1]!r})"
        self.tally.failures.append(f"server logged {record.levelname} from {record.name}: {text[:300]}")


def _complete(answer: bytearray) -> bool:
    """A whole HTTP/1.1 response with a Content-Length is in `answer`."""
    head, sep, body = bytes(answer).partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False
