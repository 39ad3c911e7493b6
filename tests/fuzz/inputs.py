"""Seeded malformed inputs for every route of the API and both websockets.

`case(seed, index, routes, targets)` is a pure function of its arguments, so
a failing input is reproduced from the two numbers it prints, whatever ran
before it. Routes come from the app's own url_map (there is no route list to
keep in step). Most cases are small and run in-process; `heavy_cases` are the
size and stall cases that need a real socket (hypercorn's own limits).
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import random
import tarfile
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal
from urllib.parse import quote

JSON = "application/json"
WS_SHARE = 0.06
AGENT_YAML = b"name: fuzz_agent\nprompt: be brief\nexecutor:\n  harness: openai-chat\n  model: m1\n"


@dataclass(frozen=True)
class Route:
    rule: str
    methods: frozenset[str]
    websocket: bool


@dataclass(frozen=True)
class Targets:
    """Ids of real rows, so inputs reach past the 404s into the routes' parsing."""

    session_id: str
    agent_id: str
    item_id: str
    token: str
    host: str = "127.0.0.1"
    host_id: str = "host_" + "0" * 32      # a registered host (its websocket, its launches)
    host_secret: str = ""
    spare_host_id: str = "host_" + "1" * 32  # the one DELETE may revoke (host_id stays usable)
    file_id: str = "file_nope"             # a file uploaded to session_id
    approval_id: str = "appr_nope"         # a pending approval of session_id (the loop makes real ones)
    rule_id: str = "rule_nope"             # an "always" rule of session_id


@dataclass(frozen=True)
class HttpCase:
    method: str
    path: str  # with its query string, already percent-encoded as sent
    headers: tuple[tuple[str, str], ...]
    body: bytes
    label: str


@dataclass(frozen=True)
class WsCase:
    kind: Literal["session", "runner", "host"]
    path: str
    headers: tuple[tuple[str, str], ...]
    messages: tuple[str | bytes, ...]
    label: str
    expect_close: bool = field(default=False)  # the last message must make the server close


def routes_of(app) -> list[Route]:
    return [Route(r.rule, frozenset(r.methods or ()), bool(r.websocket)) for r in app.url_map.iter_rules()]


# --- building blocks ------------------------------------------------------------

JUNK_IDS = ["conv_nope", "", " ", "x" * 3000, "..", "%2e%2e", "conv_" + "0" * 32, "é", "\u202e", "😀",
            "a/b", "\x00", "ag_1", "runner_1", "msg_1", "%ff", "null", "-1", "<script>"]
JUNK_NUMBERS = ["0", "-1", "1", "1000", "1001", "abc", "1e3", "9" * 5000, "", " 5", "0x10", "٣", "1.5",
                "2147483648", "-9223372036854775809", "NaN"]
JUNK_VALUES = [None, True, False, 0, -1, 1.5, 1e308, "", "x" * 1000, [], {}, [1, "a"], {"a": None},
               "high", "user", "message", "input_text", "\u0000", "😀" * 10]
CONTENT_TYPES = ["text/plain", "", "application/json; charset=utf-8", "APPLICATION/JSON", "application/jsonx",
                 "application/x-www-form-urlencoded", "multipart/form-data", "multipart/form-data; boundary=x",
                 "application/json, text/plain", "text/plain; charset=utf-8", "application/merge-patch+json"]
ORIGINS = ["https://evil.example", "null", "http://localhost:3000", "omnigent://internal", "", "file://"]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE", "FOO"]
QUERY_KEYS = ["limit", "order", "sort_by", "after", "before", "agent_name", "x"]


def _templates(rule: str, t: Targets) -> list[dict]:
    if rule.endswith("/events"):
        return [{"type": "message", "data": {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}},
                {"type": "message", "data": {"role": "user", "content": "hi"}},
                {"type": "interrupt", "data": {}}, {"type": "retry"}] + _approval_templates(rule, t)
    if rule == "/v1/sessions/<session_id>":
        return [{"title": "t"}, {"runner_id": ""}, {"runner_id": "runner_x"}, {"reasoning_effort": "high"},
                {"model_override": "m2"}, {"title": None, "model_override": None}] + _approval_templates(rule, t)
    if rule == "/v1/sessions":
        return [{"agent_id": t.agent_id},
                {"agent_id": t.agent_id, "title": "x", "reasoning_effort": "low"}] + _approval_templates(rule, t)
    if rule == "/v1/hosts":
        return [{"name": "h", "workspace_roots": ["/srv", "/home/u/w"], "capacity": 2}, {"name": "x"},
                {"workspace_roots": []}, {"capacity": 0}]
    if rule == "/v1/hosts/<host_id>/runners":
        return [{"session_id": t.session_id, "workspace": "/srv/w"}, {"session_id": t.session_id},
                {"workspace": "/tmp"}]
    return [{}]


def _approval_templates(rule: str, t: Targets) -> list[dict]:
    # only when the targets hold an approval (the approvals fuzz): the other seeds' inputs stay
    # those they always were
    if t.approval_id == Targets.approval_id:
        return []
    if rule.endswith("/events"):
        return [{"type": "message", "data": {"role": "user", "content": "hi", "approval_timeout": 0}},
                {"type": "message", "data": {"role": "user", "content": "hi", "approval_timeout": None}},
                {"type": "approval", "data": {"approval_id": t.approval_id, "decision": "allow"}},
                {"type": "approval", "data": {"approval_id": t.approval_id, "decision": "always", "by": "fuzz"}}]
    if rule == "/v1/sessions/<session_id>":
        return [{"permission_mode": "deny"}, {"permission_mode": None}]
    return [{"agent_id": t.agent_id, "permission_mode": "ask"}]


def _deep(depth: int, rng: random.Random) -> str:
    opener, closer = ("[", "]") if rng.random() < 0.5 else ('{"a":', "}")
    return opener * depth + "1" + closer * depth


def _json_body(rng: random.Random, rule: str, t: Targets) -> tuple[bytes, str]:
    body = json.loads(json.dumps(rng.choice(_templates(rule, t))))
    roll = rng.random()
    if roll < 0.15:
        return json.dumps(body).encode(), "valid"
    if roll < 0.45 and body:
        key = rng.choice(sorted(body))
        target, where = body, key
        if isinstance(body.get("data"), dict) and rng.random() < 0.5:
            target, where = body["data"], rng.choice(sorted(body["data"]) or ["role"])
        if rng.random() < 0.3:
            target.pop(where, None)
            return json.dumps(body).encode(), f"drop {where}"
        target[where] = rng.choice(JUNK_VALUES)
        return json.dumps(body).encode(), f"junk {where}"
    if roll < 0.5:
        body["unknown_" + str(rng.randrange(3))] = 1
        return json.dumps(body).encode(), "extra key"
    kind = rng.randrange(16)
    if kind == 0:
        return json.dumps(rng.choice([[], [1, 2], "s", 1, None, True])).encode(), "not an object"
    if kind == 1:
        depth = rng.choice([31, 32, 33, 64, 100, 1000, 5000, 100_000])
        return ('{"title":' + _deep(depth, rng) + "}").encode(), f"deep {depth}"
    if kind == 2:
        n = rng.choice([9_000, 10_001, 50_000])
        return ('{"title":[' + ",".join(["0"] * n) + "]}").encode(), f"{n} values"
    if kind == 3:
        n = rng.choice([1024, 1024 * 1024 - 100, 1024 * 1024 + 100])
        return json.dumps({**body, "title": "x" * n}).encode(), f"string {n}"
    if kind == 4:
        return json.dumps(body).encode()[: rng.randrange(1, 40)], "truncated"
    if kind == 5:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))), "random bytes"
    if kind == 6:
        return b'{"title": "\xff\xfe bad utf-8"}', "invalid utf-8"
    if kind == 7:
        return rng.choice([b'{"title": "\\ud800"}', b'{"type": "message", "data": {"content": "\\udfff"}}',
                           b'{"model_override": "a\\ud83d"}']), "lone surrogate"
    if kind == 8:
        return rng.choice([b'{"title": NaN}', b'{"title": Infinity}', b'{"title": 1' + b"0" * 5000 + b"}",
                           b'{"title": 1e999}', b'{"reasoning_effort": -0.0}']), "odd numbers"
    if kind == 9:
        return b"\xef\xbb\xbf" + json.dumps(body).encode(), "BOM"
    if kind == 10:
        return json.dumps(body).encode("utf-16"), "utf-16"
    if kind == 11:
        return b'{"title": "a", "title": 5}', "duplicate key"
    if kind == 12:
        return b"", "empty"
    if kind == 13:
        return ('{"a":' * 40 + '"' + '\\"[' * 50 + '"' + "}" * 40).encode(), "escapes and brackets"
    if kind == 14:
        return ("[" * 2000 + "]" * 1999).encode(), "deep unbalanced"
    return b'{"data": {"content": [{"type": "input_text", "text": ' + b'"x"' * 3 + b"}]}}", "garbage tokens"


# --- bundles and multipart ------------------------------------------------------


def tar_gz(members: list[tuple[str, bytes]], *, gz: bool = True, kind: bytes = tarfile.REGTYPE,
           link: str = "") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.type = kind if name != "agent.yaml" else tarfile.REGTYPE
            info.linkname = link
            tar.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    raw = buf.getvalue()
    return gzip.compress(raw, mtime=0) if gz else raw


@lru_cache(maxsize=None)
def _bundle(kind: int) -> tuple[bytes, str]:
    nested = b"name: a\nprompt: x\nx: " + b"[" * 5000
    bundles = [
        (tar_gz([("agent.yaml", AGENT_YAML)]), "valid bundle"),
        (b"garbage", "garbage"),
        (tar_gz([("agent.yaml", AGENT_YAML)])[:30], "truncated gzip"),
        (gzip.compress(b"not a tar at all" * 100), "gzip of junk"),
        (tar_gz([("agent.yaml", AGENT_YAML)], gz=False), "plain tar"),
        (tar_gz([("../agent.yaml", AGENT_YAML)]), "dotdot member"),
        (tar_gz([("/etc/agent.yaml", AGENT_YAML)]), "absolute member"),
        (tar_gz([("agent.yaml", AGENT_YAML), ("l", b"")], kind=tarfile.SYMTYPE, link="../../etc/passwd"), "symlink"),
        (tar_gz([(f"f{i}", b"") for i in range(1001)] + [("agent.yaml", AGENT_YAML)]), "1001 members"),
        (tar_gz([("agent.yaml", nested)]), "deep yaml"),
        (tar_gz([("agent.yaml", b"name: a\nprompt: x\nx: [" + b"{a: 1}, " * 25_000 + b"]")]), "complex yaml"),
        (tar_gz([("agent.yaml", b"!!python/object/apply:os.system ['true']\n")]), "python tag"),
        (tar_gz([("agent.yaml", b"")]), "empty yaml"),
        (tar_gz([("agent.yaml", b"- a\n- b\n")]), "yaml list"),
        (tar_gz([("readme.txt", b"hi")]), "no yaml"),
        (tar_gz([("agent.yaml", b"name: a\nprompt: \xff\xfe\n")]), "non-utf8 yaml"),
        (gzip.compress(b"\0" * (16 * 1024 * 1024 + 1)), "gzip bomb"),
        (tar_gz([("agent.yaml", b"a: &a [x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                  b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                  b"name: a\nprompt: p\n")]), "alias bomb"),
        (tar_gz([("agent.yaml", b"name: a\nprompt: x\nexecutor:\n  harness: nope\n")]), "bad harness"),
        (tar_gz([("config.yaml", b":\n  - ]["), ("agent.yaml", AGENT_YAML)]), "broken config.yaml"),
    ]
    return bundles[kind % len(bundles)]


BUNDLE_KINDS = 20


def _multipart(parts: list[tuple[str, str | None, bytes]], boundary: str = "fuzzb") -> bytes:
    out = bytearray()
    for name, filename, data in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
        out += f"--{boundary}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out)


def _multipart_body(rng: random.Random, t: Targets) -> tuple[bytes, str, str]:
    """(body, content type, label)"""
    ctype = "multipart/form-data; boundary=fuzzb"
    bundle, blabel = _bundle(rng.randrange(BUNDLE_KINDS))
    meta_choices = ["{}", '{"title": "t"}', "{", "[]", '{"bogus": 1}', '{"reasoning_effort": "huge"}',
                    '{"title": "\\ud800"}', "[" * 10_000, '{"title": ' + "[0]," * 1 + "0}", "x" * 600_000,
                    '{"workspace": 5}', '{"labels": {"a": "b"}}']
    meta = rng.choice(meta_choices)
    roll = rng.randrange(10)
    if roll < 6:
        parts = [("metadata", None, meta.encode()), ("bundle", "agent.tar.gz", bundle)]
        return _multipart(parts), ctype, f"multipart {blabel}, metadata {meta[:20]!r}"
    if roll == 6:
        return _multipart([("metadata", None, b"{}")]), ctype, "no bundle part"
    if roll == 7:
        return _multipart([("bundle", None, bundle)]), ctype, "bundle as a field"
    if roll == 8:
        return _multipart([("f", None, b"x")] * 1100), ctype, "1100 parts"
    framing = rng.choice([b"--fuzzb\r\nContent-Disposition: form-data; name=\"bundle\"\r\n\r\nabc",
                          b"no boundary here", b"--other\r\n\r\n--other--", b"--fuzzb--\r\n",
                          b"--fuzzb\r\n" + b"X-H: " + b"a" * 20000 + b"\r\n\r\n--fuzzb--"])
    return framing, rng.choice([ctype, "multipart/form-data", "multipart/form-data; boundary="]), "broken framing"


# --- cases ------------------------------------------------------------------------


def _fill(rule: str, rng: random.Random, t: Targets, extra: random.Random | None = None) -> str:
    """The rule with real ids (mostly) or junk; host and file ids are drawn from `extra`, so the
    inputs of the routes that existed before them stay what they were for a given seed."""
    out = rule
    for name, good in (("<session_id>", t.session_id), ("<runner_id>", "runner_fuzz"), ("<host_id>", t.host_id),
                       ("<file_id>", t.file_id), ("<rule_id>", t.rule_id)):
        if name in ("<host_id>", "<file_id>", "<rule_id>") and extra is not None:
            rng = extra
        if name in out:
            value = good if rng.random() < 0.6 else rng.choice(JUNK_IDS)
            out = out.replace(name, quote(value, safe="") if rng.random() < 0.9 else value.replace("/", "%2F"))
    return out


def _query(rng: random.Random, t: Targets) -> str:
    if rng.random() < 0.4:
        return ""
    if rng.random() < 0.1:
        return "?" + rng.choice(["%zz&&=&a", "=" * 50, "limit=1&limit=2", "after=" + t.item_id,
                                 "after=" + "9" * 20, "%00=%00", "a=" + "b" * 5000])
    pairs = []
    for _ in range(rng.randrange(1, 4)):
        key = rng.choice(QUERY_KEYS)
        value = rng.choice(JUNK_NUMBERS + JUNK_IDS + ["asc", "desc", "created_at", "updated_at", t.item_id])
        pairs.append(f"{key}={quote(value, safe='')}")
    return "?" + "&".join(pairs)


def _headers(rng: random.Random, t: Targets, ctype: str | None, auth_share: float = 0.05
             ) -> tuple[tuple[str, str], ...]:
    headers = [("Host", t.host if rng.random() < 0.95 else rng.choice(["evil.example", "", "127.0.0.1:1"]))]
    if ctype is not None:
        headers.append(("Content-Type", ctype))
    if rng.random() < 0.1:
        headers.append(("Origin", rng.choice(ORIGINS)))
    if rng.random() < auth_share:
        value = rng.choice([f"Bearer {t.token}", "Bearer nope", "Basic x", "Bearer"])
        if auth_share > 0.5 and rng.random() < 0.8:  # aiming past the token check: mostly the right one
            value = f"Bearer {t.token}"
        headers.append(("Authorization", value))
    return tuple(headers)


# routes added after the fuzz was written (issue 11: fork, delete): drawn apart, so the draws of
# the older routes stay what they were for a given seed
_NEWER = (("/v1/sessions/<session_id>/fork", "POST"), ("/v1/sessions/<session_id>", "DELETE"))
NEWER_SHARE = 0.05


def _newer(route: Route) -> bool:
    return any(route.rule == rule and method in route.methods for rule, method in _NEWER)


def case(seed: int, index: int, routes: list[Route], t: Targets, *, ws_share: float = WS_SHARE,
         auth_share: float = 0.05) -> HttpCase | WsCase:
    """The `index`-th input of `seed`: one request, or one websocket conversation.

    `auth_share` of the requests carry an Authorization header (the client token, mostly).
    """
    headers = functools.partial(_headers, auth_share=auth_share)
    rng = random.Random(f"{seed}:{index}")
    extra = random.Random(f"{seed}:{index}:hosts")  # draws added with the host routes (see _fill)
    sockets = [r for r in routes if r.websocket]
    # websockets are a few percent of the inputs: each one costs a real connection
    route = rng.choice(sockets if sockets and rng.random() < ws_share else
                       [r for r in routes if not r.websocket and not _newer(r)])
    newer = [r for r in routes if _newer(r)]
    catalog = random.Random(f"{seed}:{index}:catalog")  # its own draws: no other draw moves
    if newer and not route.websocket and catalog.random() < NEWER_SHARE:
        route = catalog.choice(newer)
    if route.websocket:
        return _ws_case(rng, route, t, extra)
    path = _fill(route.rule, rng, t, extra)
    method = rng.choice(sorted(route.methods - {"OPTIONS"})) if rng.random() < 0.85 else rng.choice(METHODS)
    if method == "DELETE":  # the host the other inputs aim at stays registered
        path = path.replace(t.host_id, t.spare_host_id)
    if method == "DELETE" and route.rule == "/v1/sessions/<session_id>":  # and so does the session
        path = path.replace(t.session_id, "conv_nope")
    if route.rule.endswith("/stream") and method in ("GET", "HEAD") and t.session_id in path:
        path = path.replace(t.session_id, "conv_nope")  # a live stream never ends: only its refusals here
    label = f"{method} {route.rule}"
    if method in ("GET", "HEAD", "DELETE", "OPTIONS", "TRACE"):
        body = b"" if rng.random() < 0.9 else b'{"x": 1}'
        return HttpCase(method, path + _query(rng, t), headers(rng, t, None if not body else JSON), body,
                        label + " query")
    if route.rule in ("/v1/sessions", "/v1/agents") and rng.random() < 0.5:
        body, ctype, what = _multipart_body(rng, t)
        return HttpCase(method, path, headers(rng, t, ctype), body, f"{label} {what}")
    if route.rule.endswith("/files") and extra.random() < 0.7:
        body, ctype, what = _file_body(extra)
        return HttpCase(method, path, headers(rng, t, ctype), body, f"{label} {what}")
    body, what = _json_body(rng, route.rule, t)
    ctype = JSON if rng.random() < 0.85 else rng.choice(CONTENT_TYPES + [None])
    return HttpCase(method, path + _query(rng, t) if rng.random() < 0.1 else path,
                    headers(rng, t, ctype), body, f"{label} {what} as {ctype}")


def _frame_junk(rng: random.Random, runner_id: str) -> tuple[str | bytes, str]:
    hello = {"kind": "hello", "runner_id": runner_id, "pid": 1, "protocol_version": 1, "harnesses": ["openai-chat"]}
    kind = rng.randrange(12)
    if kind == 0:
        return json.dumps(hello), "hello"
    if kind == 1:
        return json.dumps({**hello, "protocol_version": 99}), "hello v99"
    if kind == 2:
        broken = dict(hello)
        broken.pop(rng.choice(sorted(broken)))
        return json.dumps(broken), "hello missing a field"
    if kind == 3:
        return json.dumps({**hello, rng.choice(sorted(hello)): rng.choice(JUNK_VALUES)}), "hello junk field"
    if kind == 4:
        return '{"kind": "hello", "x": ' + _deep(rng.choice([65, 1000, 100_000]), rng) + "}", "deep frame"
    if kind == 5:
        return "not json", "not json"
    if kind == 6:
        return b"\xff\xfe\x00binary", "binary"
    if kind == 7:
        return json.dumps({"kind": rng.choice(["turn.completed", "pong", "host.hello", "nope", "ping"]),
                           "turn_id": "turn_x", "ts": 1}), "other kind"
    if kind == 8:
        return "[" + ",".join(["0"] * 1_000_001) + "]", "a million values"
    if kind == 9:
        return json.dumps({"kind": "turn.event", "turn_id": "turn_nope", "event": {"type": "nope"}}), "stray event"
    if kind == 10:
        return '{"kind": "pong", "ts": "\\ud800"}', "surrogate"
    return "", "empty"


def _file_body(rng: random.Random) -> tuple[bytes, str, str]:
    """A file upload: right or wrong part names, odd file names, sizes around the limit."""
    ctype = "multipart/form-data; boundary=fuzzb"
    names = ["notes.txt", "", "../../etc/passwd", "a\\b.txt", "x" * 300, "\x01bell", "ok.bin", "😀.txt", " "]
    roll = rng.randrange(8)
    if roll < 4:
        name = rng.choice(names)
        data = rng.choice([b"hello", b"", bytes(range(256)), b"x" * (64 * 1024)])
        return _multipart([("file", name, data)]), ctype, f"file {name[:20]!r} of {len(data)} bytes"
    if roll == 4:
        return _multipart([("other", "a.txt", b"x")]), ctype, "no file part"
    if roll == 5:
        return _multipart([("file", None, b"x")]), ctype, "file as a field"
    if roll == 6:
        return _multipart([("file", "a.txt", b"x")] * 50), ctype, "50 file parts"
    return b"--fuzzb\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nabc", \
        rng.choice([ctype, "multipart/form-data"]), "broken file framing"


def _host_frame_junk(rng: random.Random, host_id: str) -> tuple[str | bytes, bool, str]:
    """(message, valid after a good hello, label): the frames a host may send, and many it may not."""
    kind = rng.randrange(14)
    rid = f"runner_fuzz{rng.randrange(1000)}"
    if kind == 0:
        return json.dumps({"kind": "host.runner_credential", "runner_id": rid, "secret_hash": "0" * 64}), True, \
            "credential"
    if kind == 1:
        return json.dumps({"kind": "host.runner_launched", "runner_id": rid, "pid": 5}), True, "launched (not its own)"
    if kind == 2:
        return json.dumps({"kind": "host.runner_exited", "runner_id": rid, "code": 1, "signal": None,
                           "reason": "exited", "gave_up": rng.random() < 0.5}), True, "exited (not its own)"
    if kind == 3:
        return json.dumps({"kind": "host.launch_result", "request_id": "launch_nope", "runner_id": rid}), True, \
            "stray launch result"
    if kind == 4:
        return json.dumps({"kind": rng.choice(["pong", "ping"]), "ts": 1.0}), True, "ping/pong"
    if kind == 5:
        return json.dumps(_host_hello(host_id)), False, "a second hello"
    if kind == 6:
        return json.dumps({"kind": rng.choice(["host.hello_ack", "host.launch_runner", "host.kill_runner",
                                               "host.runner_online", "turn.start", "hello"]),
                           "request_id": "r", "runner_id": rid}), False, "a server's frame"
    if kind == 7:
        return json.dumps({"kind": "host.runner_credential", "runner_id": rid,
                           "secret_hash": rng.choice(JUNK_VALUES)}), False, "credential with junk"
    if kind == 8:
        return '{"kind": "host.runner_credential", "x": ' + _deep(rng.choice([65, 1000]), rng) + "}", False, \
            "deep frame"
    if kind == 9:
        return b"\xff\xfe\x00binary", False, "binary"
    if kind == 10:
        return "[" + ",".join(["0"] * 1_000_001) + "]", False, "a million values"
    if kind == 11:
        return json.dumps({"kind": "host.runner_exited", "runner_id": rid}), False, "exited missing fields"
    if kind == 12:
        return "not json", False, "not json"
    return "", False, "empty"


def _host_hello(host_id: str) -> dict:
    return {"kind": "host.hello", "host_id": host_id, "pid": 1, "protocol_version": 1, "name": "fuzz",
            "workspace_roots": ["/srv"], "runners": [], "capacity": 0}


def _host_ws_case(rng: random.Random, path: str, headers: list[tuple[str, str]], t: Targets) -> WsCase:
    """A host link: its secret or not, a hello or not, then frames in or out of order."""
    authorized = rng.random() < 0.8
    if rng.random() < 0.85:
        headers.append(("Authorization", f"Bearer {t.host_secret}" if authorized else
                        rng.choice(["Bearer nope", f"Bearer {t.token}", "Basic x", "Bearer"])))
    else:
        authorized = False
    host_id = path.rsplit("/", 2)[-2]
    first = rng.randrange(8)
    hello = _host_hello(host_id)
    if first < 4:
        opening, ok, label = json.dumps(hello), True, "hello"
    elif first == 4:
        opening, ok, label = json.dumps({**hello, "protocol_version": 99}), False, "hello v99"
    elif first == 5:
        opening, ok, label = json.dumps({**hello, "host_id": "host_other"}), False, "hello for another id"
    elif first == 6:
        broken = dict(hello)
        broken[rng.choice(sorted(broken))] = rng.choice(JUNK_VALUES)
        opening, ok, label = json.dumps(broken), False, "hello junk field"
    else:
        opening, ok, label = _host_frame_junk(rng, host_id)[0], False, "no hello first"
    rest = [_host_frame_junk(rng, host_id) for _ in range(rng.randrange(0, 3))]
    valid = (authorized and host_id == t.host_id and ok and all(v for _m, v, _l in rest)
             and not any(h[0] == "Origin" and h[1] not in ("", "omnigent://internal") for h in headers))
    return WsCase("host", path, tuple(headers), (opening, *(m for m, _v, _l in rest)),
                  "host ws: " + ", ".join([label] + [lab for _m, _v, lab in rest]), expect_close=not valid)


def _ws_case(rng: random.Random, route: Route, t: Targets, extra: random.Random | None = None) -> WsCase:
    path = _fill(route.rule, rng, t, extra)
    headers = [("Host", t.host)]
    if rng.random() < 0.2:
        headers.append(("Origin", rng.choice(ORIGINS)))
    if route.rule.endswith("/hosts/<host_id>/ws"):
        return _host_ws_case(rng, path, headers, t)
    if route.rule.endswith("/runners/<runner_id>/ws"):
        if rng.random() < 0.8:
            headers.append(("Authorization", f"Bearer {t.token}" if rng.random() < 0.8 else "Bearer nope"))
        runner_id = path.rsplit("/", 2)[-2]
        frames = [_frame_junk(rng, runner_id) for _ in range(rng.randrange(1, 4))]
        valid = all(label == "hello" for _m, label in frames[:1]) and len(frames) == 1
        return WsCase("runner", path, tuple(headers), tuple(m for m, _l in frames),
                      "runner ws: " + ", ".join(label for _m, label in frames), expect_close=not valid)
    query = "" if rng.random() < 0.6 else "?after=" + quote(rng.choice(JUNK_NUMBERS), safe="")
    messages = tuple(rng.choice(["hi", "", b"\x00\xff", "x" * 70_000, '{"type": "interrupt"}'])
                     for _ in range(rng.randrange(0, 3)))
    return WsCase("session", path + query, tuple(headers), messages, f"session ws, {len(messages)} messages")


def heavy_cases(t: Targets) -> list[HttpCase | WsCase]:
    """The cases that once stalled the server: sizes past every limit, work that grows with input."""
    host = (("Host", t.host),)
    big = 40 * 1024 * 1024
    sid = t.session_id
    many = tar_gz([(f"f{i}", b"") for i in range(20_000)] + [("agent.yaml", AGENT_YAML)])
    complex_yaml = tar_gz([("agent.yaml", b"name: a\nprompt: hi\nx:\n"
                            + b"".join(b"  - k%d: [1, 2, 3, {a: b}]\n" % i for i in range(300_000)))])
    mp = "multipart/form-data; boundary=fuzzb"
    return [
        HttpCase("POST", "/v1/sessions", host + (("Content-Type", JSON),), b"{" + b" " * big + b"}", "40 MiB JSON"),
        HttpCase("POST", f"/v1/sessions/{sid}/events", host + (("Content-Type", JSON),),
                 b'{"type": "message", "data": {"content": "' + b"x" * (2 * 1024 * 1024) + b'"}}', "2 MiB message"),
        HttpCase("POST", f"/v1/sessions/{sid}/events", host + (("Content-Type", JSON),),
                 b"[" + b"1," * (8 * 1024 * 1024) + b"1]", "16 MiB JSON array"),
        HttpCase("POST", "/v1/sessions", host + (("Content-Type", mp),),
                 _multipart([("bundle", "a.tar.gz", b"x" * big)]), "40 MiB multipart"),
        HttpCase("POST", "/v1/sessions", host + (("Content-Type", mp),),
                 _multipart([("bundle", "a.tar.gz", many)]), "20,000 members"),
        HttpCase("POST", "/v1/sessions", host + (("Content-Type", mp),),
                 _multipart([("bundle", "a.tar.gz", complex_yaml)]), "8 MiB complex YAML"),
        HttpCase("POST", "/v1/sessions", host + (("Content-Type", mp),),
                 _multipart([("bundle", "a.tar.gz", gzip.compress(b"\0" * (64 * 1024 * 1024), 1))]), "gzip bomb"),
        WsCase("session", f"/v1/sessions/{sid}/ws", host, ("x" * (17 * 1024 * 1024),), "17 MiB session frame"),
        WsCase("runner", "/v1/runners/runner_big/ws", host + (("Authorization", f"Bearer {t.token}"),),
               ("x" * (17 * 1024 * 1024),), "17 MiB runner frame", expect_close=True),
        WsCase("runner", "/v1/runners/runner_deep/ws", host + (("Authorization", f"Bearer {t.token}"),),
               ("[" * (8 * 1024 * 1024) + "]" * (8 * 1024 * 1024 - 1),), "16 MiB deep runner frame",
               expect_close=True),
        WsCase("host", f"/v1/hosts/{t.host_id}/ws", host + (("Authorization", f"Bearer {t.host_secret}"),),
               (json.dumps(_host_hello(t.host_id)), "x" * (17 * 1024 * 1024)), "17 MiB host frame",
               expect_close=True),
        WsCase("host", f"/v1/hosts/{t.host_id}/ws", host + (("Authorization", f"Bearer {t.host_secret}"),),
               ("[" * (8 * 1024 * 1024) + "]" * (8 * 1024 * 1024 - 1),), "16 MiB deep host hello",
               expect_close=True),
        HttpCase("POST", "/v1/hosts", host + (("Content-Type", JSON),),
                 json.dumps({"workspace_roots": ["/" + "x" * 4000] * 5000}).encode(), "20 MB of roots"),
    ]
