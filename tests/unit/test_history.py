"""What a turn sends to the model (omnigent/server/history.py), from stored items.

Why: servers with alternation-checking chat templates (llama.cpp with
Mistral-style templates) answer 400 to two user messages in a row, so one
failed turn used to break a conversation for good; and the Responses API
takes output items back only in its own shape. Checked on hand-made
histories and on every conversation of a store written by release 0.1.0.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from omnigent.runner.wire import chat_messages, normalize_input
from omnigent.server.history import build_history
from omnigent.store import Store

LEGACY = Path(__file__).resolve().parents[1] / "resources" / "stores" / "chat-0.1.0.db"


def user(text: str, item_id: str) -> dict:
    return {"id": item_id, "type": "message", "role": "user", "status": "completed", "response_id": None,
            "created_at": 1.0, "content": [{"type": "input_text", "text": text}]}


def answer(text: str, item_id: str = "msg_a", **extra) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": "completed", "response_id": "resp_1",
            "created_at": 2.0, "content": [{"type": "output_text", "text": text, "annotations": []}], **extra}


def roles(items: list[dict]) -> list[str]:
    return [i.get("role") or i["type"] for i in items]


def test_user_messages_go_as_role_and_content_and_outputs_as_received():
    history = build_history([user("hi", "u1"), answer("hello"), user("again", "u2")], "u2")
    assert history == [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"id": "msg_a", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "hello", "annotations": []}]},
        {"role": "user", "content": [{"type": "input_text", "text": "again"}]},
    ]


def test_an_unanswered_user_message_is_merged_into_the_next():
    # u1's turn failed (wrong key, unreachable server) or was cancelled: no answer stored
    history = build_history([user("first", "u1"), user("second", "u2")], "u2")
    assert history == [{"role": "user", "content": [{"type": "input_text", "text": "first\n\nsecond"}]}]


def test_items_after_the_turns_own_message_are_not_sent():
    items = [user("a", "u1"), answer("b"), user("c", "u2"), answer("d", "msg_d"), user("e", "u3")]
    assert roles(build_history(items, "u2")) == ["user", "assistant", "user"]


def test_empty_answers_and_summary_only_reasoning_are_left_out():
    reasoning = {"id": "rs_1", "type": "reasoning", "status": "completed", "response_id": "resp_1",
                 "summary": [{"type": "summary_text", "text": "thinking"}]}
    sealed = {**reasoning, "id": "rs_2", "encrypted_content": "gAAA"}
    items = [user("q1", "u1"), reasoning, answer("", "msg_empty"), user("q2", "u2"), sealed, answer("a2"),
             user("q3", "u3")]
    history = build_history(items, "u3")
    assert roles(history) == ["user", "reasoning", "assistant", "user"]
    assert history[0]["content"][0]["text"] == "q1\n\nq2"  # a reasoning-only answer left q1 unanswered
    assert history[1] == {"id": "rs_2", "type": "reasoning", "status": "completed",
                          "summary": [{"type": "summary_text", "text": "thinking"}], "encrypted_content": "gAAA"}


def test_a_partial_answer_counts_as_an_answer():
    items = [user("q1", "u1"), answer("half an", status="incomplete"), user("q2", "u2")]
    history = build_history(items, "u2")
    assert roles(history) == ["user", "assistant", "user"] and history[1]["status"] == "incomplete"


def test_non_text_parts_are_kept_when_merging():
    image = {"id": "u1", "type": "message", "role": "user",
             "content": [{"type": "input_image", "image_url": "data:x"}]}
    [merged] = build_history([image, user("what is it?", "u2")], "u2")
    assert merged["content"] == [{"type": "input_image", "image_url": "data:x"},
                                 {"type": "input_text", "text": "what is it?"}]


def test_every_conversation_of_the_0_1_0_store_resumes_well_formed(tmp_path):
    path = tmp_path / "chat.db"
    shutil.copy(LEGACY, path)
    with Store(path) as store:
        conversations = store.list_conversations(limit=None)
        assert len(conversations) == 100
        for conv in conversations:
            store.append_item(conv["id"], {"type": "message", "role": "user",
                                           "content": [{"type": "input_text", "text": "next"}]})
            items = store.list_items(conv["id"])
            history = build_history(items, items[-1]["id"])
            assert roles(history) == ["user", "assistant"] * (len(history) // 2) + ["user"]
            for item in history:
                assert not {"response_id", "created_at", "turn_id"} & set(item)
                if item["role"] == "user":
                    assert set(item) == {"role", "content"}
                else:
                    assert item["id"].startswith("msg_") and item["status"] == "completed"
            chat = chat_messages("sys", history)
            assert [m["role"] for m in chat] == ["system"] + roles(history)
            assert normalize_input(history) == history
        # a conversation that ended in a failed turn (0.1.0 wrote some): its two questions meet merged
        failed = [c for c in conversations if store.list_turns(c["id"], status="failed")]
        assert failed
        items = store.list_items(failed[0]["id"])
        last_user = build_history(items, items[-1]["id"])[-1]
        assert last_user["content"][0]["text"].endswith("\n\nnext")


def test_new_items_keep_the_endpoints_shape_in_the_store(tmp_path):
    with Store(tmp_path / "chat.db") as store:
        conv = store.create_conversation(agent_id=None)["id"]
        u = store.append_item(conv, {"type": "message", "role": "user", "content": "q"})
        turn = store.create_turn(conv, u["id"])
        item = {"id": "msg_endpoint", "type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "a", "annotations": []}]}
        store.append_turn_output(conv, turn["id"], [item], "resp_9")
        [(data,)] = store.conn.execute("SELECT data FROM conversation_items WHERE id = 'msg_endpoint'").fetchall()
        assert json.loads(data) == item  # as the endpoint returned it; omnigent's fields are columns
        listed = store.get_item(conv, "msg_endpoint")
        assert listed == {**item, "response_id": "resp_9", "created_at": listed["created_at"]}
        assert build_history(store.list_items(conv), None)[1] == item
