"""A restarted server adopts the turns its runners still run, refuses late ones (issue 8 §2), on a MockClock.

The store holds what a dead server left: a session bound to runner R, its
turn running (attempt 1, generation 1), owned by a process that is gone.
The real server pieces (`TurnService.take_over`, `serve_runner`) start on
it, and hand-driven runners connect over memory transports:

- R claims the turn in its hello: it is adopted, nothing is dispatched
  again, the answer R sends (buffered while the server was away) is stored
  once, as attempt 1;
- nobody claims it within the grace: it runs again (attempt 2) on another
  runner, and R, coming back late, is told to cancel, and what it sends is
  neither stored nor published;
- the session moved on (rebound) before R came back: R's claim is refused
  by generation;
- a live process's running turn is not taken;
- while the server lives, a daemon runner whose link drops mid-turn is
  waited for and adopted again, while a local runner's turn (its process
  ends with its link) is dispatched again at once, as before.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

import protocol as p
from omnigent.link.runner_secrets import hash_secret
from omnigent.server.hub import EventHub
from omnigent.server.registry import RunnerRegistry
from omnigent.server.runner_link import serve_runner
from omnigent.server.state import ServerState
from omnigent.server.turns import TurnService
from omnigent.store import Store
from protocol import events as ev
from tests.support.fake_runners import MemoryTransport, assistant_item, collect_until_terminal

DEAD = lambda pid: False  # noqa: E731  the previous server process is gone
GRACE = 10.0


class HandRunner:
    """A runner connection driven by the test: the frames it sends, the frames it got."""

    def __init__(self, state: ServerState, runner_id: str, nursery: trio.Nursery, host_id: str = "host_d") -> None:
        self.runner_id = runner_id
        to_server, from_runner = trio.open_memory_channel[str](math.inf)
        to_runner, self._in = trio.open_memory_channel[str](math.inf)
        self._out = to_server
        self.transport = MemoryTransport(to_runner, from_runner)
        self.got: list[p.Frame] = []
        state.store.add_runner_credential(runner_id, hash_secret(f"secret-{runner_id}"), kind="host",
                                          host_id=host_id)  # a daemon's runner: it outlives the server
        nursery.start_soon(self._serve, state)

    async def _serve(self, state: ServerState) -> None:
        try:
            await serve_runner(state, self.runner_id, self.transport, f"secret-{self.runner_id}")
        except* ConnectionError:
            pass
        finally:
            self.transport.abort()

    def send(self, frame: p.Frame) -> None:
        self._out.send_nowait(p.encode(frame))

    async def hello(self, in_flight: list[dict[str, Any]] = ()) -> None:
        self.send(p.Hello(self.runner_id, 4242, p.PROTOCOL_VERSION, ["fake"], list(in_flight)))
        assert isinstance(await self.recv(), p.HelloAck)

    async def recv(self) -> p.Frame:
        """The next frame that is not a ping (pings are answered)."""
        while True:
            frame = p.decode(await self._in.receive())
            if isinstance(frame, p.Ping):
                self.send(p.Pong(frame.ts))
                continue
            self.got.append(frame)
            return frame

    def answer(self, turn_id: str, text: str) -> None:
        self.send(p.TurnEvent(turn_id, {"type": ev.TEXT_DELTA, "turn_id": turn_id, "delta": text}))
        self.send(p.TurnCompleted(turn_id, f"resp_{text}", [assistant_item(text)]))


def _leftovers(store: Store, runner_id: str = "runner_r", host_id: str = "host_d") -> tuple[str, str]:
    """What a server killed mid-turn leaves in the store; returns (session id, turn id)."""
    store.add_runner_credential(runner_id, hash_secret(f"secret-{runner_id}"), kind="host", host_id=host_id)
    agent = store.upsert_agent("helper", {"name": "helper", "model": "m"})
    sid = store.create_conversation(agent_id=agent["id"])["id"]
    store.set_runner(sid, runner_id)  # generation 1
    item = store.append_item(sid, {"type": "message", "role": "user", "content": "hi"})
    turn = store.create_turn(sid, item["id"], owner_pid=999_999)
    store.start_turn(turn["id"], runner_id, 999_999, generation=1)
    return sid, turn["id"]


@asynccontextmanager
async def _server(store: Store) -> AsyncIterator[tuple[ServerState, trio.Nursery]]:
    async with trio.open_nursery() as nursery:
        hub, registry = EventHub(), RunnerRegistry()
        turns = TurnService(store, hub, registry, nursery, adopt_grace=GRACE)
        state = ServerState(store, hub, registry, turns, "t", ping_interval=1.0, ping_allowance=6.0)
        turns.take_over(DEAD)
        yield state, nursery
        nursery.cancel_scope.cancel()


def _answers(store: Store, sid: str) -> list[str]:
    return [i["content"][0]["text"] for i in store.list_items(sid) if i.get("role") == "assistant"]


async def test_a_claimed_turn_is_adopted_and_its_answer_stored_once(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    sid, tid = _leftovers(store)
    async with _server(store) as (state, nursery):
        r = HandRunner(state, "runner_r", nursery)
        await trio.sleep(2)  # the runner's backoff
        await r.hello([{"turn_id": tid, "attempt": 1, "generation": 1}])
        r.answer(tid, "buffered")  # what it kept while the server was away
        r.answer(tid, "buffered")  # a resend of the same end: stored once all the same
        await collect_until_terminal(state.hub, sid, tid)
        await trio.testing.wait_all_tasks_blocked()
        turn = store.get_turn(tid)
        assert (turn["status"], turn["attempt"]) == ("completed", 1)
        assert _answers(store, sid) == ["buffered"]
        assert not [f for f in r.got if isinstance(f, (p.TurnStart, p.Cancel))]  # nothing dispatched again
    store.close()


async def test_unclaimed_within_the_grace_runs_again_and_the_late_runner_is_refused(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    sid, tid = _leftovers(store)
    async with _server(store) as (state, nursery):
        s = HandRunner(state, "runner_s", nursery)
        await s.hello()
        start = await s.recv()
        assert trio.current_time() >= GRACE  # not before the grace ran out
        assert isinstance(start, p.TurnStart) and (start.turn_id, start.attempt) == (tid, 2)
        assert start.generation == 2  # rebound from R to S
        r = HandRunner(state, "runner_r", nursery)  # R comes back late, with attempt 1's answer
        await r.hello([{"turn_id": tid, "attempt": 1, "generation": 1}])
        assert await r.recv() == p.Cancel(tid)
        r.answer(tid, "late")
        await trio.testing.wait_all_tasks_blocked()
        s.answer(tid, "fresh")
        events = await collect_until_terminal(state.hub, sid, tid)
        assert _answers(store, sid) == ["fresh"]
        assert all(e.event.get("delta") != "late" for e in events)
        assert (store.get_turn(tid)["status"], store.get_turn(tid)["attempt"]) == ("completed", 2)
    store.close()


async def test_a_claim_of_a_session_that_moved_on_is_refused_by_generation(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    sid, tid = _leftovers(store)
    async with _server(store) as (state, nursery):
        s = HandRunner(state, "runner_s", nursery)
        await s.hello()
        store.set_runner(sid, "runner_s")  # a client rebinds the session: generation 2
        state.turns.session_moved(sid)
        r = HandRunner(state, "runner_r", nursery)
        await r.hello([{"turn_id": tid, "attempt": 1, "generation": 1},
                       {"turn_id": "turn_unknown", "attempt": 3, "generation": 1}])
        assert {await r.recv(), await r.recv()} == {p.Cancel(tid), p.Cancel("turn_unknown")}
        r.answer(tid, "late")
        start = await s.recv()
        assert (start.attempt, start.generation) == (2, 2)
        s.answer(tid, "fresh")
        await collect_until_terminal(state.hub, sid, tid)
        assert _answers(store, sid) == ["fresh"]
    store.close()


async def test_a_turn_of_the_dead_servers_own_runner_runs_again_at_once(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    sid, tid = _leftovers(store, host_id=None)  # the in-process host's runner died with its server
    async with _server(store) as (state, nursery):
        s = HandRunner(state, "runner_s", nursery)
        await s.hello()
        start = await s.recv()
        assert isinstance(start, p.TurnStart) and start.attempt == 2
        assert trio.current_time() < GRACE  # no grace waited for a runner that cannot come back
    store.close()


async def test_a_live_processes_running_turn_is_not_taken(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    sid, tid = _leftovers(store)
    async with trio.open_nursery() as nursery:
        turns = TurnService(store, EventHub(), RunnerRegistry(), nursery, adopt_grace=GRACE)
        assert turns.take_over(lambda pid: True) == []  # another `omnigent run` still runs it
        assert store.get_turn(tid)["owner_pid"] == 999_999
        nursery.cancel_scope.cancel()
    store.close()


async def test_a_daemon_runner_whose_link_drops_mid_turn_is_waited_for_and_adopted(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    async with _server(store) as (state, nursery):
        agent = store.upsert_agent("helper", {"name": "helper", "model": "m"})
        sid = store.create_conversation(agent_id=agent["id"])["id"]
        r = HandRunner(state, "runner_r", nursery)
        await r.hello()
        item = store.append_item(sid, {"type": "message", "role": "user", "content": "hi"})
        tid = store.create_turn(sid, item["id"])["id"]
        state.turns.submit(sid)
        start = await r.recv()
        assert isinstance(start, p.TurnStart) and start.attempt == 1
        r._out.close()  # the network drops; the runner process lives and redials
        await trio.sleep(1.5)
        back = HandRunner(state, "runner_r", nursery)
        await back.hello([{"turn_id": tid, "attempt": 1, "generation": start.generation}])
        back.answer(tid, "kept")
        await collect_until_terminal(state.hub, sid, tid)
        assert (store.get_turn(tid)["status"], store.get_turn(tid)["attempt"]) == ("completed", 1)
        assert _answers(store, sid) == ["kept"]
        assert not [f for f in back.got if isinstance(f, (p.TurnStart, p.Cancel))]
    store.close()


async def test_a_local_runner_whose_link_drops_is_not_waited_for(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    async with _server(store) as (state, nursery):
        agent = store.upsert_agent("helper", {"name": "helper", "model": "m"})
        sid = store.create_conversation(agent_id=agent["id"])["id"]
        r = HandRunner(state, "runner_r", nursery, host_id=None)  # its process ends with its link
        s = HandRunner(state, "runner_s", nursery, host_id=None)
        await r.hello()
        await s.hello()
        item = store.append_item(sid, {"type": "message", "role": "user", "content": "hi"})
        store.create_turn(sid, item["id"])
        state.turns.submit(sid)
        with trio.move_on_after(1):
            while store.get_conversation(sid)["runner_id"] is None:
                await trio.sleep(0.01)
        first = s if store.get_conversation(sid)["runner_id"] == "runner_s" else r
        other = r if first is s else s
        assert isinstance(await first.recv(), p.TurnStart)
        dropped = trio.current_time()
        first._out.close()
        start = await other.recv()
        assert isinstance(start, p.TurnStart) and start.attempt == 2
        assert trio.current_time() - dropped < 1.0  # dispatched again at once, as before
    store.close()


async def test_a_reconnect_that_replaces_a_silent_connection_adopts_its_turn(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    async with _server(store) as (state, nursery):
        agent = store.upsert_agent("helper", {"name": "helper", "model": "m"})
        sid = store.create_conversation(agent_id=agent["id"])["id"]
        r = HandRunner(state, "runner_r", nursery)
        await r.hello()
        item = store.append_item(sid, {"type": "message", "role": "user", "content": "hi"})
        tid = store.create_turn(sid, item["id"])["id"]
        state.turns.submit(sid)
        start = await r.recv()
        # r's old connection stays open but silent (a half-open socket); the runner dials again
        back = HandRunner(state, "runner_r", nursery)
        await back.hello([{"turn_id": tid, "attempt": 1, "generation": start.generation}])
        back.answer(tid, "kept")
        await collect_until_terminal(state.hub, sid, tid)
        assert (store.get_turn(tid)["status"], store.get_turn(tid)["attempt"]) == ("completed", 1)
        assert _answers(store, sid) == ["kept"]
        assert not [f for f in back.got if isinstance(f, (p.TurnStart, p.Cancel))]
    store.close()
