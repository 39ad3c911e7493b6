"""Runs one seed's `Plan` on the real server pieces, host and supervisor, and judges it.

`run_seed(seed)` is synchronous: it makes a fresh `trio.run` on a
`MockClock(autojump_threshold=0)` with every source of chance tied to the
seed (the plan, each launch's script, the supervisor's jitter, the store's
ids and clock, trio's own scheduling coin), drives the clients and the
external kills, lets the system go quiet, shuts it down, and returns the
`Outcome`: the violations of the invariants (empty when the seed passed),
counts for the summary, and a fingerprint of what happened so a rerun can
be compared. `tests/sim/checks.py` says what the invariants are.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import random
import tempfile
import uuid
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing

import protocol as p
from protocol import events as ev
from tests.support.fake_runners import Harness, open_harness

from .checks import check_after_shutdown, check_quiet, check_settled, check_steps, snapshot
from .plan import Kill, Plan, Post, SessionSetup, decision, draw_plan, launch_script, session_setup

TOOLS = ["shell", "read_file", "write_file", "edit_file", "list_dir", "grep"]

HORIZON = 3600.0  # virtual seconds for every message of a seed to end; far beyond any bound
EPOCH = 1_700_000_000.0  # the store's wall clock is this plus virtual time


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
        lines = [self.plan.describe(), *(f"  - {v}" for v in self.violations)]
        lines.append(f"rerun: SIM_SEED={self.plan.seed} .venv/bin/python -m pytest -q tests/sim -k seed")
        return "\n".join(lines)


@dataclass
class _Run:
    """What the clients and the killer did, for the checks."""

    harness: Harness
    sessions: list[str]
    turns: dict[str, str] = field(default_factory=dict)  # turn id -> session id, in posting order
    kills: list[tuple[float, int, int]] = field(default_factory=list)  # (time, process index, signal)
    setups: dict[str, SessionSetup] = field(default_factory=dict)
    answers: list[tuple[float, str, str]] = field(default_factory=list)  # (time, approval id, decision)

    def post(self, session_id: str, text: str) -> str:
        # the API's path (`queue_message`): a message posted while a turn runs joins the
        # conversation after that turn's steps, so no turn's calls are split from their outputs
        setup = self.setups.get(session_id)
        timeout = setup.approval_timeout if setup is not None and setup.mode == "ask" else None
        turn = self.harness.post(session_id, text, approval_timeout=timeout)
        self.turns[turn["id"]] = session_id
        return turn["id"]

    async def until_ended(self, turn_id: str) -> None:
        await self.harness.until_terminal(self.turns[turn_id], turn_id)


def run_seed(seed: int) -> Outcome:
    plan = draw_plan(seed)
    outcome = Outcome(plan)
    with tempfile.TemporaryDirectory(prefix=f"sim-{seed}-") as tmp, _seeded(seed):
        clock = trio.testing.MockClock(autojump_threshold=0)
        trio.run(_simulate, plan, Path(tmp), outcome, clock=clock)
    return outcome


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Every source of chance tied to the seed, for the length of one run.

    - ids (store rows, runner ids) come from uuid4: drawn from the seed;
    - trio reverses each scheduling batch on a coin from its module-level
      `_r`: seeded;
    - trio orders deadlines that fall on the same instant by `id()` of their
      cancel scopes, which differs from run to run: here by registration order;
    - trio keeps waiting tasks (an Event's, a cancel status's) in sets, which
      iterate by hash, i.e. by address: tasks and cancel statuses hash here by
      the order they were first hashed in.
    These are trio internals (test-only); without them a seed's runs diverge
    wherever two timers tie or two tasks wait on one event, which virtual time
    makes common.
    """
    run_module = trio._core._run
    numbers: dict[int, int] = {}
    first_hashed = itertools.count()

    def stable_hash(obj: Any) -> int:
        key = id(obj)
        number = numbers.get(key)
        if number is None:
            number = numbers[key] = next(first_hashed)
            weakref.finalize(obj, numbers.pop, key, None)
        return number

    hashed = (run_module.Task, run_module.CancelStatus)
    for cls in hashed:
        cls.__hash__ = stable_hash
    ids = random.Random(f"{seed}/ids")
    real_uuid4, real_add = uuid.uuid4, run_module.Deadlines.add
    order = itertools.count()

    def add(self, deadline: float, cancel_scope: Any) -> None:
        heapq.heappush(self._heap, (deadline, next(order), cancel_scope))
        self._active += 1

    coin = run_module._r
    coin_state = coin.getstate()
    coin.seed(f"{seed}/trio")
    uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)  # type: ignore[assignment]
    run_module.Deadlines.add = add
    try:
        yield
    finally:
        uuid.uuid4 = real_uuid4  # type: ignore[assignment]
        run_module.Deadlines.add = real_add
        for cls in hashed:
            del cls.__hash__
        coin.setstate(coin_state)


async def _simulate(plan: Plan, tmp: Path, outcome: Outcome) -> None:
    harness_cm = open_harness(
        tmp, lambda n: launch_script(plan, n), runners=plan.runners, policy=plan.policy,
        runner_wait=plan.runner_wait, max_attempts=plan.max_attempts, ping_interval=plan.ping_interval,
        ping_allowance=plan.ping_allowance, startup_timeout=plan.startup_timeout,
        rng=random.Random(f"{plan.seed}/jitter"), store_path=":memory:",
        store_clock=lambda: EPOCH + trio.current_time(),
    )
    async with harness_cm as h:
        setups = [session_setup(plan.seed, i) for i in range(len(plan.sessions))]
        sessions = [h.new_session(spec={"tools": TOOLS, "permissions": setup.mode}, workspace=str(tmp))
                    for setup in setups]
        run = _Run(h, sessions, setups=dict(zip(sessions, setups)))
        for index, session_id in enumerate(sessions):
            h.nursery.start_soon(_approver, run, plan.seed, index, session_id)
        with trio.move_on_after(HORIZON) as horizon:
            async with trio.open_nursery() as nursery:
                for session_id, posts in zip(run.sessions, plan.sessions):
                    nursery.start_soon(_client, run, session_id, posts)
                nursery.start_soon(_killer, run, plan.kills)
            for turn_id in list(run.turns):
                await run.until_ended(turn_id)
        if horizon.cancelled_caught:
            outcome.violations.append(f"not every message ended within {HORIZON:g} virtual s")
        await h.settle()
        outcome.violations += check_settled(h, plan, run.turns)
        outcome.violations += check_steps(h, run.turns)
        before = snapshot(h, run.sessions)
        # long enough for any hang verdict still due, a late frame of a lingering socket, a ping round
        await trio.sleep(plan.ping_interval * (plan.ping_allowance + 2) + 2)
        await h.settle()
        outcome.violations += check_quiet(h, before, snapshot(h, run.sessions))
        sup_cut = len(h.supervisor_events)
        outcome.trace = _trace(h, run)
        _count(outcome, h, run)
    outcome.violations += check_after_shutdown(h, plan, sup_cut)


async def _client(run: _Run, session_id: str, posts: tuple[Post, ...]) -> None:
    previous: str | None = None
    for n, post in enumerate(posts):
        if post.after_previous and previous is not None:
            await run.until_ended(previous)
            await trio.sleep(post.at)
        else:
            await trio.sleep_until(post.at)
        previous = run.post(session_id, f"message {n} of {session_id[-6:]}")


async def _approver(run: _Run, seed: int, index: int, session_id: str) -> None:
    """A client watching the session answers each approval after a delay (first answer wins)."""
    h, setup, n = run.harness, run.setups[session_id], 0
    async with trio.open_nursery() as nursery:
        async for event in h.hub.follow(session_id, after=0):
            if event["type"] == ev.APPROVAL_REQUESTED:
                nursery.start_soon(_answer, run, session_id, event["approval_id"], decision(seed, index, n),
                                   setup.answer_delay)
                n += 1


async def _answer(run: _Run, session_id: str, approval_id: str, choice: str, delay: float) -> None:
    await trio.sleep(delay)
    if run.harness.store.resolve_approval(approval_id, choice, "sim") is not None:
        run.answers.append((trio.current_time(), approval_id, choice))
        run.harness.turns.approval_answered(session_id, approval_id)


async def _killer(run: _Run, kills: tuple[Kill, ...]) -> None:
    h = run.harness
    for kill in kills:
        await trio.sleep_until(kill.at)
        alive = [proc for proc in h.processes if proc.alive]
        if alive:
            victim = alive[int(kill.victim * len(alive))]
            run.kills.append((trio.current_time(), victim.index, kill.sig))
            victim.kill(kill.sig)
        if kill.post_session is not None:
            await trio.sleep(kill.post_delay)
            run.post(run.sessions[kill.post_session], f"during a respawn at {trio.current_time():.3f}")


def _brief(event: dict[str, Any]) -> tuple:
    keep = ("turn_id", "status", "attempt", "runner_id", "old_runner_id", "new_runner_id", "cause", "delta",
            "step", "call_id", "action", "decision")
    extra = tuple(event.get(k) for k in keep)
    if event["type"] == ev.FAILED:
        extra += (event["error"]["code"], event["error"]["message"])
    return (event["type"], *extra)


def _trace(h: Harness, run: _Run) -> list[tuple]:
    trace: list[tuple] = []
    for session_id in run.sessions:
        trace += [(s.time, session_id, *_brief(s.event)) for s in h.watches[session_id].seen]
    trace += [(e.time, e.child, e.kind, e.delay, e.reason) for e in h.supervisor_events]
    trace += [(proc.index, proc.runner_id, proc.launched_at, proc.exited_at, proc.returncode)
              for proc in h.processes]
    trace += run.kills
    trace += run.answers
    return trace


def _count(outcome: Outcome, h: Harness, run: _Run) -> None:
    c = outcome.counts
    c["seeds"] += 1
    c["messages"] += len(run.turns)
    c["launches"] += len(h.processes)
    c["external kills"] += len(run.kills)
    c["gave up"] += any(e.kind == "gave_up" for e in h.supervisor_events)
    for turn_id in run.turns:
        row = h.store.get_turn(turn_id)
        c[f"turns {row['status']}" + (f" ({_failure_code(h, run, turn_id)})" if row["status"] == "failed" else "")] += 1
        if row["attempt"] > 1:
            c["turns retried"] += 1
    for proc in h.processes:
        for _, frame in proc.sent:
            if isinstance(frame, p.TurnFailed) and frame.code == "model_error":
                c["model errors sent"] += 1
        c["tool starts"] += sum(start.approval != "preview" for _, start in proc.tools_received)
    for turn_id in run.turns:
        for step in h.store.steps(turn_id):
            if step["kind"] == "tool":
                c[f"tool steps {step['status']}"] += 1
    c["approvals answered"] += len(run.answers)


def _failure_code(h: Harness, run: _Run, turn_id: str) -> str:
    for s in h.watches[run.turns[turn_id]].seen:
        if s.type == ev.FAILED and s.event["turn_id"] == turn_id:
            return s.event["error"]["code"]
    return "no event"
