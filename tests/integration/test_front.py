"""The routes answered in front of quart (`server/front.py`): the same answers, over real sockets.

Every answer the front gives to `POST /v1/sessions/{id}/events` and on a
runner's websocket is compared with the one quart's own rule for it gives
(the same server, the same request, driven as bare ASGI): status, JSON,
whether the connection is kept, the frames and closes. Then over a real hypercorn socket: the post that starts a turn, and the
edges a framework used to cover (a body left unread before the answer on a
kept-alive connection, a client that hangs up halfway or right after).
"""

from __future__ import annotations

import json
import logging
from contextlib import aclosing
from typing import Any

import httpx
import pytest
import trio

from omnigent.client import OmnigentClient
from omnigent.client.client import follow_turn
from protocol import events as ev
from omnigent.server.app import create_app
from omnigent.server.bodies import MAX_BODY, MAX_JSON_BODY
import protocol as p
from tests.integration.test_server_api import bundle, fake_runner, host_secret, start_server  # noqa: F401  (fixture)

TOKEN = "client-token-for-tests"
AUTH = [(b"authorization", f"Bearer {TOKEN}".encode()), (b"host", b"127.0.0.1")]
JSON = [(b"content-type", b"application/json")]


@pytest.fixture
async def both(server, bundle):  # noqa: F811
    """A session, and the server's app as ASGI twice: behind its front, and quart's own dispatch alone."""
    async with OmnigentClient(server.url, token=TOKEN) as client:
        sid = (await client.create_session(bundle))["id"]
    app = create_app(server.state)
    return sid, app.asgi_app, type(app).asgi_app.__get__(app)


@pytest.fixture
async def server(nursery, tmp_path):
    from omnigent.store import Store

    store = Store(tmp_path / "chat.db")
    handle = await start_server(nursery, store, runner_wait=1.0, ping_interval=0.2)
    handle.state.token = TOKEN  # as `omnigent server --token`: the guard's every refusal can be seen
    yield handle
    await handle.aclose()
    store.close()


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]], query: bytes = b"") -> dict[str, Any]:
    """An HTTP request's ASGI scope, as hypercorn makes it."""
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
            "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
            "extensions": {}}


def _receiving(messages: list[dict], hang_up: trio.Event | None = None, gone: dict | None = None) -> Any:
    """An ASGI `receive`: `messages` in order, then `gone` once `hang_up` is set (never, without one:
    quart's reader waits there for a disconnect that does not come)."""
    pending = list(messages)

    async def receive() -> dict:
        if pending:
            return pending.pop(0)
        if hang_up is None:
            await trio.sleep_forever()
        await hang_up.wait()
        return gone

    return receive


async def _call(asgi: Any, path: str, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[int, dict, bool]:
    """One POST through an ASGI app: (status, the JSON answer, whether it closes the connection)."""
    scope = _scope("POST", path, headers)
    receive = _receiving([{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                          for i, c in enumerate(chunks)])
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    with trio.fail_after(10):
        await asgi(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    names = {bytes(k).lower(): bytes(v).lower() for k, v in start["headers"]}
    return start["status"], json.loads(body), names.get(b"connection") == b"close"


def _cases(sid: str) -> list[tuple[str, str, list[tuple[bytes, bytes]], list[bytes]]]:
    message = json.dumps({"type": "message", "data": {"role": "user", "content": "hi"}}).encode()
    big = b"x" * (MAX_JSON_BODY + 1)
    events = f"/v1/sessions/{sid}/events"
    return [
        ("a browser's origin", events, AUTH + JSON + [(b"origin", b"https://evil.example")], [message]),
        ("a rebinding Host", events, [AUTH[0], (b"host", b"evil.example")] + JSON, [message]),
        ("no token", events, [AUTH[1]] + JSON, [message]),
        ("a wrong token", events, [(b"authorization", b"Bearer nope"), AUTH[1]] + JSON, [message]),
        ("an unknown session", "/v1/sessions/conv_nope/events", AUTH + JSON, [message]),
        ("an unknown session, a large body", "/v1/sessions/conv_nope/events", AUTH + JSON, [big[:1 << 16]] * 20),
        ("an unknown session, a body too large to drain", "/v1/sessions/conv_nope/events", AUTH + JSON,
         [b"x" * (1 << 20)] * (MAX_BODY // (1 << 20) + 2)),
        ("text/plain", events, AUTH + [(b"content-type", b"text/plain")], [message]),
        ("no Content-Type", events, AUTH, [message]),
        ("JSON with a charset", events, AUTH + [(b"content-type", b"Application/JSON; charset=utf-8")],
         [json.dumps({"type": "interrupt"}).encode()]),
        ("a Content-Length over the limit", events, AUTH + JSON + [(b"content-length", str(len(big)).encode())],
         [b"{}"]),
        ("a body over the limit, chunked", events, AUTH + JSON, [big[:1 << 19], big[1 << 19:]]),
        ("not JSON", events, AUTH + JSON, [b"{nope"]),
        ("not an object", events, AUTH + JSON, [b"[1, 2]"]),
        ("too deep", events, AUTH + JSON, [b"[" * 100 + b"]" * 100]),
        ("too many values", events, AUTH + JSON, [json.dumps({"type": "x", "v": list(range(20_000))}).encode()]),
        ("a lone surrogate", events, AUTH + JSON, [b'{"type": "message", "data": {"content": "\\ud800"}}']),
        ("an unknown type", events, AUTH + JSON, [b'{"type": "nope"}']),
        ("an empty body", events, AUTH + JSON, [b""]),
        ("a message that is not the user's", events, AUTH + JSON,
         [json.dumps({"type": "message", "data": {"role": "assistant", "content": "x"}}).encode()]),
        ("empty content", events, AUTH + JSON, [json.dumps({"type": "message", "data": {"content": []}}).encode()]),
        ("a bad approval timeout", events, AUTH + JSON,
         [json.dumps({"type": "message", "data": {"content": "x", "approval_timeout": -1}}).encode()]),
        ("a retry with nothing to retry", events, AUTH + JSON, [b'{"type": "retry"}']),
        ("an approval nobody asked for", events, AUTH + JSON,
         [json.dumps({"type": "approval", "data": {"approval_id": "appr_x", "decision": "allow"}}).encode()]),
        ("an interrupt with nothing running", events, AUTH + JSON, [b'{"type": "interrupt", "data": {}}']),
    ]


async def test_the_front_answers_every_case_as_quart_does(server, both):
    sid, front_app, quart_alone = both
    for label, path, headers, chunks in _cases(sid):
        front = await _call(front_app, path, headers, chunks)
        quart = await _call(quart_alone, path, headers, chunks)
        assert front == quart, label
        assert 400 <= front[0] < 500 or front[1] == {"queued": False, "interrupted": False}, label
    # and nothing of it was stored: no message, no turn
    assert server.state.store.list_items(sid) == [] and server.state.store.list_turns(sid) == []


async def test_a_posted_message_is_answered_by_the_front_and_runs(server, bundle):  # noqa: F811
    async with OmnigentClient(server.url, token=TOKEN) as client:
        sid = (await client.create_session(bundle))["id"]
        async with fake_runner(server, reply="from the front") as seen, client.events(sid) as stream:
            await anext(stream)  # the greeting: what follows is live
            async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                answer = await http.post(f"/v1/sessions/{sid}/events",
                                         json={"type": "message", "data": {"role": "user", "content": "hi"}})
            assert answer.status_code == 202
            assert answer.headers["content-type"] == "application/json"
            assert answer.headers.get("connection") != "close"
            body = answer.json()
            assert body["queued"] is True and set(body) == {"queued", "item_id", "turn_id"}
            assert len(seen["turns"]) == 1  # the TurnStart was out before the answer
            with trio.fail_after(10):
                result = await follow_turn(stream, body["turn_id"])
        assert result.text == "from the front"
        items = server.state.store.list_items(sid)
        assert [i["role"] for i in items] == ["user", "assistant"] and items[0]["id"] == body["item_id"]


async def test_a_kept_alive_connection_survives_answers_given_before_the_body(server, bundle):  # noqa: F811
    """A 404 answered before its body was read: the body is drained, and the next request on the
    same connection is answered (hypercorn would otherwise wait on the unread body)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers,
                                 limits=httpx.Limits(max_connections=1)) as http:
        for _ in range(3):
            with trio.fail_after(10):
                answer = await http.post("/v1/sessions/conv_nope/events", json={"pad": "x" * 200_000})
            assert answer.status_code == 404 and answer.headers.get("connection") != "close"
            assert (await http.get("/health")).status_code == 200


async def test_clients_that_hang_up_leave_the_server_serving(server, bundle, caplog):  # noqa: F811
    caplog.set_level(logging.ERROR)
    async with OmnigentClient(server.url, token=TOKEN) as client:
        sid = (await client.create_session(bundle))["id"]
    host, port = server.url.rsplit("/", 1)[1].rsplit(":", 1)
    message = json.dumps({"type": "message", "data": {"role": "user", "content": "left"}}).encode()
    head = (f"POST /v1/sessions/{sid}/events HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(message)}\r\n\r\n").encode()
    with trio.fail_after(10):
        half = await trio.open_tcp_stream(host, int(port))  # half of the body, then gone
        await half.send_all(head + message[: len(message) // 2])
        await half.aclose()
        whole = await trio.open_tcp_stream(host, int(port))  # all of it, then gone before the answer
        await whole.send_all(head + message)
        await whole.aclose()
        async with aclosing(server.state.hub.follow(sid, 0)) as events:  # the whole one is stored all the same
            async for event in events:
                if event["type"] == ev.INPUT_CONSUMED:
                    break
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/health")).status_code == 200
    assert [i["content"][0]["text"] for i in server.state.store.list_items(sid) if i["role"] == "user"] == ["left"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def _frame_kind(text: str) -> str | None:
    """A runner link frame's kind; None for a ping (on the server's timer: not part of an exchange)."""
    frame = p.decode(text)
    return None if isinstance(frame, p.Ping) else frame.kind


async def _ws_call(asgi: Any, path: str, headers: list[tuple[bytes, bytes]], frames: list[str],
                   kind_of: Any = _frame_kind, query: bytes = b"") -> list[tuple]:
    """A websocket through an ASGI app: the client connects, sends `frames`, and hangs up once the
    server has answered (a message or a close). What the server sent, as (what, status/code/kind_of)."""
    scope = {**_scope("GET", path, headers, query), "type": "websocket", "scheme": "ws", "subprotocols": [],
             "extensions": {"websocket.http.response": {}}}  # hypercorn's: a refusal can be an HTTP answer
    answered = trio.Event()
    receive = _receiving([{"type": "websocket.connect"}] + [{"type": "websocket.receive", "text": f} for f in frames],
                         answered, {"type": "websocket.disconnect", "code": 1000})
    sent: list[tuple] = []

    async def send(message: dict) -> None:
        kind = message["type"].removeprefix("websocket.")
        if kind == "send":
            if (what := kind_of(message["text"])) is not None:
                sent.append((kind, what))
                answered.set()
        elif kind == "http.response.body":
            if message["body"]:  # quart ends its answer with an empty body of its own
                sent.append((kind, json.loads(message["body"])["error"]["code"]))
        else:
            sent.append((kind, message.get("status") or message.get("code")))
            answered.set()

    with trio.fail_after(10):
        await asgi(scope, receive, send)
    return sent


async def test_the_runner_websocket_is_served_as_quart_served_it(server, both):
    server.state.credential_wait = 0.2  # an id nobody vouched for is refused after this
    _, front_app, quart_alone = both
    host = [(b"host", b"127.0.0.1")]

    def hello(runner_id: str) -> str:
        return p.encode(p.Hello(runner_id=runner_id, pid=1, protocol_version=p.PROTOCOL_VERSION,
                                harnesses=["openai-chat"]))

    for n, via in enumerate((front_app, quart_alone)):
        runner_id = f"runner_parity{n}"
        secret = host_secret(server, runner_id)
        path = f"/v1/runners/{runner_id}/ws"
        auth = [(b"authorization", f"Bearer {secret}".encode())]
        cases = {
            "a browser's origin": (path, host + auth + [(b"origin", b"https://evil.example")], [hello(runner_id)]),
            "a rebinding Host": (path, [(b"host", b"evil.example")] + auth, [hello(runner_id)]),
            "the client token": (path, host + [(b"authorization", f"Bearer {TOKEN}".encode())], [hello(runner_id)]),
            "no secret": (path, host, [hello(runner_id)]),
            "another id's hello": (path, host + auth, [hello("runner_other")]),
            "not a frame": (path, host + auth, ["{nope"]),
            "its hello": (path, host + auth, [hello(runner_id)]),
        }
        seen = {label: await _ws_call(via, *case) for label, case in cases.items()}
        if n == 0:
            front = seen
        assert runner_id not in server.state.registry.online  # every one of them hung up
    assert seen == front  # quart's answers, case by case
    assert front["a browser's origin"] == [("http.response.start", 403), ("http.response.body", "forbidden")]
    assert front["no secret"] == [("accept", None), ("close", 4003)]
    assert front["its hello"] == [("accept", None), ("send", "hello.ack")]


async def _sse_call(asgi: Any, path: str, query: bytes, headers: list[tuple[bytes, bytes]]) -> tuple:
    """A GET of a session's stream through an ASGI app; the client hangs up after the first chunk.
    (status, the answer's headers, its JSON error or its first chunk, whether it closes)."""
    scope = _scope("GET", path, headers, query)
    chunked = trio.Event()
    receive = _receiving([{"type": "http.request", "body": b"", "more_body": False}], chunked,
                         {"type": "http.disconnect"})
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message["body"]:
            chunked.set()

    with trio.fail_after(10):
        await asgi(scope, receive, send)
    start = sent[0]
    names = {bytes(k).lower(): bytes(v) for k, v in start["headers"]}
    first = next(m["body"] for m in sent[1:] if m["body"])
    if names[b"content-type"] == b"application/json":
        first = json.loads(first)
    names.pop(b"content-length", None)
    return start["status"], names, first, names.get(b"connection") == b"close"


async def test_the_event_stream_is_served_as_quart_served_it(both):
    sid, front_app, quart_alone = both
    path = f"/v1/sessions/{sid}/stream"
    cases = {
        "a browser's origin": (path, b"", AUTH + [(b"origin", b"https://evil.example")]),
        "no token": (path, b"", [AUTH[1]]),
        "an unknown session": ("/v1/sessions/conv_nope/stream", b"", AUTH),
        "after, not a number": (path, b"after=abc", AUTH),
        "after, not UTF-8": (path, b"after=%ff", AUTH),
        "a Last-Event-ID that is no number": (path, b"", AUTH + [(b"last-event-id", b"x")]),
        "live only": (path, b"", AUTH),
        "after 0": (path, b"after=0&after=x", AUTH),
        "a Last-Event-ID": (path, b"", AUTH + [(b"last-event-id", b" 0 ")]),
    }
    for label, case in cases.items():
        front = await _sse_call(front_app, *case)
        assert front == await _sse_call(quart_alone, *case), label
    assert (await _sse_call(front_app, *cases["a browser's origin"]))[::3] == (403, True)
    status, headers, first, _ = await _sse_call(front_app, *cases["live only"])
    assert status == 200 and headers[b"content-type"] == b"text/event-stream"
    assert first.startswith(b"event: session.heartbeat\ndata: ")


async def test_the_watchers_websocket_is_served_as_quart_served_it(both):
    sid, front_app, quart_alone = both
    path = f"/v1/sessions/{sid}/ws"

    def event_type(text: str) -> str:
        return json.loads(text)["type"]

    cases = {
        "a browser's origin": (path, AUTH + [(b"origin", b"https://evil.example")], [], event_type),
        "no token": (path, [AUTH[1]], [], event_type),
        "an unknown session": ("/v1/sessions/conv_nope/ws", AUTH, [], event_type),
        "after, not a number": (path, AUTH, [], event_type, b"after=abc"),
        "live only": (path, AUTH, [], event_type),
        "after 0, and a message from the client": (path, AUTH, ["hello?"], event_type, b"after=0"),
    }
    front = {label: await _ws_call(front_app, *case) for label, case in cases.items()}
    assert front == {label: await _ws_call(quart_alone, *case) for label, case in cases.items()}
    assert front["a browser's origin"] == [("http.response.start", 403), ("http.response.body", "forbidden")]
    assert front["an unknown session"] == [("http.response.start", 404), ("http.response.body", "not_found")]
    assert front["live only"] == [("accept", None), ("send", "session.heartbeat")]
