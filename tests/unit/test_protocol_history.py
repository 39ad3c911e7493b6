"""The incremental-history fields of the runner protocol (protocol/runner_frames.py, protocol/history.py).

Why: both ends ship together, but a runner that never announced the cache
(or was built before it) must still read every frame a server sends it, so
the new fields are left out at their defaults; and they decode as strictly
as every other field.
"""

from __future__ import annotations

import json

import pytest

import protocol as p
from protocol import ProtocolError
from protocol.history import HISTORY_CACHE, ZERO, chain, item_bytes, link


def test_the_new_fields_round_trip():
    hello = p.Hello("runner_1", 1, p.PROTOCOL_VERSION, ["openai-agents"], features=[HISTORY_CACHE])
    start = p.TurnStart("turn_1", "conv_1", 1, {}, [{"role": "user", "content": "x"}], "m",
                        history_from=4, history_hash="ab" * 32)
    miss = p.HistoryMiss("turn_1", attempt=1, step=2)
    for frame in (hello, start, miss):
        assert p.decode(p.encode(frame)) == frame


def test_a_full_history_and_a_plain_hello_encode_as_before_these_fields():
    start = json.loads(p.encode(p.TurnStart("turn_1", "conv_1", 1, {}, [], "m")))
    assert "history_from" not in start and "history_hash" not in start
    hello = json.loads(p.encode(p.Hello("runner_1", 1, p.PROTOCOL_VERSION, [])))
    assert "features" not in hello


def test_the_items_in_completed_fields_round_trip_and_are_left_out_at_their_defaults():
    """A runner of before `HelloAck.features` asks for no acknowledged feature, so its ack has no
    field it refuses; a TurnCompleted that folded nothing reads as before `unannounced`."""
    item = {"type": "message", "role": "assistant", "content": []}
    ack, done = p.HelloAck(5.0, features=[p.ITEMS_IN_COMPLETED]), p.TurnCompleted("t", "r", [item], None, 1)
    for frame in (ack, done):
        assert p.decode(p.encode(frame)) == frame
    assert json.loads(p.encode(p.HelloAck(5.0))) == {"kind": "hello.ack", "ping_interval": 5.0}
    assert "unannounced" not in json.loads(p.encode(p.TurnCompleted("t", "r", [item], None)))
    assert p.ACKNOWLEDGED_FEATURES.isdisjoint({HISTORY_CACHE})  # never echoed to a runner of before
    with pytest.raises(ProtocolError, match="field 'unannounced'"):
        p.decode(json.dumps({**json.loads(p.encode(done)), "unannounced": "1"}))
    # what the server publishes of a peer's count: the last ones, never more than there are
    a, b, c = ({"type": "message", "id": name} for name in "abc")
    assert [p.TurnCompleted("t", "r", [a, b, c], None, n).unannounced_items() for n in (0, 1, 3, 5, -1)] == [
        [], [c], [a, b, c], [a, b, c], []]


@pytest.mark.parametrize(("fields", "needle"), [
    ({"history_from": "4"}, "field 'history_from'"),
    ({"history_from": True}, "field 'history_from'"),
    ({"history_hash": 3}, "field 'history_hash'"),
])
def test_the_new_fields_are_decoded_strictly(fields, needle):
    raw = json.loads(p.encode(p.TurnStart("turn_1", "conv_1", 1, {}, [], "m")))
    with pytest.raises(ProtocolError, match=needle):
        p.decode(json.dumps({**raw, **fields}))
    with pytest.raises(ProtocolError, match="field 'step'"):
        p.decode(json.dumps({"kind": "history.miss", "turn_id": "t", "attempt": 1, "step": "2"}))


def test_a_prefix_is_named_by_one_link_of_a_chain():
    items = [{"role": "user", "content": "é"}, {"type": "function_call_output", "call_id": "c", "output": "1"}]
    parts, links = chain(items)
    assert parts == [item_bytes(i) for i in items] and parts[0] == '{"role":"user","content":"é"}'.encode()
    assert links == [link(ZERO, parts[0]), link(link(ZERO, parts[0]), parts[1])]
    more_parts, more_links = chain(items[1:], links[0])
    assert more_links == links[1:]  # extending costs only the new items
    with pytest.raises(ValueError):
        item_bytes({"x": float("nan")})  # as the openai SDK refuses it
