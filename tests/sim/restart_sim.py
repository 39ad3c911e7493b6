"""Seeded simulation of server restarts, link drops and moved sessions (issue 8 §2, "Fuzzing and simulation").

Runners here outlive the server (`tests/support/reconnecting_runner.py`):
each seed draws sessions and their messages, and a fault schedule of link
drops (a runner's connection fails for a while, its process lives), server
restarts (the server's pieces are torn down mid-whatever and new ones start
on the same store, taking over the dead one's turns, with the adoption
grace) and sessions moved by hand to another runner (a late result of the
old runner must be refused by generation). Everything runs on a MockClock
with every source of chance tied to the seed (`driver._seeded`).

The invariants, per seed:
- every message's turn ends once: terminal in the store, at most one
  terminal event over every server incarnation, nothing for it after that;
- no answer stored twice, and the stored answer is the final attempt's
  (a late result of an older attempt or a moved session never is);
- no model call (or tool run) twice for one step of one attempt (the attempt
  numbers of one turn are never reused, so a restart never makes a runner run
  the same attempt's step again); every turn's first model step reads a file
  (a tool step), so adoption of tool steps by their step number is exercised;
- every call stored once, with exactly one output;
- no turn ends cancelled: nobody asks for a cancel here, so one would be a
  refused turn's cancel reaching another attempt of it.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import trio
import trio.testing

import protocol as p
from omnigent.link.runner_secrets import hash_secret
from omnigent.server.claims import Claims
from omnigent.server.hub import EventHub
from omnigent.server.registry import RunnerRegistry
from omnigent.server.runner_link import serve_runner
from omnigent.server.state import ServerState
from omnigent.server.turns import TurnService
from omnigent.store import Store
from omnigent.store.owners import ClaimOwner
from protocol import events as ev
from tests.support.fake_runners import MemoryTransport
from tests.support.reconnecting_runner import ReconnectingRunner, memory_pipe

from .driver import EPOCH, _seeded

HORIZON = 3600.0
NO_PID = 4_194_304  # above Linux's largest pid_max: a server incarnation's claim owner that is never alive


@dataclass(frozen=True)
class Plan:
    seed: int
    runners: int
    grace: float
    model_time: float
    sessions: tuple[tuple[float, ...], ...]       # per session: the gap before each message
    drops: tuple[tuple[float, int, float], ...]   # (at, runner index, down for)
    restarts: tuple[tuple[float, float], ...]     # (at, down for)
    moves: tuple[tuple[float, int, int], ...]     # (at, session index, runner index)

    def describe(self) -> str:
        return (f"seed {self.seed}: {self.runners} runner(s), grace {self.grace}, model ~{self.model_time} s, "
                f"{len(self.sessions)} session(s) {[len(s) for s in self.sessions]} message(s), "
                f"drops {list(self.drops)}, restarts {list(self.restarts)}, moves {list(self.moves)}")


def draw_plan(seed: int) -> Plan:
    rng = random.Random(f"{seed}/restart-plan")
    runners = rng.randint(1, 3)
    sessions = tuple(tuple(round(rng.uniform(0, 4), 3) for _ in range(rng.randint(1, 4)))
                     for _ in range(rng.randint(1, 3)))
    drops = tuple(sorted((round(rng.uniform(0, 30), 3), rng.randrange(runners), round(rng.uniform(0.05, 15), 3))
                         for _ in range(rng.choice([0, 1, 2, 4]))))
    restarts = tuple(sorted((round(rng.uniform(0, 30), 3), round(rng.uniform(0.05, 8), 3))
                            for _ in range(rng.choice([0, 1, 1, 2]))))
    moves = tuple(sorted((round(rng.uniform(0, 30), 3), rng.randrange(len(sessions)), rng.randrange(runners))
                         for _ in range(rng.choice([0, 0, 1, 2]))))
    return Plan(seed, runners, rng.choice([2.0, 5.0, 10.0]), rng.choice([0.5, 2.0, 6.0]), sessions,
                drops, restarts, moves)


@dataclass
class Outcome:
    plan: Plan
    violations: list[str] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    trace: list[tuple] = field(default_factory=list)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(repr(self.trace).encode()).hexdigest()[:16]

    def report(self) -> str:
        return "\n".join([self.plan.describe(), *(f"  - {v}" for v in self.violations),
                          f"rerun: SIM_SEED={self.plan.seed} .venv/bin/python -m pytest -q tests/sim -k restart"])


class World:
    """The store, the server incarnation that is up (if any), and the runners' way to it."""

    def __init__(self, plan: Plan, store: Store, nursery: trio.Nursery) -> None:
        self.plan, self.store, self.nursery = plan, store, nursery
        self.state: ServerState | None = None
        self.up = trio.Event()
        self.incarnations = 0
        self.events: list[tuple[float, int, str, dict[str, Any]]] = []  # (time, incarnation, session, event)
        self._scope: trio.CancelScope | None = None
        self._claims_at_kill: list[tuple] | None = None
        self._server_nursery: trio.Nursery | None = None
        self.sessions: list[str] = []

    async def start_server(self) -> None:
        if self._claims_at_kill is not None:
            # a SIGKILLed process runs no `finally`: what its cancelled tasks released, it still holds
            with self.store._write():
                self.store.conn.execute("DELETE FROM conversation_claims")
                for row in self._claims_at_kill:
                    self.store.conn.execute(f"INSERT INTO conversation_claims VALUES ({', '.join('?' * len(row))})",
                                            row)
            self._claims_at_kill = None
        await self.nursery.start(self._incarnation, self.incarnations)
        self.incarnations += 1

    def kill_server(self) -> None:
        assert self._scope is not None
        self._claims_at_kill = self.store.conn.execute("SELECT * FROM conversation_claims").fetchall()
        self._scope.cancel()  # like SIGKILL: nothing is released, claims' leases run out
        self.state, self.up = None, trio.Event()

    async def _incarnation(self, k: int, task_status: trio.TaskStatus[None]) -> None:
        with trio.CancelScope() as scope:
            self._scope = scope
            async with trio.open_nursery() as n:
                hub, registry = _RecordingHub(self.events, k), RunnerRegistry()
                owner = ClaimOwner(NO_PID + k, "sim", secrets.token_hex(4))
                turns = TurnService(self.store, hub, registry, n, runner_wait=30.0, max_losses=5,
                                    adopt_grace=self.plan.grace, claims=Claims(self.store, owner))
                state = ServerState(self.store, hub, registry, turns, "t", ping_interval=1.0, ping_allowance=6.0)
                if k:
                    turns.take_over(lambda pid: False)  # the previous incarnation is dead
                self._server_nursery = n
                self.state = state
                self.up.set()
                task_status.started()
                await trio.sleep_forever()

    def dial(self, runner: ReconnectingRunner):
        if self.state is None or self._server_nursery is None:
            return None
        mine, theirs = memory_pipe()
        transport = MemoryTransport(*theirs)
        self._server_nursery.start_soon(_serve, self.state, runner.runner_id, transport)
        return mine


class _RecordingHub(EventHub):
    """Records every event as it is published: a kill right after cannot lose it from the record."""

    def __init__(self, into: list, incarnation: int) -> None:
        super().__init__()
        self._into, self._k = into, incarnation

    def _deliver(self, session_id: str, batch: list[dict[str, Any]], texts: list[str] | None = None) -> None:
        # every event passes here once visible, published alone or in a transaction
        super()._deliver(session_id, batch, texts)
        now = trio.current_time()
        self._into.extend((now, self._k, session_id, event) for event in batch)


async def _serve(state: ServerState, runner_id: str, transport: MemoryTransport) -> None:
    try:
        await serve_runner(state, runner_id, transport, f"secret-{runner_id}")
    except* ConnectionError:
        pass
    finally:
        transport.abort()


def run_seed(seed: int) -> Outcome:
    plan = draw_plan(seed)
    outcome = Outcome(plan)
    with _seeded(seed):
        trio.run(_simulate, plan, outcome, clock=trio.testing.MockClock(autojump_threshold=0))
    return outcome


async def _simulate(plan: Plan, outcome: Outcome) -> None:
    store = Store(":memory:", clock=lambda: EPOCH + trio.current_time())
    turns: dict[str, str] = {}  # turn id -> session id
    runners: list[ReconnectingRunner] = []
    try:
        async with trio.open_nursery() as nursery:
            world = World(plan, store, nursery)
            agent = store.upsert_agent("sim", {"name": "sim", "model": "m"})
            for n in range(plan.runners):
                rid = f"runner_{n:032x}"
                # runners of a host daemon: they outlive the server (the local host's would die with it)
                store.add_runner_credential(rid, hash_secret(f"secret-{rid}"), kind="host", host_id="host_sim")
                runners.append(ReconnectingRunner(n, rid, world, random.Random(f"{seed_of(plan)}/runner/{n}"),
                                                  plan.model_time))
            for i in range(len(plan.sessions)):
                sid = store.create_conversation(agent_id=agent["id"])["id"]
                store.set_runner(sid, runners[i % plan.runners].runner_id)
                world.sessions.append(sid)
            await world.start_server()
            for runner in runners:
                nursery.start_soon(runner.run)
            with trio.move_on_after(HORIZON) as horizon:
                async with trio.open_nursery() as clients:
                    for sid, gaps in zip(world.sessions, plan.sessions):
                        clients.start_soon(_client, world, sid, gaps, turns)
                    clients.start_soon(_faults, world, runners)
            if horizon.cancelled_caught:
                outcome.violations.append(f"not every message ended within {HORIZON:g} virtual s")
            await trio.sleep(plan.grace + 10)  # late frames, refusals, a last ping round
            await trio.testing.wait_all_tasks_blocked()
            outcome.violations += _check(store, world, runners, turns)
            outcome.trace = [(round(t, 6), k, s[-6:], e["type"], e.get("turn_id"), e.get("attempt"))
                             for t, k, s, e in world.events]
            outcome.trace += [(r.index, h) for r in runners for h in r.hellos]
            c = outcome.counts
            c["seeds"] += 1
            c["messages"] += len(turns)
            c["restarts"] += world.incarnations - 1
            c["drops"] += len(plan.drops)
            c["moves"] += len(plan.moves)
            for tid in turns:
                row = store.get_turn(tid)
                c[f"turns {row['status']}"] += 1
                c["turns retried"] += row["attempt"] > 1
            c["in-flight reports"] += sum(bool(h) for r in runners for _, h in r.hellos)
            nursery.cancel_scope.cancel()
    finally:
        store.close()


def seed_of(plan: Plan) -> int:
    return plan.seed


async def _client(world: World, sid: str, gaps: tuple[float, ...], turns: dict[str, str]) -> None:
    for n, gap in enumerate(gaps):
        await trio.sleep(gap)
        await world.up.wait()
        state = world.state
        assert state is not None
        _, turn = state.store.queue_message(sid, {"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": f"m{n}"}]})
        turns[turn["id"]] = sid
        state.turns.submit(sid)
        while state.store.get_turn(turn["id"])["status"] not in ("completed", "failed", "cancelled"):
            await trio.sleep(0.25)  # the store is the truth across incarnations


async def _faults(world: World, runners: list[ReconnectingRunner]) -> None:
    plan = world.plan
    schedule = ([(at, "drop", (i, d)) for at, i, d in plan.drops] + [(at, "restart", (d,)) for at, d in plan.restarts]
                + [(at, "move", (s, r)) for at, s, r in plan.moves])
    for at, kind, args in sorted(schedule, key=lambda e: (e[0], e[1])):
        await trio.sleep_until(at)
        if kind == "drop":
            runners[args[0]].drop_link(args[1])
        elif kind == "restart" and world.state is not None:
            world.kill_server()
            await trio.sleep(args[0])
            await world.start_server()
        elif kind == "move" and world.state is not None:
            sid, rid = world.sessions[args[0]], runners[args[1]].runner_id
            world.store.set_runner(sid, rid)  # what PATCH /v1/sessions/{id} {"runner_id"} does
            world.state.turns.session_moved(sid)


def _check(store: Store, world: World, runners: list[ReconnectingRunner], turns: dict[str, str]) -> list[str]:
    out: list[str] = []
    calls: Counter = Counter()
    for runner in runners:
        calls.update(runner.calls)
    for key, count in calls.items():
        if count > 1:
            out.append(f"turn {key[0]} attempt {key[1]} step {key[2]}: the {key[3]} ran {count} times")
    ended: dict[str, float] = {}
    for t, k, sid, event in world.events:
        tid = event.get("turn_id")
        if tid is None or event["type"] == ev.SESSION_STATUS:
            continue
        if tid in ended:
            out.append(f"turn {tid}: {event['type']} at {t:g} (incarnation {k}) after its end at {ended[tid]:g}")
        elif event["type"] in p.TERMINAL_EVENTS:
            ended[tid] = t
    for tid, sid in turns.items():
        row = store.get_turn(tid)
        if row["status"] not in ("completed", "failed", "cancelled"):
            out.append(f"turn {tid}: left {row['status']} (attempt {row['attempt']})")
            continue
        stored = store.conn.execute("SELECT response_id FROM conversation_items WHERE conversation_id = ?"
                                    " AND turn_id = ? AND type = 'message' ORDER BY position", [sid, tid]).fetchall()
        kinds = [r[0] for r in store.conn.execute(
            "SELECT type FROM conversation_items WHERE conversation_id = ? AND turn_id = ? ORDER BY position",
            [sid, tid])]
        if kinds.count("function_call") > 1 or kinds.count("function_call_output") != kinds.count("function_call"):
            out.append(f"turn {tid}: its items are {kinds} (a step stored twice, or a call without its output)")
        if row["status"] == "completed":
            if len(stored) != 1:
                out.append(f"turn {tid}: completed with {len(stored)} stored answers")
            elif not stored[0][0].startswith(f"resp_{tid[-6:]}_{row['attempt']}_"):
                out.append(f"turn {tid}: stored answer {stored[0][0]} is not attempt {row['attempt']}'s")
            if tid not in ended:
                out.append(f"turn {tid}: completed without a terminal event")
        elif row["status"] == "cancelled":  # nobody asks for a cancel here: a misrouted refusal
            out.append(f"turn {tid}: cancelled, though no client asked")
        elif stored and row["status"] == "failed":
            out.append(f"turn {tid}: failed, yet {len(stored)} answer(s) stored")
    return out
