"""The invariants every simulated seed must keep, each returning violations as sentences.

Written against what a user may rely on, not against today's exact bounds
(attempt counts, loss limits, placement), so they keep holding as those change:

- every message ends exactly once: one terminal event per turn, nothing for
  that turn after it, and the store agrees. Answered: one assistant item, the
  one the turn's final runner sent. Failed: a code and a message, no answer
  stored, and a model error only if the runner reported one;
- a session runs one turn at a time;
- no turn is left running: every turn terminal, nothing active or queued in
  the TurnService, and nothing in the store changes once the system is quiet;
- no runner is left behind: no more live processes than pool slots, each one
  the supervisor's, none after a give-up, and all of them reaped at shutdown;
  a runner declared hung really had stopped answering;
- the agent loop's steps (`check_steps`): every `function_call` gets exactly
  one output item, no side-effecting call runs twice, no step or approval is
  left open, and every history a runner was sent is well formed (each call
  followed by its one output); a completed turn stores each model step's
  answer once and ends on its final runner's answer;
- the restart policy's timeline: after every exit the supervisor either
  restarts after a delay within the policy's bounds (backoff with its reset,
  cap and jitter) and starts exactly then, or, exactly when the exits within
  the period exceed the intensity, gives up, and then starts nothing more.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import protocol as p
from protocol import events as ev
from supervisor import Event, RestartPolicy
from tests.support.fake_runners import Harness

TERMINAL_TURNS = {"completed", "failed", "cancelled"}
EPS = 1e-6
SERVER_CODES = {"runner_lost", "runner_unavailable", "max_steps"}
SIDE_EFFECTING = {"shell", "write_file", "edit_file"}  # failures the server decides; others come from a runner


def check_settled(h: Harness, plan, turns: dict[str, str]) -> list[str]:
    """Once every posted message ended: the per-turn, per-session and per-process invariants."""
    out: list[str] = []
    for session_id in {s: None for s in turns.values()}:
        out += _session_events(h, session_id, [t for t, s in turns.items() if s == session_id])
    for turn_id, session_id in turns.items():
        out += _turn_outcome(h, session_id, turn_id)
    for session_id in h.watches:
        if h.turns.active_runner(session_id) is not None or h.turns.status(session_id) != "idle":
            out.append(f"session {session_id}: the turn service still has a turn active or queued")
    out += _processes(h, plan)
    return out


def _session_events(h: Harness, session_id: str, turn_ids: list[str]) -> list[str]:
    out: list[str] = []
    ended: dict[str, str] = {}
    running: str | None = None  # the turn whose attempt is under way
    for seen in h.watches[session_id].seen:
        event = seen.event
        turn_id = event.get("turn_id")
        if turn_id is not None and turn_id in ended and event["type"] != ev.SESSION_STATUS:
            out.append(f"turn {turn_id}: {event['type']} at {seen.time:g} after its {ended[turn_id]}")
        if event["type"] == ev.RESPONSE_CREATED:
            if running is not None and running != turn_id:
                out.append(f"session {session_id}: turn {turn_id} started at {seen.time:g} "
                           f"while turn {running} was still running")
            running = turn_id
        elif event["type"] in p.TERMINAL_EVENTS:
            if turn_id in ended:
                out.append(f"turn {turn_id}: a second terminal event {event['type']} at {seen.time:g}")
            ended[turn_id] = event["type"]
            if running == turn_id:
                running = None
            if event["type"] == ev.FAILED:
                error = event["error"]
                if not error.get("code") or not error.get("message"):
                    out.append(f"turn {turn_id}: failed without a reason: {error!r}")
                if error.get("code") == "internal_error":
                    out.append(f"turn {turn_id}: crashed the dispatcher: {error['message']}")
                elif error.get("code") not in SERVER_CODES and (error.get("code"), error.get("message")) not in {
                        (f.code, f.message) for proc in h.processes for _, f in proc.sent
                        if isinstance(f, p.TurnFailed) and f.turn_id == turn_id}:
                    out.append(f"turn {turn_id}: failed with {error!r}, which no runner reported")
    for turn_id in turn_ids:
        if turn_id not in ended:
            out.append(f"turn {turn_id}: no terminal event (lost silently)")
    return out


def _turn_outcome(h: Harness, session_id: str, turn_id: str) -> list[str]:
    row = h.store.get_turn(turn_id)
    if row["status"] not in TERMINAL_TURNS:
        return [f"turn {turn_id}: left {row['status']} (attempt {row['attempt']})"]
    stored = h.store.conn.execute(
        """SELECT response_id, type FROM conversation_items WHERE conversation_id = ? AND turn_id = ?
           AND type != 'function_call_output' ORDER BY position""", [session_id, turn_id]).fetchall()
    answered = {r[0] for r in stored}  # one response id per stored model step
    model_steps = sum(s["kind"] == "model" and s["status"] == "completed" for s in h.store.steps(turn_id))
    answers = [f for f in _completions(h, turn_id, row["runner_id"])
               if not any(i.get("type") == "function_call" for i in f.output)]
    if row["status"] == "completed":
        if len(answered) != model_steps or not stored:
            return [f"turn {turn_id}: completed with {len(answered)} stored answers for {model_steps} "
                    "completed model steps (answered twice or never)"]
        if not answers:
            return [f"turn {turn_id}: completed, but its final runner {row['runner_id']} never answered it"]
        if stored[-1][0] not in {a.response_id for a in answers}:
            return [f"turn {turn_id}: stored final answer {stored[-1][0]} is not one of its final runner's "
                    f"{[a.response_id for a in answers]}"]
    elif row["status"] == "failed":
        if len(answered) > model_steps:
            return [f"turn {turn_id}: failed, yet {len(stored)} output item(s) stored beyond its steps"]
        if not row["error"]:
            return [f"turn {turn_id}: failed without an error in the store"]
    return []


def check_steps(h: Harness, turns: dict[str, str]) -> list[str]:
    """The agent loop's invariants over every turn (see the module docstring)."""
    out: list[str] = []
    starts: dict[tuple[str, str], int] = {}
    for proc in h.processes:
        for _, start in proc.tools_received:
            if start.approval != "preview" and start.name in SIDE_EFFECTING:
                key = (start.turn_id, start.call_id)
                starts[key] = starts.get(key, 0) + 1
    for (turn_id, call_id), count in starts.items():
        if count > 1:
            out.append(f"turn {turn_id}: side-effecting call {call_id} started {count} times")
    for turn_id, session_id in turns.items():
        for step in h.store.steps(turn_id):
            if step["status"] in ("running", "waiting"):
                out.append(f"turn {turn_id}: step {step['step']} ({step['kind']}) left {step['status']}")
        items = h.turns.loop.turn_items(session_id, turn_id)
        calls = [i["call_id"] for i in items if i["type"] == "function_call"]
        outputs = [i["call_id"] for i in items if i["type"] == "function_call_output"]
        for call_id in calls:
            if outputs.count(call_id) != 1:
                out.append(f"turn {turn_id}: call {call_id} has {outputs.count(call_id)} output items")
        for call_id in set(outputs) - set(calls):
            out.append(f"turn {turn_id}: an output for {call_id}, which no stored call made")
        for proc in h.processes:
            for _, start in proc.turns_received:
                if start.turn_id == turn_id:
                    out += [f"turn {turn_id}: step {start.step} sent to #{proc.index}: {why}"
                            for why in _history_faults(start.input)]
    for session_id in {s: None for s in turns.values()}:
        pending = h.store.list_approvals(session_id, "pending")
        if pending:
            out.append(f"session {session_id}: {len(pending)} approval(s) left pending")
    return out


def _history_faults(items: list[dict[str, Any]]) -> list[str]:
    """A history is well formed when every call is followed by exactly one output of its id."""
    out: list[str] = []
    open_calls: list[str] = []
    seen_outputs: set[str] = set()
    for item in items:
        if item.get("type") == "function_call":
            open_calls.append(item.get("call_id"))
        elif item.get("type") == "function_call_output":
            call_id = item.get("call_id")
            if call_id in seen_outputs:
                out.append(f"a second output for {call_id}")
            elif call_id not in open_calls:
                out.append(f"an output for {call_id} before (or without) its call")
            else:
                open_calls.remove(call_id)
            seen_outputs.add(call_id)
        elif open_calls and item.get("role") == "user":
            out.append(f"calls {open_calls} without outputs before the next user message")
    if open_calls:
        out.append(f"calls {open_calls} without outputs at the end")
    return out


def _completions(h: Harness, turn_id: str, runner_id: str | None) -> list[p.TurnCompleted]:
    procs = [proc for proc in h.processes if proc.runner_id == runner_id]
    return [f for proc in procs for _, f in proc.sent if isinstance(f, p.TurnCompleted) and f.turn_id == turn_id]


def _processes(h: Harness, plan) -> list[str]:
    out: list[str] = []
    alive = [proc for proc in h.processes if proc.alive]
    children = h.host.supervisor.children()
    held = {info.pid for info in children.values() if info.pid is not None}
    starting = sum(info.state == "starting" for info in children.values())
    if len(alive) > plan.runners:
        out.append(f"{len(alive)} runner processes alive for {plan.runners} slot(s)")
    strays = [proc for proc in alive if proc.pid not in held]
    if len(strays) > starting:
        out.append(f"runner processes alive that the supervisor does not hold: {[p.index for p in strays]}")
    for runner_id in h.registry.online:
        if not any(proc.runner_id == runner_id and proc.alive for proc in h.processes):
            out.append(f"runner {runner_id} registered online, but its process is gone")
    for runner_id, gone in h.registry.departed.items():
        if gone.cause.startswith("hung"):
            proc = h.launcher.by_id(runner_id)
            if proc.hung_at is None or proc.hung_at > gone.at:
                out.append(f"runner #{proc.index} declared hung at {gone.at:g} but it was answering")
    return out


def snapshot(h: Harness, sessions: list[str]) -> Any:
    turns = [(t["id"], t["status"], t["attempt"], t["error"]) for s in sessions for t in h.store.list_turns(s)]
    items = [(i["id"], i.get("role"), i.get("response_id")) for s in sessions for i in h.store.list_items(s)]
    return turns, items


def check_quiet(h: Harness, before: Any, after: Any) -> list[str]:
    if before != after:
        return [f"the store changed after every message had ended: {before!r} -> {after!r}"]
    return []


def check_after_shutdown(h: Harness, plan, sup_cut: int) -> list[str]:
    out: list[str] = []
    for proc in h.processes:
        if proc.alive:
            out.append(f"runner process #{proc.index} still alive after shutdown")
        elif not proc.reaped:
            out.append(f"runner process #{proc.index} exited but was never reaped")
    events = h.supervisor_events[:sup_cut]
    out += check_restart_timeline(events, plan.policy)
    gave_up = any(e.kind == "gave_up" for e in events)
    if gave_up != (h.registry.gave_up is not None):
        out.append(f"supervisor gave up: {gave_up}, server knows: {h.registry.gave_up is not None}")
    return out


def check_restart_timeline(events: list[Event], policy: RestartPolicy) -> list[str]:
    """Replays the policy's documented rules over the supervisor's events."""
    out: list[str] = []
    kids: dict[str, _Kid] = {}
    gave_up = False
    for e in events:
        kid = kids.setdefault(e.child, _Kid(policy))
        where = f"{e.child} at {e.time:g}"
        if e.kind == "starting":
            if gave_up:
                out.append(f"{where}: started after the supervisor gave up")
            if kid.pending is not None:
                out.append(f"{where}: started before the decision on its exit")
            if kid.restart_at is not None and abs(e.time - kid.restart_at) > EPS:
                out.append(f"{where}: started, but the restart was due at {kid.restart_at:g}")
            elif kid.restart_at is None and kid.starts:
                out.append(f"{where}: started again without a restart decision")
            kid.starts += 1
            kid.restart_at = kid.running_at = None
        elif e.kind == "running":
            kid.running_at = e.time
        elif e.kind == "exited" and not kid.stopping:
            kid.pending = kid.decide(e.time)
        elif e.kind == "restarting":
            pending, kid.pending = kid.pending, None
            if pending is None or pending[0] != "restart":
                out.append(f"{where}: restarted although {_why(pending)}")
                continue
            _, low, high = pending
            if not low - EPS <= e.delay <= high + EPS:
                out.append(f"{where}: restart delay {e.delay:.4f} outside [{low:.4f}, {high:.4f}]")
            kid.restart_at = e.time + e.delay
        elif e.kind == "gave_up":
            pending, kid.pending = kid.pending, None
            if pending is None or pending[0] != "give up":
                out.append(f"{where}: gave up although {_why(pending)}")
            gave_up = True
        elif e.kind == "stopping":
            kid.stopping = True
    for name, kid in kids.items():
        if kid.pending is not None:
            out.append(f"{name}: exited with no decision after it ({kid.pending[0]} was due)")
    return out


def _why(pending: tuple | None) -> str:
    if pending is None:
        return "no exit called for a decision"
    return "the intensity was exceeded" if pending[0] == "give up" else "the intensity was not exceeded"


class _Kid:
    """One child's restart history as the policy defines it."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.exponent = 0
        self.exits: deque[float] = deque()
        self.starts = 0
        self.running_at: float | None = None
        self.restart_at: float | None = None
        self.pending: tuple | None = None
        self.stopping = False

    def decide(self, now: float) -> tuple:
        pol = self.policy
        healthy_since = self.running_at if self.running_at is not None else now
        if now - healthy_since >= pol.reset_after:
            self.exponent = 0
        self.exits.append(now)
        while self.exits[0] <= now - pol.period:
            self.exits.popleft()
        if not pol.forever and len(self.exits) > pol.intensity:
            return ("give up",)
        nominal = min(pol.cap, pol.base * pol.factor ** self.exponent)
        if pol.base > 0 and pol.factor > 1 and pol.cap > pol.base:
            self.exponent = min(self.exponent + 1, math.ceil(math.log(pol.cap / pol.base, pol.factor)))
        return ("restart", nominal * (1 - pol.jitter), nominal * (1 + pol.jitter))
