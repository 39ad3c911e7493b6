"""The runner's history cache (omnigent/runner/history_cache.py) and the request body built from it.

Why: the cache lets the server send only what is new to the runner that served
a session's last step, but the model must still get exactly the whole history:
a copy that differs from the server's in any item, or belongs to another
binding of the session, must never be used; the cache must stay within its
bound; and the body written from cached bytes must be the one the openai SDK
writes itself.
"""

from __future__ import annotations

import json

import httpx2
import openai
import pytest
import trio

from omnigent.runner.history_cache import HistoryCache, cost
from omnigent.runner.wire import EncodedItems, create_response, normalize_input, responses_body
from protocol.history import ZERO, chain, item_bytes, link

ITEMS = [
    {"role": "user", "content": [{"type": "input_text", "text": "héllo \u2028 \U0001F600 \"q\""}]},
    {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "hi", "annotations": []}]},
    {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"a\": 1.5}",
     "status": "completed"},
    {"type": "function_call_output", "call_id": "c1", "output": "ok\n\ttabs"},
    {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "xx"},
    {"role": "user", "content": "plain"},
]


def links_hex(items):
    return [x.hex() for x in chain(items)[1]]


def test_a_full_history_is_remembered_and_a_matching_prefix_extends_it():
    cache = HistoryCache()
    first = cache.remember("s", 1, ITEMS[:4])
    assert list(first) == ITEMS[:4] and bytes(first.joined()) == b",".join(item_bytes(i) for i in ITEMS[:4])
    got = cache.extend("s", 1, 4, links_hex(ITEMS[:4])[-1], ITEMS[4:])
    assert got is not None and list(got) == ITEMS and bytes(got.joined()) == b",".join(item_bytes(i) for i in ITEMS)
    assert first == ITEMS[:4]  # what an earlier step was given is its own
    assert bytes(first.joined()) == b",".join(item_bytes(i) for i in ITEMS[:4])
    # a shorter prefix of the copy (the server rewrote its tail): truncated, then extended
    before = got
    again = cache.extend("s", 1, 2, links_hex(ITEMS)[1], [ITEMS[5]])
    assert bytes(before.joined()) == b",".join(item_bytes(i) for i in ITEMS)  # re-encoded: truncated since
    assert list(again) == ITEMS[:2] + [ITEMS[5]]
    assert bytes(again.joined()) == b",".join(item_bytes(i) for i in ITEMS[:2] + [ITEMS[5]])
    assert cache.bytes == sum(cost(item_bytes(i)) for i in ITEMS[:2] + [ITEMS[5]])
    assert list(cache.extend("s", 1, 1, links_hex(ITEMS)[0], [])) == ITEMS[:1]
    assert cache.hits == 3 and cache.misses == 0


@pytest.mark.parametrize("case", ["unknown session", "other generation", "wrong link", "longer than the copy",
                                  "zero"])
def test_anything_but_the_exact_prefix_is_a_miss_and_drops_the_copy(case):
    cache = HistoryCache()
    cache.remember("s", 1, ITEMS[:3])
    good = links_hex(ITEMS[:3])
    session, generation, count, digest = {
        "unknown session": ("t", 1, 3, good[2]),
        "other generation": ("s", 2, 3, good[2]),  # the session was rebound since
        "wrong link": ("s", 1, 3, good[1]),
        "longer than the copy": ("s", 1, 4, good[2]),
        "zero": ("s", 1, 0, ZERO.hex()),
    }[case]
    assert cache.extend(session, generation, count, digest, ITEMS[3:]) is None
    assert cache.misses == 1
    if session == "s":
        assert "s" not in cache and cache.bytes == 0


def test_a_rewritten_item_anywhere_in_the_prefix_changes_the_link():
    rewritten = [dict(i) for i in ITEMS]
    rewritten[0] = {"role": "user", "content": [{"type": "input_text", "text": "héllo, merged"}]}
    assert links_hex(rewritten)[-1] != links_hex(ITEMS)[-1]
    cache = HistoryCache()
    cache.remember("s", 1, ITEMS)
    assert cache.extend("s", 1, 6, links_hex(rewritten)[-1], []) is None


def test_a_rebinding_replaces_the_copy_of_the_old_generation():
    cache = HistoryCache()
    cache.remember("s", 1, ITEMS)
    cache.remember("s", 2, ITEMS[:2])  # the step after a rebinding comes in full
    assert cache.extend("s", 1, 6, links_hex(ITEMS)[-1], []) is None
    assert "s" not in cache  # and an old-generation step drops it, never uses it


def test_the_cache_is_lru_within_its_bytes():
    one = sum(cost(item_bytes(i)) for i in ITEMS)
    cache = HistoryCache(max_bytes=3 * one)
    for n in range(5):
        cache.remember(f"s{n}", 1, ITEMS)
        assert cache.bytes <= cache.max_bytes
    assert len(cache) == 3 and "s0" not in cache and "s4" in cache
    assert cache.extend("s2", 1, 6, links_hex(ITEMS)[-1], []) is not None  # s2 is now the newest
    cache.remember("s5", 1, ITEMS)
    assert "s3" not in cache and "s2" in cache
    assert cache.bytes == 3 * one


def test_a_history_larger_than_the_bound_is_used_once_and_not_kept():
    cache = HistoryCache(max_bytes=10)
    got = cache.remember("s", 1, ITEMS)
    assert list(got) == ITEMS and len(cache) == 0 and cache.bytes == 0


def test_items_are_kept_without_omnigent_fields():
    cache = HistoryCache()
    got = cache.remember("s", 1, [{**ITEMS[1], "response_id": "resp_1", "created_at": 1.0, "turn_id": "t"}])
    assert list(got) == [ITEMS[1]] and normalize_input(got) is got


def test_the_chain_is_a_link_per_item():
    parts, links = chain(ITEMS[:2])
    assert links[1] == link(link(ZERO, parts[0]), parts[1])
    assert parts[0] == json.dumps(ITEMS[0], ensure_ascii=False, separators=(",", ":")).encode()


# --- the body -------------------------------------------------------------------------------------


def _kwargs(items):
    return {"model": "m", "input": items, "stream": True, "instructions": "be nice",
            "reasoning": {"effort": "low"},
            "tools": [{"type": "function", "name": "shell", "description": "d",
                       "parameters": {"type": "object", "properties": {}}, "strict": False}]}


async def test_the_body_from_cached_bytes_is_the_one_the_sdk_writes():
    bodies: list[tuple[bytes, dict]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        bodies.append((request.content, dict(request.headers)))
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=b"")

    client = openai.AsyncOpenAI(api_key="x", base_url="http://mock/v1", max_retries=0,
                                http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)))
    cached = HistoryCache().remember("s", 1, ITEMS)
    for kwargs in (_kwargs(ITEMS), _kwargs(cached), {"model": "m", "input": cached, "stream": True}):
        for through_sdk in (True, False):
            call = client.responses.create(**kwargs) if through_sdk else create_response(client, kwargs)
            stream = await call
            async for _ in stream:
                pass
    await client.close()
    for i in range(0, len(bodies), 2):
        assert bodies[i] == bodies[i + 1]
    assert bodies[0][0] == bodies[2][0] == responses_body(_kwargs(ITEMS))
    assert isinstance(cached, EncodedItems)


async def test_a_failing_cache_never_stops_a_step(monkeypatch):
    import protocol as p
    from omnigent.runner import turns as runner_turns

    async def execute(start, emit, captured):
        return p.TurnCompleted(start.turn_id, "resp_1", [])

    turns = runner_turns.Turns(execute)

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(turns.histories, "remember", broken)
    monkeypatch.setattr(turns.histories, "extend", broken)
    async with trio.open_nursery() as nursery:
        turns.nursery = nursery
        turns.start(p.TurnStart("turn_1", "s", 1, {}, ITEMS, "m"))  # in full: runs uncached
        frame, _ = await turns.queued.receive()
        assert isinstance(frame, p.TurnCompleted)
        turns.start(p.TurnStart("turn_2", "s", 1, {}, ITEMS[4:], "m", history_from=4, history_hash="00"))
        frame, owed = await turns.queued.receive()
        assert frame == p.HistoryMiss("turn_2", 1, 0) and owed is None and len(turns) == 1
