"""What the store's hot writes return is what a read after them gives (issue 10).

A message's turn, an attempt's start, a step's begin and a model step's end
return their rows from the statement that wrote them (RETURNING) or from
what the transaction wrote, so that a turn reads nothing back. Each must be
exactly what `get_turn`, `get_step`, `list_turn_items` and `turn_usage`
would read: the agent loop and the API publish these as they are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from omnigent.store import Store
from omnigent.store.owners import ClaimOwner
from omnigent.store.steps import add_usage

USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
USAGE = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15, "input_tokens_details": {"cached_tokens": 2}}


def answer(words: str, **extra: object) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": words}], **extra}


def call(call_id: str) -> dict:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": "shell",
            "arguments": "{}", "status": "completed"}


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "chat.db") as s:
        yield s


@pytest.fixture
def conv_id(store: Store) -> str:
    return store.create_conversation(agent_id=None, workspace="/w")["id"]


def test_a_queued_turn_and_its_claim_are_returned_as_read(store: Store, conv_id: str):
    owner = ClaimOwner(pid=1, started="s", token="t")
    item, turn, claimed = store.queue_message_claiming(conv_id, USER, approval_timeout=30.0, claim=owner, lease=9.0)
    assert turn == store.get_turn(turn["id"]) and turn["status"] == "queued" and turn["step"] is None
    assert claimed and store.holds_claim(conv_id, owner, turn_id=turn["id"])
    # busy: the next message waits, and takes no claim
    _, second, claimed = store.queue_message_claiming(conv_id, USER, claim=owner, lease=9.0)
    assert second == store.get_turn(second["id"]) and not claimed
    assert not store.holds_claim(conv_id, owner, turn_id=second["id"])
    # without a claim asked for, none is taken
    other = store.create_conversation(agent_id=None, workspace="/w")["id"]
    assert store.queue_message_claiming(other, USER)[2] is False
    assert store.claim_of(other) is None
    assert store.create_turn(conv_id, item["id"]) == store.get_turn(store.list_turns(conv_id)[-1]["id"])


def test_an_attempt_start_returns_the_row_as_read_with_its_last_step(store: Store, conv_id: str):
    _, turn = store.queue_message(conv_id, USER)
    started = store.start_turn(turn["id"], "runner_a", 7, generation=3)
    assert started == store.get_turn(turn["id"])
    assert (started["status"], started["attempt"], started["runner_id"], started["generation"]) == (
        "running", 1, "runner_a", 3)
    # a second attempt after a model step that stored its output and usage, stopped in its tool
    # step: the row carries the usage and that last step
    store.begin_step(conv_id, turn["id"], 0, "model")
    assert store.finish_model_step(conv_id, turn["id"], 0, [call("c1")], "resp_1", USAGE)
    store.begin_step(conv_id, turn["id"], 1, "tool", call_id="c1", tool="shell")
    store.mark_interrupted(turn["id"])
    again = store.start_turn(turn["id"], "runner_b", None, generation=4)
    assert again == store.get_turn(turn["id"]) and again["attempt"] == 2 and again["owner_pid"] == 7
    assert again["usage"] == USAGE and again["step"] is not None and again["step"]["step"] == 1


def test_an_attempt_start_returns_a_persisted_output_as_read(store: Store, conv_id: str):
    """A turn whose output was stored whole (`append_turn_output`, as before turn steps) and that
    runs again: its row says so."""
    _, turn = store.queue_message(conv_id, USER)
    store.start_turn(turn["id"], "runner_a", 7)
    assert store.append_turn_output(conv_id, turn["id"], [answer("a")], "resp_1")
    store.mark_interrupted(turn["id"])
    again = store.start_turn(turn["id"], "runner_a", 7)
    assert again == store.get_turn(turn["id"]) and again["output_persisted"] is True


def test_a_begun_step_is_returned_as_read(store: Store, conv_id: str):
    _, turn = store.queue_message(conv_id, USER)
    fresh = store.begin_step(conv_id, turn["id"], 0, "model", attempt=1)
    assert fresh == store.get_step(turn["id"], 0) and fresh["status"] == "running"
    waiting = store.begin_step(conv_id, turn["id"], 1, "tool", call_id="c1", tool="shell", waiting=True)
    assert waiting == store.get_step(turn["id"], 1) and waiting["status"] == "waiting"
    assert store.begin_step(conv_id, turn["id"], 0, "model", attempt=2) == store.get_step(turn["id"], 0)


def test_a_finished_model_step_says_what_a_read_would(store: Store, conv_id: str):
    _, turn = store.queue_message(conv_id, USER)
    tid = turn["id"]
    store.begin_step(conv_id, tid, 0, "model")
    # an item carrying fields of omnigent's own, as an endpoint may send them
    first = store.complete_model_step(conv_id, tid, 0, [call("c1"), answer("a", response_id="x", created_at=1.0)],
                                      "resp_1", USAGE)
    assert first is not None and first.first_index == 0
    assert first.items == store.list_turn_items(conv_id, tid)
    assert first.turn_usage == store.turn_usage(tid) == USAGE
    store.finish_tool_step(conv_id, tid, 1, "c1", "out", "completed")
    # a later step: its items follow the turn's earlier ones, and the usage adds up
    store.begin_step(conv_id, tid, 2, "model")
    later = store.complete_model_step(conv_id, tid, 2, [answer("b")], "resp_2", USAGE)
    assert later is not None and later.first_index == 3
    assert later.items == store.list_turn_items(conv_id, tid)[3:]
    assert later.turn_usage == store.turn_usage(tid) == add_usage(USAGE, USAGE)
    # no items, no usage: the turn's usage as it stands; a second finish writes nothing
    store.begin_step(conv_id, tid, 3, "model")
    empty = store.complete_model_step(conv_id, tid, 3, [], None, None)
    assert empty is not None and (empty.items, empty.first_index) == ([], None)
    assert empty.turn_usage == store.turn_usage(tid)
    assert store.complete_model_step(conv_id, tid, 3, [answer("c")], None, USAGE) is None
    assert store.finish_model_step(conv_id, tid, 3, [answer("c")], None, USAGE) is False
