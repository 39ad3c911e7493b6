"""`Histories` (omnigent/server/histories.py): the history built from what is new is `build_history`'s.

Why: each model step builds its history from the items stored since the
session's last step, so the cost of a step does not grow with the
conversation. That is only allowed if the result is exactly what building
from every stored item gives, for every shape a conversation takes: failed
turns whose message is merged into the next, tool steps, calls answered only
by a synthetic output, turns closed after their tool results, items without
text, items stored after a turn's message that are not the turn's.
"""

from __future__ import annotations

import random

import pytest

from omnigent.server.histories import Histories, SentHistory, sent_base
from omnigent.server.history import build_history
from omnigent.store import Store
from protocol.history import chain


def _user(text):
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _answer(text, n):
    return {"id": f"msg_{n}", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call(call_id):
    return {"id": f"fc_{call_id}", "type": "function_call", "call_id": call_id, "name": "shell",
            "arguments": "{}", "status": "completed"}


def _output(call_id):
    return {"type": "function_call_output", "call_id": call_id, "output": f"out {call_id}"}


class Conversation:
    """A store conversation driven turn by turn, checking every step's history both ways."""

    def __init__(self, store: Store, histories: Histories) -> None:
        self.store, self.histories = store, histories
        self.conv = store.create_conversation(agent_id=None)["id"]
        self.n = 0
        self.steps = 0

    def check(self, input_id, turn_id):
        built = self.histories.build(self.store, self.conv, input_id, turn_id)
        turn_items = {i["id"] for i in self.store.list_turn_items(self.conv, turn_id)} if turn_id else set()
        expected = build_history(self.store.list_items(self.conv), input_id, turn_id, turn_items=turn_items)
        assert built.items == expected
        parts, links = chain(expected)
        assert built.parts == parts and built.links == links
        assert 0 <= built.settled <= len(built.items)
        self.steps += 1
        return built

    def turn(self, rng: random.Random):
        self.n += 1
        user = self.store.append_item(self.conv, _user(f"q{self.n}"))
        turn_id = self.store.create_turn(self.conv, user["id"])["id"]
        settled_before = []
        for step in range(rng.randint(1, 4)):
            built = self.check(user["id"], turn_id)
            settled_before.append((built.epoch, built.items[:built.settled]))
            roll = rng.random()
            if roll < 0.15:
                return  # the turn fails: no answer (its message is merged into the next)
            if roll < 0.2:
                self.store.append_item(self.conv, {"type": "reasoning", "id": f"rs_{self.n}_{step}", "summary": []},
                                       turn_id=turn_id)  # left out: no encrypted content
                return
            if roll < 0.25:
                self.store.append_item(self.conv, _user(f"aside {self.n}"))  # not the turn's, not sent in it
            if roll < 0.55:
                calls = [f"c{self.n}_{step}_{k}" for k in range(rng.randint(1, 2))]
                for call_id in calls:
                    self.store.append_item(self.conv, _call(call_id), turn_id=turn_id)
                if rng.random() < 0.2:
                    return  # failed before its tools ran: synthetic outputs, a closing message
                for call_id in calls:
                    self.store.append_item(self.conv, _output(call_id), turn_id=turn_id)
                if rng.random() < 0.15:
                    return  # ended on tool results
                continue
            text = "" if rng.random() < 0.1 else f"a{self.n}"
            self.store.append_item(self.conv, _answer(text, f"{self.n}_{step}"), turn_id=turn_id)
            break
        # what was settled stays the start of every later history of the epoch
        built = self.check(None, None)
        for epoch, settled in settled_before:
            if epoch == built.epoch:
                assert built.items[:len(settled)] == settled


@pytest.mark.parametrize("seed", range(6))
def test_incremental_histories_are_build_historys(tmp_path, seed):
    rng = random.Random(seed)
    with Store(tmp_path / "chat.db") as store:
        histories = Histories()
        conversations = [Conversation(store, histories) for _ in range(3)]
        for _ in range(40):
            rng.choice(conversations).turn(rng)
        assert sum(c.steps for c in conversations) >= 40


def test_a_long_conversation_settles_all_but_its_last_turn(tmp_path):
    with Store(tmp_path / "chat.db") as store:
        histories = Histories()
        c = Conversation(store, histories)
        for n in range(50):
            user = store.append_item(c.conv, _user(f"q{n}"))
            turn_id = store.create_turn(c.conv, user["id"])["id"]
            built = c.check(user["id"], turn_id)
            assert built.settled == len(built.items) - 1  # only the new message is unsettled
            store.append_item(c.conv, _answer(f"a{n}", n), turn_id=turn_id)


def test_an_older_turn_again_builds_from_scratch(tmp_path):
    with Store(tmp_path / "chat.db") as store:
        histories = Histories()
        c = Conversation(store, histories)
        first = store.append_item(c.conv, _user("q1"))
        t1 = store.create_turn(c.conv, first["id"])["id"]
        store.append_item(c.conv, _answer("a1", 1), turn_id=t1)
        second = store.append_item(c.conv, _user("q2"))
        t2 = store.create_turn(c.conv, second["id"])["id"]
        store.append_item(c.conv, _answer("a2", 2), turn_id=t2)
        latest = c.check(None, None)
        again = c.check(first["id"], t1)  # e.g. a retry of the first turn
        assert len(again.items) == 2 and again.epoch != latest.epoch
        c.check(None, None)


def test_the_base_sent_is_what_the_runner_holds_or_the_settled_part(tmp_path):
    with Store(tmp_path / "chat.db") as store:
        histories = Histories()
        c = Conversation(store, histories)
        u1 = store.append_item(c.conv, _user("q1"))
        t1 = store.create_turn(c.conv, u1["id"])["id"]
        store.append_item(c.conv, _answer("a1", 1), turn_id=t1)
        u2 = store.append_item(c.conv, _user("q2"))
        t2 = store.create_turn(c.conv, u2["id"])["id"]
        built = c.check(u2["id"], t2)
        sent = SentHistory(7, len(built.items), built.links[-1], built.settled, built.epoch)
        assert sent_base(built, None, 7) == 0
        assert sent_base(built, sent, 8) == 0  # rebound since: in full
        # t2 failed; q3 is merged into q2: the runner's last item is not the start of the next history
        u3 = store.append_item(c.conv, _user("q3"))
        t3 = store.create_turn(c.conv, u3["id"])["id"]
        nxt = c.check(u3["id"], t3)
        assert nxt.items[-1]["content"][0]["text"] == "q2\n\nq3"
        assert sent_base(nxt, sent, 7) == 2 == built.settled  # q1 and a1, settled then
        store.append_item(c.conv, _answer("a3", 3), turn_id=t3)
        sent = SentHistory(7, len(nxt.items), nxt.links[-1], nxt.settled, nxt.epoch)
        u4 = store.append_item(c.conv, _user("q4"))
        t4 = store.create_turn(c.conv, u4["id"])["id"]
        last = c.check(u4["id"], t4)
        assert sent_base(last, sent, 7) == len(nxt.items)  # all it was sent
