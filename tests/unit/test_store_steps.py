"""The store's turn steps (store/steps.py): each step's output written once, in one transaction.

What the agent loop's recovery relies on: a step's items land once whatever
repeats; a turn's steps continue its output slots; a model step that failed
can be begun again but a stored one never is; usage adds up per turn and
per session; a turn row shows its last step; `/retry` requeues the same turn.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omnigent.store import ConflictError, NotFoundError, Store
from omnigent.store.steps import add_usage


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def call(call_id: str, command: str = "ls") -> dict:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": "shell",
            "arguments": f'{{"command": "{command}"}}', "status": "completed"}


def text(words: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": words}]}


USAGE = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
         "input_tokens_details": {"cached_tokens": 2}}


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "chat.db") as s:
        yield s


@pytest.fixture
def turn(store: Store) -> dict:
    conv = store.create_conversation(agent_id=None, workspace="/w")
    _, turn = store.queue_message(conv["id"], user("do it"))
    return turn


def test_a_model_step_then_a_tool_step(store: Store, turn: dict):
    cid, tid = turn["conversation_id"], turn["id"]
    row = store.begin_step(cid, tid, 0, "model", attempt=1)
    assert (row["kind"], row["status"], row["attempt"], row["ended_at"], row["usage"]) == ("model", "running", 1,
                                                                                          None, None)
    assert store.get_turn(tid)["step"] == row
    assert store.finish_model_step(cid, tid, 0, [text("let me look"), call("c1")], "resp_1", USAGE) is True
    # a duplicate (late) completion of the same step writes nothing
    assert store.finish_model_step(cid, tid, 0, [text("again"), call("c1")], "resp_1", USAGE) is False
    assert store.begin_step(cid, tid, 1, "tool", call_id="c1", tool="shell", arguments='{"command": "ls"}',
                            attempt=1)["status"] == "running"
    assert store.finish_tool_step(cid, tid, 1, "c1", "a\nb\nexit code: 0", "completed") is True
    assert store.finish_tool_step(cid, tid, 1, "c1", "twice", "completed") is False

    items = store.list_items(cid)
    assert [i["type"] for i in items] == ["message", "message", "function_call", "function_call_output"]
    output = items[-1]
    assert (output["call_id"], output["output"], output["status"]) == ("c1", "a\nb\nexit code: 0", "completed")
    slots = store.conn.execute("SELECT turn_id, output_index FROM conversation_items WHERE conversation_id = ?"
                               " ORDER BY position", [cid]).fetchall()
    assert slots == [(None, None), (tid, 0), (tid, 1), (tid, 2)]  # the user's message is not the turn's output

    steps = store.steps(tid)
    assert [(s["step"], s["kind"], s["status"]) for s in steps] == [(0, "model", "completed"), (1, "tool", "completed")]
    assert steps[0]["usage"] == USAGE and steps[0]["ended_at"] is not None
    assert (steps[1]["call_id"], steps[1]["tool"], steps[1]["arguments"]) == ("c1", "shell", '{"command": "ls"}')
    listed = store.list_turns(cid)[0]
    assert listed["step"] == steps[1] and listed["usage"] == USAGE


def test_begin_step_is_idempotent_and_a_new_attempt_restarts_only_an_unstored_step(store: Store, turn: dict):
    cid, tid = turn["conversation_id"], turn["id"]
    first = store.begin_step(cid, tid, 0, "model", attempt=1)
    assert store.begin_step(cid, tid, 0, "model", attempt=1) == first
    assert store.end_step(tid, 0, "interrupted", "runner lost") is True
    assert store.end_step(tid, 0, "failed") is False  # ended already
    assert store.get_step(tid, 0)["status"] == "interrupted"
    # asked again with the same attempt: unchanged
    assert store.begin_step(cid, tid, 0, "model", attempt=1)["status"] == "interrupted"
    again = store.begin_step(cid, tid, 0, "model", attempt=2)
    assert (again["status"], again["attempt"], again["error"], again["ended_at"]) == ("running", 2, None, None)
    assert store.finish_model_step(cid, tid, 0, [text("done")], None, None) is True
    # a stored step is never begun again
    assert store.begin_step(cid, tid, 0, "model", attempt=3)["attempt"] == 2
    assert store.get_step(tid, 0)["status"] == "completed"
    with pytest.raises(ValueError):
        store.begin_step(cid, tid, 1, "thinking")
    with pytest.raises(NotFoundError):
        store.begin_step("conv_missing", tid, 1, "model")


def test_a_running_tool_step_begun_again_stays_running(store: Store, turn: dict):
    cid, tid = turn["conversation_id"], turn["id"]
    store.begin_step(cid, tid, 0, "model", attempt=1)
    store.finish_model_step(cid, tid, 0, [call("c1")], None, None)
    store.begin_step(cid, tid, 1, "tool", call_id="c1", tool="read_file", attempt=1)
    again = store.begin_step(cid, tid, 1, "tool", call_id="c1", tool="read_file", attempt=2)
    assert (again["status"], again["attempt"]) == ("running", 2)
    store.finish_tool_step(cid, tid, 1, "c1", "text", "completed")
    assert store.begin_step(cid, tid, 1, "tool", call_id="c1", attempt=3)["attempt"] == 2


@pytest.mark.parametrize("status,item_status,step_status,error", [
    ("completed", "completed", "completed", None),
    ("error", "completed", "completed", "error"),
    ("timeout", "completed", "completed", "timeout"),
    ("refused", "completed", "completed", "refused"),
    ("interrupted", "interrupted", "interrupted", "interrupted"),
    ("cancelled", "cancelled", "cancelled", "cancelled"),
    ("not_run", "not_run", "not_run", "not_run"),
])
def test_tool_outcomes_as_item_and_step_statuses(store: Store, turn: dict, status, item_status, step_status, error):
    cid, tid = turn["conversation_id"], turn["id"]
    store.begin_step(cid, tid, 0, "model")
    store.finish_model_step(cid, tid, 0, [call("c1")], None, None)
    assert store.finish_tool_step(cid, tid, 1, "c1", f"output: {status}", status) is True
    assert store.list_items(cid)[-1]["status"] == item_status
    step = store.get_step(tid, 1)
    assert (step["kind"], step["status"], step["error"], step["call_id"]) == ("tool", step_status, error, "c1")


def test_tool_step_arguments_checked(store: Store, turn: dict):
    cid, tid = turn["conversation_id"], turn["id"]
    with pytest.raises(ValueError):
        store.finish_tool_step(cid, tid, 1, "c1", "x", "exploded")
    with pytest.raises(TypeError):
        store.finish_tool_step(cid, tid, 1, "c1", None, "completed")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.end_step(tid, 0, "completed")
    assert store.steps(tid) == []


def test_a_bad_item_rolls_the_whole_step_back(store: Store, turn: dict):
    cid, tid = turn["conversation_id"], turn["id"]
    store.begin_step(cid, tid, 0, "model")
    with pytest.raises(ValueError):
        store.finish_model_step(cid, tid, 0, [text("ok"), {"no": "type"}], None, USAGE)
    assert store.get_step(tid, 0)["status"] == "running"
    assert store.get_turn(tid)["usage"] is None
    assert store.count_items(cid) == 1  # the user's message only
    assert store.finish_model_step(cid, tid, 0, [text("ok")], None, USAGE) is True


def test_usage_adds_up_per_turn_and_per_session(store: Store, turn: dict):
    cid, tid = turn["conversation_id"], turn["id"]
    for step in (0, 2):
        store.begin_step(cid, tid, step, "model")
        store.finish_model_step(cid, tid, step, [text(f"step {step}")], None, USAGE)
    store.begin_step(cid, tid, 1, "model")
    store.finish_model_step(cid, tid, 1, [text("no usage")], None, None)
    assert store.get_turn(tid)["usage"] == {"input_tokens": 20, "output_tokens": 10, "total_tokens": 30,
                                            "input_tokens_details": {"cached_tokens": 4}}
    other = store.create_turn(cid, None)
    store.begin_step(cid, other["id"], 0, "model")
    store.finish_model_step(cid, other["id"], 0, [], None, {"input_tokens": 1, "output_tokens": 1,
                                                           "total_tokens": 2})
    store.create_turn(cid, None)  # no usage: not counted
    assert store.session_usage(cid) == {"input_tokens": 21, "output_tokens": 11, "total_tokens": 32, "turns": 2}
    fresh = store.create_conversation(agent_id=None)
    assert store.session_usage(fresh["id"]) == {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "turns": 0}


def test_add_usage_tolerates_odd_shapes():
    assert add_usage({"a": 1, "x": "keep"}, {"a": 2, "b": {"c": 3}, "x": "other", "flag": True}) == {
        "a": 3, "b": {"c": 3}, "x": "keep", "flag": True}
    assert add_usage({"a": "text"}, {"a": 4}) == {"a": 4}


def test_waiting_moves_the_step_only(store: Store, turn: dict):
    cid, tid = turn["conversation_id"], turn["id"]
    store.start_turn(tid, "runner_a")
    store.begin_step(cid, tid, 1, "tool", call_id="c1", tool="shell")
    assert store.set_step_waiting(tid, 1, True) is True
    assert store.set_step_waiting(tid, 1, True) is False
    row = store.get_turn(tid)
    assert (row["status"], row["step"]["status"]) == ("running", "waiting")
    assert store.set_step_waiting(tid, 1, False) is True
    assert store.get_step(tid, 1)["status"] == "running"
    store.set_step_waiting(tid, 1, True)
    assert store.finish_tool_step(cid, tid, 1, "c1", "cancelled", "cancelled") is True  # finishes a waiting step
    assert store.set_step_waiting(tid, 1, False) is False


def test_a_waiting_turn_is_busy_and_open(store: Store, turn: dict):
    """0008 allows turns.status 'waiting' (the loop may set it): the store treats it as under way."""
    cid, tid = turn["conversation_id"], turn["id"]
    store.start_turn(tid, "runner_a")
    with store._write():
        store.conn.execute("UPDATE turns SET status = 'waiting' WHERE id = ?", [tid])
    _, later = store.queue_message(cid, user("next"))
    assert store.get_item(cid, later["input_item_id"]) is None  # pending behind the waiting turn
    assert store.finish_turn(tid, "cancelled")["status"] == "cancelled"


def test_waiting_turns_of_a_dead_process_are_found(store: Store, turn: dict):
    cid, tid = turn["conversation_id"], turn["id"]
    store.start_turn(tid, "runner_a", owner_pid=999_999)
    with store._write():
        store.conn.execute("UPDATE turns SET status = 'waiting' WHERE id = ?", [tid])
    taken = store.take_over_orphaned_turns(lambda pid: False, owner_pid=os.getpid())
    assert [(t["id"], t["status"]) for t in taken] == [(tid, "waiting")]
    assert store.running_own_turn(cid, os.getpid())["id"] == tid
    assert store.interrupt_runner_turns("runner_a") == []  # waits for a user, not for its runner
    assert [t["id"] for t in store.interrupt_orphaned_turns(lambda pid: False)] == [tid]
    with pytest.raises(ValueError):
        store.finish_turn(tid, "waiting")


def test_requeue_keeps_the_turn_and_its_steps(store: Store, turn: dict):
    cid, tid = turn["conversation_id"], turn["id"]
    store.start_turn(tid, "runner_a", owner_pid=999_999)
    store.begin_step(cid, tid, 0, "model", attempt=1)
    store.finish_model_step(cid, tid, 0, [call("c1")], None, USAGE)
    store.begin_step(cid, tid, 1, "tool", call_id="c1", attempt=1)
    with pytest.raises(ConflictError):
        store.requeue_turn(tid)  # still running
    store.mark_interrupted(tid)
    again = store.requeue_turn(tid)
    assert (again["id"], again["status"], again["attempt"], again["owner_pid"], again["ended_at"]) == (
        tid, "queued", 1, os.getpid(), None)
    assert again["usage"] == USAGE and again["step"]["step"] == 1
    assert len(store.steps(tid)) == 2
    assert store.next_own_queued_turn(cid, os.getpid())["id"] == tid
    store.start_turn(tid, "runner_b")
    store.finish_turn(tid, "completed")
    with pytest.raises(ConflictError):
        store.requeue_turn(tid)
    with pytest.raises(NotFoundError):
        store.requeue_turn("turn_missing")


def test_queue_message_stores_the_approval_timeout(store: Store):
    cid = store.create_conversation(agent_id=None)["id"]
    assert store.queue_message(cid, user("a"))[1]["approval_timeout"] is None
    assert store.queue_message(cid, user("b"), approval_timeout=0)[1]["approval_timeout"] == 0
    assert store.queue_message(cid, user("c"), approval_timeout=600.0)[1]["approval_timeout"] == 600.0
    with pytest.raises(ValueError):
        store.queue_message(cid, user("d"), approval_timeout=-1)
    assert [t["approval_timeout"] for t in store.list_turns(cid)] == [None, 0, 600.0]


def test_permission_mode_of_a_session(store: Store):
    conv = store.create_conversation(agent_id=None, permission_mode="deny")
    assert conv["permission_mode"] == "deny"
    assert store.update_conversation(conv["id"], permission_mode="auto")["permission_mode"] == "auto"
    assert store.update_conversation(conv["id"], permission_mode=None)["permission_mode"] is None
    with pytest.raises(ValueError):
        store.update_conversation(conv["id"], permission_mode="yolo")
    with pytest.raises(ValueError):
        store.create_conversation(agent_id=None, permission_mode="always")


def test_a_turn_output_after_steps_takes_the_next_slots(store: Store, turn: dict):
    cid, tid = turn["conversation_id"], turn["id"]
    store.begin_step(cid, tid, 0, "model")
    store.finish_model_step(cid, tid, 0, [call("c1")], None, None)
    store.finish_tool_step(cid, tid, 1, "c1", "out", "completed")
    assert store.append_turn_output(cid, tid, [text("the end")], "resp_x") is True
    slots = [r[0] for r in store.conn.execute(
        "SELECT output_index FROM conversation_items WHERE turn_id = ? ORDER BY position", [tid])]
    assert slots == [0, 1, 2]
    assert store.get_turn(tid)["output_persisted"] is True

def test_requeue_takes_the_retrying_clients_approval_timeout_or_keeps_the_turns(store: Store):
    conv = store.create_conversation(agent_id=None, workspace="/w")
    _, turn = store.queue_message(conv["id"], user("do it"), approval_timeout=None)  # posted at a terminal
    tid = turn["id"]
    store.start_turn(tid, "runner_a")
    store.begin_step(conv["id"], tid, 0, "model", attempt=1)
    store.mark_interrupted(tid)
    assert store.requeue_turn(tid)["approval_timeout"] is None  # kept
    store.start_turn(tid, "runner_a")
    store.mark_interrupted(tid)
    assert store.requeue_turn(tid, approval_timeout=0.0)["approval_timeout"] == 0.0  # retried from a pipe
    fresh = store.create_turn(conv["id"], turn["input_item_id"], approval_timeout=600.0)
    assert fresh["approval_timeout"] == 600.0


def test_list_turn_items_is_that_turns_output_in_order(store: Store):
    conv = store.create_conversation(agent_id=None, workspace="/w")
    _, first = store.queue_message(conv["id"], user("one"))
    store.finish_model_step(conv["id"], first["id"], 0, [call("c1")], None, USAGE)
    store.finish_tool_step(conv["id"], first["id"], 1, "c1", "ok", "completed")
    store.finish_model_step(conv["id"], first["id"], 2, [text("done")], None, USAGE)
    _, second = store.queue_message(conv["id"], user("two"))
    store.finish_model_step(conv["id"], second["id"], 0, [text("other")], None, USAGE)
    mine = store.list_turn_items(conv["id"], first["id"])
    assert [i["type"] for i in mine] == ["function_call", "function_call_output", "message"]
    assert [i["type"] for i in store.list_turn_items(conv["id"], second["id"])] == ["message"]
    assert store.list_turn_items(conv["id"], "turn_missing") == []


def test_a_step_begun_waiting_is_begun_and_set_waiting_in_one_transaction(store: Store, turn: dict):
    cid, tid = turn["conversation_id"], turn["id"]
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    row = store.begin_step(cid, tid, 0, "tool", call_id="c1", tool="shell", attempt=1, waiting=True)
    store.conn.set_trace_callback(None)
    assert (row["status"], row["attempt"]) == ("waiting", 1) and statements.count("BEGIN IMMEDIATE") == 1
    assert store.begin_step(cid, tid, 0, "tool", call_id="c1", attempt=1, waiting=True) == row  # idempotent
    assert store.set_step_waiting(tid, 0, False) is True  # dispatched: running
    # dispatched again after its runner was lost: waiting again until it is
    assert store.begin_step(cid, tid, 0, "tool", call_id="c1", attempt=2, waiting=True)["status"] == "waiting"


def test_a_model_step_finished_unbegun_or_ended_or_in_a_missing_session(store: Store, turn: dict):
    """The usual finish is one update of a step under way; every other case takes the checks it took
    before: a step never begun is begun and completed, an ended one is left as it is, and a missing
    session is NotFoundError with nothing written."""
    cid, tid = turn["conversation_id"], turn["id"]
    done = store.complete_model_step(cid, tid, 0, [text("never begun")], "resp_0", USAGE)
    assert done is not None and done.first_index == 0 and done.turn_usage == USAGE
    step = store.get_step(tid, 0)
    assert (step["kind"], step["status"], step["usage"]) == ("model", "completed", USAGE)
    store.begin_step(cid, tid, 1, "model")
    store.end_step(tid, 1, "failed", "model error")
    assert store.complete_model_step(cid, tid, 1, [text("too late")], None, USAGE) is None
    assert store.get_step(tid, 1)["status"] == "failed"
    assert store.get_turn(tid)["usage"] == USAGE
    with pytest.raises(NotFoundError):
        store.complete_model_step("conv_missing", tid, 2, [text("x")], None, USAGE)
    assert store.get_step(tid, 2) is None and store.count_items(cid) == 2


def test_a_first_step_adds_to_usage_the_turn_holds_already(store: Store, turn: dict):
    """Step 0 normally finds the turn's usage empty and sets it in one statement; usage the row holds
    already (as a row of an older release may) is added to, not replaced."""
    cid, tid = turn["conversation_id"], turn["id"]
    store.conn.execute("UPDATE turns SET usage = ? WHERE id = ?", ['{"input_tokens": 1, "output_tokens": 2}', tid])
    store.conn.commit()
    store.begin_step(cid, tid, 0, "model")
    done = store.complete_model_step(cid, tid, 0, [text("hi")], None, {"input_tokens": 10, "output_tokens": 5})
    assert done is not None and done.turn_usage == {"input_tokens": 11, "output_tokens": 7}
    assert store.get_turn(tid)["usage"] == done.turn_usage


def test_begin_step_in_a_missing_session_writes_nothing(store: Store, turn: dict):
    """The session is checked once its step's insert has failed on the foreign key: NotFoundError,
    and nothing written, as when it was checked first."""
    with pytest.raises(NotFoundError):
        store.begin_step("conv_missing", turn["id"], 0, "model")
    assert store.steps(turn["id"]) == []
    assert store.begin_step(turn["conversation_id"], turn["id"], 0, "model")["status"] == "running"
