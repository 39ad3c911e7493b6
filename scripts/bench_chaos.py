"""Chaos figures: runner SIGKILLs under steady traffic, seen as a client sees them.

Starts the mock LLM (`omnigent mock-llm`) and a real `omnigent server --runners N`
on loopback, each in its own process group with a private data dir, then:

- every session (a client each) keeps one websocket event stream open and posts
  messages one after another over HTTP, with a random think time between them,
  until the turn target is reached and the killer is done;
- a killer SIGKILLs one runner process every `--kill-every` s (pids from
  `GET /v1/runners`), by default preferring a runner that has a turn in flight
  (`--target any`: whichever runner the dice pick). Kills are
  paced per pool slot so no slot ever exits more than `--slot-budget` times in
  30 s: the default restart intensity (host/pool.py DEFAULT_POLICY: more than 5
  restarts within 30 s gives up) is never exceeded, so nothing is changed;
- at the end it stops the server (SIGTERM), counts what is left of its process
  group and of every process carrying this run's tag, and reads the store.

Reports: turns lost (no terminal event, or a turn left open in the store),
failed for runner loss, answered twice (completed events per turn, and
assistant items per turn in the store), 5xx answers seen, processes left after
exit, and kill -> rebound and kill -> answer medians and p95. A figure, not a
test: it asserts nothing and exits 0 unless it could not run.

    python scripts/bench_chaos.py              # 10 sessions, >= 1000 turns, 200 kills
    python scripts/bench_chaos.py --quick      # a smoke run: 10 sessions, 60 turns, 8 kills
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omnigent.agents import bundle_bytes  # noqa: E402
from omnigent.client.client import OmnigentClient, OmnigentError  # noqa: E402
from protocol import events as ev  # noqa: E402

INTENSITY_WINDOW = 30.0  # DEFAULT_POLICY.period
TERMINAL = {ev.COMPLETED, ev.FAILED, ev.CANCELLED}


# --- processes ------------------------------------------------------------------------


def start(argv: list[str], env: dict[str, str], marker: str, log: Path) -> tuple[subprocess.Popen, str]:
    """Start a process in its own group; return it and the URL from its first `marker` line."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(log, "ab"), stdin=subprocess.DEVNULL,
                            env=env, cwd=REPO, text=True, start_new_session=True)
    line = proc.stdout.readline()
    if marker not in line:
        stop(proc)
        raise SystemExit(f"{argv[3]} did not start: {line!r} (see {log})")
    return proc, line.split(marker, 1)[1].split()[0]


def stop(proc: subprocess.Popen, grace: float = 10.0) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def tagged_pids(tag: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if tag.encode() in f.read():
                        with open(f"/proc/{entry}/stat") as s:
                            if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                                pids.append(int(entry))
            except OSError:
                continue
    return pids


# --- what the clients saw ------------------------------------------------------------------


@dataclass
class Kill:
    at: float
    runner_id: str
    pid: int
    mid_turn: list[str]                # turns in flight on that runner when it was killed
    rebound_at: float | None = None    # first session.runner.rebound away from it
    answered: dict[str, float] = field(default_factory=dict)  # mid-turn turn -> when it completed


@dataclass
class Figures:
    posted: dict[str, str] = field(default_factory=dict)       # turn id -> session id
    ends: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # turn -> terminal kinds
    errors: Counter = field(default_factory=Counter)           # failure code -> count
    in_flight: dict[str, tuple[str, str]] = field(default_factory=dict)  # session -> (turn, runner)
    kills: list[Kill] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)         # HTTP status class -> count
    five_xx: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)        # turns whose wait timed out
    lost_cause: Counter = field(default_factory=Counter)


class Session:
    """One client: an event stream read into a log as it arrives, and a turn at a time."""

    def __init__(self, client: OmnigentClient, session_id: str, figures: Figures) -> None:
        self.client = client
        self.id = session_id
        self.figures = figures
        self.ended: dict[str, trio.Event] = {}
        self.last_seq = 0

    async def follow(self) -> None:
        while True:  # reconnect from the last sequence number if the stream drops
            try:
                async with self.client.events(self.id, after=self.last_seq) as stream:
                    async for event in stream:
                        self._seen(event, trio.current_time())
            except OmnigentError:
                pass
            await trio.sleep(0.2)

    def _seen(self, event: dict[str, Any], now: float) -> None:
        seq = event.get("sequence_number")
        if event["type"] == ev.HEARTBEAT or not isinstance(seq, int) or seq <= self.last_seq:
            return
        self.last_seq = seq
        f, kind, turn_id = self.figures, event["type"], event.get("turn_id")
        if kind == ev.RESPONSE_CREATED:
            f.in_flight[self.id] = (turn_id, event["runner_id"])
        elif kind == ev.RUNNER_REBOUND:
            for kill in f.kills:
                if kill.runner_id == event["old_runner_id"] and kill.rebound_at is None:
                    kill.rebound_at = now
        elif kind in TERMINAL and turn_id:
            f.ends[turn_id].append(kind)
            if f.in_flight.get(self.id, ("",))[0] == turn_id:
                del f.in_flight[self.id]
            if kind == ev.FAILED:
                f.errors[event["error"]["code"]] += 1
            if kind == ev.COMPLETED:
                for kill in f.kills:
                    if turn_id in kill.mid_turn and turn_id not in kill.answered:
                        kill.answered[turn_id] = now
            if turn_id in self.ended:
                self.ended[turn_id].set()

    async def drive(self, plan: Plan, rng: random.Random) -> None:
        n = 0
        while not plan.done():
            await trio.sleep(rng.uniform(0, 2 * plan.think))
            if plan.done():
                return
            plan.turns_posted += 1
            n += 1
            try:
                posted = await self.client.post_message(self.id, f"message {n} from {self.id[-6:]}")
            except OmnigentError as exc:
                self.figures.lost_cause[f"post failed: HTTP {exc.status_code}"] += 1
                continue
            turn_id = posted["turn_id"]
            self.figures.posted[turn_id] = self.id
            done = self.ended.setdefault(turn_id, trio.Event())
            if turn_id in self.figures.ends:
                done.set()
            with trio.move_on_after(plan.turn_timeout):
                await done.wait()
            if not done.is_set():
                self.figures.unanswered.append(turn_id)


@dataclass
class Plan:
    turns: int
    kills: int
    think: float
    turn_timeout: float
    turns_posted: int = 0
    killer_done: bool = False

    def done(self) -> bool:
        return self.turns_posted >= self.turns and self.killer_done


async def killer(client: OmnigentClient, plan: Plan, figures: Figures, args, rng: random.Random) -> None:
    """SIGKILL a runner every `kill_every` s, never more than `slot_budget` per slot in 30 s.

    A pool slot has no name in the API, so slots are followed by succession: a
    runner id that shows up online after a kill takes the slot of the oldest
    kill whose replacement has not shown up yet.
    """
    slot_of: dict[str, int] = {}
    exits: dict[int, deque[float]] = defaultdict(deque)
    awaiting: deque[int] = deque()  # slots whose replacement has not come online yet
    try:
        for r in await client.list_runners():
            slot_of[r["runner_id"]] = len(slot_of)
        while len(figures.kills) < plan.kills:
            await trio.sleep(args.kill_every)
            deadline = trio.current_time() + args.kill_every  # wait up to one interval for a busy victim
            while True:
                now = trio.current_time()
                online = await client.list_runners()
                for r in online:
                    if r["runner_id"] not in slot_of:
                        slot_of[r["runner_id"]] = awaiting.popleft() if awaiting else len(slot_of)
                for q in exits.values():
                    while q and q[0] <= now - INTENSITY_WINDOW:
                        q.popleft()
                eligible = [r for r in online if len(exits[slot_of[r["runner_id"]]]) < args.slot_budget]
                busy_ids = {rid for _, rid in figures.in_flight.values()}
                busy = [r for r in eligible if r["runner_id"] in busy_ids] if args.target == "busy" else []
                if busy or (eligible and now >= deadline):
                    victim = rng.choice(busy or eligible)
                    break
                await trio.sleep(0.01)
            rid, slot = victim["runner_id"], slot_of[victim["runner_id"]]
            mid = [turn for turn, runner in figures.in_flight.values() if runner == rid]
            try:
                os.kill(victim["pid"], signal.SIGKILL)
            except ProcessLookupError:
                continue
            figures.kills.append(Kill(trio.current_time(), rid, victim["pid"], mid))
            exits[slot].append(trio.current_time())
            awaiting.append(slot)
            if len(figures.kills) % 20 == 0:
                print(f"  {len(figures.kills)} kills, {len(figures.posted)} turns posted", flush=True)
    finally:
        plan.killer_done = True


class CountingClient(OmnigentClient):
    """The SDK client, counting every HTTP answer by status class."""

    def __init__(self, url: str, figures: Figures) -> None:
        super().__init__(url, timeout=60)
        self.figures = figures

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = await self._http.request(method, path, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a transport error is a figure too
            self.figures.statuses["no answer"] += 1
            raise OmnigentError(f"{method} {path}: {exc}") from None
        self.figures.statuses[f"{resp.status_code // 100}xx"] += 1
        if resp.status_code >= 500:
            self.figures.five_xx.append(f"{method} {path} -> {resp.status_code}: {resp.text[:200]}")
        if resp.status_code >= 400:
            raise OmnigentError(f"{method} {path}: HTTP {resp.status_code}", resp.status_code)
        return resp.json()


async def drive(url: str, args, figures: Figures) -> dict[str, Any]:
    rng = random.Random(args.seed)
    plan = Plan(args.turns, args.kills, args.think, args.turn_timeout)
    client = CountingClient(url, figures)
    async with client:
        with trio.fail_after(60):
            while len(await client.list_runners()) < args.runners:
                await trio.sleep(0.1)
        bundle = bundle_bytes(REPO / "examples" / "hello.yaml")
        sessions = [Session(client, (await client.create_session(bundle))["id"], figures)
                    for _ in range(args.sessions)]
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for s in sessions:
                nursery.start_soon(s.follow)
            async with trio.open_nursery() as work:
                for s in sessions:
                    work.start_soon(s.drive, plan, random.Random(rng.random()))
                work.start_soon(killer, client, plan, figures, args, random.Random(rng.random()))
            await trio.sleep(1.0)  # the last rebound notices
            nursery.cancel_scope.cancel()
        pool = await client.runner_pool()
        return {"seconds": trio.current_time() - started, "gave_up": pool.get("gave_up"),
                "sessions": [s.id for s in sessions]}


def store_counts(db: Path, turn_ids: set[str]) -> tuple[Counter, list[str], list[str]]:
    """Turn statuses, turns still open, and turns with more than one stored output item."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        statuses = Counter()
        open_turns = []
        for turn_id, status in conn.execute("SELECT id, status FROM turns"):
            if turn_id in turn_ids:
                statuses[status] += 1
                if status in ("queued", "running", "interrupted"):
                    open_turns.append(turn_id)
        twice = [t for t, n in conn.execute(
            "SELECT turn_id, COUNT(*) FROM conversation_items WHERE turn_id IS NOT NULL GROUP BY turn_id")
            if n > 1 and t in turn_ids]
        return statuses, open_turns, twice
    finally:
        conn.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"median {statistics.median(values):.3f} s, p95 {pct(values, 0.95):.3f} s (n={len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--turns", type=int, default=1000, help="at least this many turns are posted")
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--runners", type=int, default=4)
    parser.add_argument("--kill-every", type=float, default=2.0, help="seconds between kills")
    parser.add_argument("--slot-budget", type=int, default=4,
                        help="kills per pool slot within 30 s (default intensity allows 5 restarts)")
    parser.add_argument("--think", type=float, default=1.5, help="mean seconds between a session's turns")
    parser.add_argument("--turn-timeout", type=float, default=120.0, help="a turn unanswered this long is lost")
    parser.add_argument("--target", choices=("busy", "any"), default="busy",
                        help="busy: prefer a runner with a turn in flight (waits up to one interval); any: any runner")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="smoke run: 60 turns, 8 kills")
    parser.add_argument("--keep", action="store_true", help="keep the data dir (logs, store)")
    args = parser.parse_args()
    if args.quick:
        args.turns, args.kills, args.think = 60, 8, 0.5
    if args.slot_budget > 5:
        print(f"note: --slot-budget {args.slot_budget} can exceed the default restart intensity (5 in 30 s)")

    tag = f"OMNIGENT_CHAOS_TAG={uuid.uuid4().hex}"
    work = Path(tempfile.mkdtemp(prefix="omnigent-chaos-"))
    (work / "config").mkdir()
    (work / "config" / "config.yaml").write_text("auth:\n  type: api_key\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OMNIGENT_TOKEN", "OMNIGENT_DATA_DIR")}
    env.update(OMNIGENT_CHAOS_TAG=tag.split("=", 1)[1], OMNIGENT_DATA_DIR=str(work / "data"),
               OMNIGENT_CONFIG_HOME=str(work / "config"), OMNIGENT_SKIP_ONBOARD="1",
               OMNIGENT_NO_UPDATE_CHECK="1", HOME=str(work),
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    mock, mock_url = start([sys.executable, "-m", "omnigent", "mock-llm", "--port", "0"], env,
                           "listening on ", work / "mock.log")
    env.update(OPENAI_BASE_URL=f"{mock_url}/v1", OPENAI_API_KEY="mock-key")
    server = None
    figures = Figures()
    wall = time.monotonic()
    try:
        server, url = start([sys.executable, "-m", "omnigent", "server", "--port", "0",
                             "--runners", str(args.runners)], env, "listening on ", work / "server.log")
        print(f"server {url} (pid {server.pid}), {args.runners} runners, mock LLM {mock_url}; "
              f"{args.sessions} sessions, >= {args.turns} turns, {args.kills} kills every {args.kill_every:g} s, "
              f"<= {args.slot_budget} kills per slot in 30 s, target {args.target}; data in {work}", flush=True)
        run = trio.run(drive, url, args, figures)
    finally:
        code = stop(server) if server is not None else None
        time.sleep(1.0)  # a runner has 1 s to notice its parent is gone (issue 7 §9)
        left = [pid for pid in tagged_pids(tag.split("=", 1)[1]) if pid != mock.pid]
        stop(mock)
        for pid in left:  # leave nothing behind, but count it first
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    turn_ids = set(figures.posted)
    statuses, open_turns, twice_stored = store_counts(work / "data" / "chat.db", turn_ids)
    ended = {t for t in turn_ids if figures.ends.get(t)}
    lost = sorted((turn_ids - ended) | set(open_turns))
    twice_seen = [t for t in turn_ids if figures.ends.get(t, []).count(ev.COMPLETED) > 1
                  or len(figures.ends.get(t, [])) > 1]
    rebound = [k.rebound_at - k.at for k in figures.kills if k.rebound_at is not None]
    answered = [t - k.at for k in figures.kills for t in k.answered.values()]
    mid = sum(len(k.mid_turn) for k in figures.kills)
    result = {
        "sessions": args.sessions, "runners": args.runners, "turns": len(turn_ids), "kills": len(figures.kills),
        "kills_mid_turn": sum(bool(k.mid_turn) for k in figures.kills), "turns_hit_mid_turn": mid,
        "seconds": round(run["seconds"], 1), "completed": statuses.get("completed", 0),
        "failed_by_code": dict(figures.errors), "lost": len(lost),
        "failed_runner_lost": figures.errors.get("runner_lost", 0),
        "answered_twice_events": len(twice_seen), "answered_twice_store": len(twice_stored),
        "http": dict(figures.statuses), "5xx": len(figures.five_xx), "processes_left": len(left),
        "server_exit": code, "gave_up": run["gave_up"],
        "kill_to_rebound": spread(rebound), "kill_to_answer": spread(answered),
        "kills_without_rebound": sum(k.rebound_at is None for k in figures.kills),
        "store_statuses": dict(statuses), "wall_seconds": round(time.monotonic() - wall, 1),
    }
    print(json.dumps(result, indent=2))
    print(f"\n{args.sessions} sessions, {len(turn_ids)} turns, {len(figures.kills)} SIGKILLs "
          f"({result['kills_mid_turn']} mid-turn, hitting {mid} turns) over {result['seconds']} s "
          f"with {args.runners} runners, default restart policy:")
    print(f"  turns lost: {len(lost)}; failed for runner loss: {result['failed_runner_lost']}; "
          f"answered twice: {len(twice_seen)} (events) / {len(twice_stored)} (store); "
          f"5xx: {len(figures.five_xx)}; processes left after exit: {len(left)}")
    print(f"  kill -> rebound: {result['kill_to_rebound']}")
    print(f"  kill -> answer:  {result['kill_to_answer']}")
    for line in figures.five_xx[:5]:
        print(f"  5xx: {line}")
    for turn_id in lost[:5]:
        print(f"  lost: {turn_id} in {figures.posted.get(turn_id)}")
    if args.keep:
        print(f"data kept in {work}")
    else:
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
