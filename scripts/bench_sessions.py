"""Benchmark: many sessions on one `omnigent server` with 4 runners (issue 10, "Many sessions").

Everything runs on this machine: the mock LLM (answers each model call after
`--delay-ms`, 50 ms by default: a model's own time), `omnigent server
--runners 4` and the load generator (this process, trio: each session followed
on its SSE stream, `/v1/sessions/{id}/stream`, as the SDK, the REPL and `attach`
follow one, or with `--follow ws` on its websocket, `/ws`; turns posted over HTTP).

The per-turn floor: one warm trio process (`--floor-worker`, a child of this
script) making the same `openai` streaming Responses call to the same mock,
one call after the other: its CPU per call (getrusage of that process) and
its latency per call (request -> the stream's end).

Figures (each phase after a warm-up):
  - lone: one session, turns one after the other. Added latency per turn
    (post -> `response.completed` on the session's stream, minus the floor's
    median call) p50/p99; CPU of omnigent's processes per turn (server plus
    runners, utime+stime from /proc) over the floor's CPU per call. With
    `--stream-words`, also the added time to the first text delta on the stream
    (post -> first delta, minus the floor's request -> first delta).
  - paced: 100 sessions, turns posted at 25 turns/s in all (each to an idle
    session): added latency p50/p99.
  - closed loop: 100 sessions, each posts its next turn when its last is
    done: turns/s, CPU per turn over the floor's, and each process's share
    of the cores (CPU seconds over wall seconds: 1.0 = one core).
  - stalls (`OMNIGENT_STALLS`): the garbage collector's pauses (the server's,
    its runners' and this load generator's own) and the store's slow commits
    and WAL checkpoints, named: over the run, and for each of the lone and
    paced phases' turns at or above their p99, the stalls that overlapped it.

Prints figures; asserts nothing.

Usage: python scripts/bench_sessions.py [--delay-ms 50] [--lone 100] [--sessions 100]
       [--rate 25] [--paced-s 15] [--closed-s 10] [--runners 4] [--profile DIR] [--perf DIR] [--stream-words N]
       [--token-ms MS] [--timeline] [--follow sse|ws]

`--stream-words N`: every answer streams N words, one text delta each, as a model streams
tokens (the mock's default answer has no deltas, so the figures above leave them out). The
mock sends them all at once, with the answer's end, unless `--token-ms MS` paces them as a
model does (the first at once, each later one MS after the one before): only then is the
time to the first delta a model's time to its first token, not its time to the whole answer.

`--timeline`: the server and runners mark each turn's path (`OMNIGENT_TIMELINE`); prints the
median of each segment of a lone turn (post, store, dispatch, link, runner, model, answer, end,
delivery), with the server's SQL statements and trio task steps in each where both marks are its
(`OMNIGENT_TIMELINE_COUNTS`). The marks cost a few file writes per turn and the counts a callback per
statement and per task step: the other figures of such a run are a little higher.

`--profile DIR` samples the server and runners with py-spy over the lone and closed-loop phases
(it costs CPU: the figures of a profiled run are not the figures to report). py-spy reads each
process without stopping it (`--nonblocking`): five processes stopped 500 times a second each
left the closed loop at 17 turns/s with its turns taking 5 s, where it makes ~70 sampled this way.

`--perf DIR` records the same processes over the same phases with `perf record -e cpu-clock`
(`bench_perf.py`) and prints their CPU a turn split by layer: the interpreter, the kernel,
SQLite, libc, C extensions. Unlike py-spy's, these samples are only of instants a CPU ran the
process. It costs CPU too (and its writes slow the store's commits: a p99 of such a run is not one).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_perf import PerfSampler  # noqa: E402  (a sibling script)

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "examples" / "hello.yaml"
TICK = os.sysconf("SC_CLK_TCK")
MAX_TURNS = 20  # per session of the lone phase (histories of at most 40 items)
# a lone turn's path, in order (`--timeline`): "posted" and "seen" are this script's, the rest the
# marks the server and runner make (`omnigent.config.timeline.mark`, "turn.<point>:<turn id>")
TURN_POINTS = [
    ("posted", "the HTTP post up to the route: the client's httpx, hypercorn, quart"),
    ("entered", "the route: the session read, the body read and parsed"),
    ("bodied", "the message's transaction: message, turn, claim, attempt start, events"),
    ("stored", "the worker: claim, history, the TurnStart handed to the link"),
    ("dispatched", "the link's writer: its turn to write (after what it was writing)"),
    ("written", "the TurnStart across the websocket to the runner"),
    ("received", "the runner: the step's set-up up to the model call"),
    ("model_call", "the model call: request -> its terminal event (the stream's end is read after the answer went)"),
    ("model_done", "the answer over the link"),
    ("answered", "the end transaction: step, turn, usage, events"),
    ("ended", "delivery of `response.completed` to the watcher"),
    ("seen", ""),
]


# --- processes and their CPU ---------------------------------------------------------


def start_mock(delay_ms: float, token_ms: float = 0.0) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "omnigent.testing.mock_llm", "--port", "0",
                             "--delay-ms", str(delay_ms), "--token-ms", str(token_ms)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    return proc, line.rsplit(" ", 1)[1].strip()


def start_server(env: dict[str, str], data: Path, runners: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--runners", str(runners), "--port", "0",
                             "--data-dir", str(data)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if "listening on " not in line:
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    return proc, line.split("listening on ")[1].split()[0]


def stop_server(proc: subprocess.Popen[str]) -> None:
    """SIGTERM (the server stops its runners), then SIGKILL after 15 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, CPU seconds) of a live process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds of `root` and every live descendant, by pid."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                stats[int(entry)] = st
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        if pid in stats:
            found[pid] = stats[pid][1]
            frontier.extend(p for p, (ppid, _) in stats.items() if ppid == pid)
    return found


class Profiler:
    """`--profile DIR`: py-spy samples of the server and each runner over one phase.

    Writes DIR/PHASE-server.txt and DIR/PHASE-runner-PID.txt (py-spy's raw, collapsed stacks:
    feed them to flamegraph.pl or read the heaviest lines). py-spy is not a dependency: it is
    found on PATH or next to this Python, and the option is refused without it.
    """

    def __init__(self, out: str | None, server_pid: int) -> None:
        self.out, self.server_pid, self.procs = out, server_pid, []
        self.exe = None
        if out:
            import shutil

            self.exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
            if self.exe is None:
                raise SystemExit("--profile needs py-spy (pip install py-spy)")
            Path(out).mkdir(parents=True, exist_ok=True)

    def start(self, phase: str) -> None:
        if not self.exe:
            return
        for pid in tree_cpu(self.server_pid):
            name = "server" if pid == self.server_pid else f"runner-{pid}"
            self.procs.append(subprocess.Popen(
                [self.exe, "record", "-p", str(pid), "-r", "500", "--nonblocking", "--format", "raw",
                 "-o", str(Path(self.out) / f"{phase}-{name}.txt")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for proc in self.procs:
            proc.wait()
        self.procs.clear()


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(after[pid] - before.get(pid, 0.0) for pid in after)


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- the floor: one warm trio process, the same openai streaming call -------------------

FLOOR_CODE = """
import json, os, resource, sys, time
import openai, trio

async def main(n, warm):
    client = openai.AsyncOpenAI(api_key="mock", base_url=os.environ["OPENAI_BASE_URL"], max_retries=0)
    first = []
    async def call(t):
        stream = await client.responses.create(model="gpt-4o-mini", stream=True,
                                               input=[{"role": "user", "content": [{"type": "input_text", "text": "Say hi"}]}])
        seen = False
        async for event in stream:
            if not seen and event.type == "response.output_text.delta":
                seen = True
                first.append(time.perf_counter() - t)
    for _ in range(warm):
        await call(time.perf_counter())
    first.clear()
    lat = []
    u = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = u.ru_utime + u.ru_stime
    for _ in range(n):
        t = time.perf_counter()
        await call(t)
        lat.append(time.perf_counter() - t)
    u = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"latency": lat, "first": first, "cpu": (u.ru_utime + u.ru_stime - cpu0) / n}))
    await client.close()

trio.run(main, int(sys.argv[1]), int(sys.argv[2]))
"""


def floor(url: str, n: int) -> dict:
    env = {**os.environ, "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": "mock"}
    out = subprocess.run([sys.executable, "-c", FLOOR_CODE, str(n), "10"], env=env, check=True,
                         capture_output=True, text=True, stdin=subprocess.DEVNULL).stdout
    return json.loads(out)


# --- the load generator ----------------------------------------------------------------


class Session:
    def __init__(self, session_id: str, http) -> None:
        self.id, self.http = session_id, http
        self.done = None  # a trio.Event while a turn is in flight
        self.posted = 0.0
        self.first: float | None = None  # post -> the turn's first text delta on the stream
        self.turns = 0
        self.last: tuple[str, float, float] | None = None  # turn id, posted, done (time.monotonic)


async def open_sessions(url: str, n: int, nursery, http, clients, how: str = "sse") -> list[Session]:
    """`n` sessions, each followed on its stream (`how`: see `follow`) and posted to through a client of its own.

    One client per session: httpcore's pool looks at every connection it holds for each
    request (`is_idle`, `has_expired`, a readability poll each), so one shared pool of 100
    connections made the load generator spend ~70 % of its CPU there, and the closed loop
    measured the load generator more than the server.
    """
    import httpx
    import trio

    sys.path.insert(0, str(REPO))
    from omnigent.agents import bundle_bytes
    from omnigent.client._http import KEEPALIVE_EXPIRY  # a session's client keeps its connection as the SDK's
    from omnigent.config.tls import verify_for  # httpx's default CA bundle costs ~50 ms per client

    bundle = bundle_bytes(AGENT)
    sessions: list[Session] = []

    async def one() -> None:
        r = await http.post(f"{url}/v1/sessions", data={"metadata": "{}"},
                            files={"bundle": ("agent.tar.gz", bundle, "application/gzip")})
        r.raise_for_status()
        sid = r.json()["session_id"]
        ready = trio.Event()
        own = await clients.enter_async_context(httpx.AsyncClient(
            base_url=url, timeout=60, verify=verify_for(url),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=KEEPALIVE_EXPIRY)))
        nursery.start_soon(follow, url, sid, sessions, own, ready, how)
        await ready.wait()

    async with trio.open_nursery() as opening:
        for _ in range(n):
            opening.start_soon(one)
    return sessions


async def all_online(http, url: str, runners: int, timeout: float = 60) -> None:
    """Wait until `runners` runners are online (`GET /v1/runners`), polling."""
    import trio

    with trio.fail_after(timeout):
        while True:
            r = await http.get(f"{url}/v1/runners")
            r.raise_for_status()
            if len(r.json()["data"]) >= runners:
                return
            await trio.sleep(0.1)


async def follow(url: str, sid: str, sessions: list[Session], own, ready, how: str) -> None:
    """Follow one session's stream: SSE (`/stream`, what the SDK, the REPL and `attach` read) or
    the websocket (`/ws`); `ready` is set once it is live."""
    if how == "ws":
        from trio_websocket import ConnectionClosed, open_websocket_url

        async with open_websocket_url(f"ws{url[4:]}/v1/sessions/{sid}/ws",
                                      extra_headers=[("Origin", "omnigent://internal")]) as ws:
            session = Session(sid, own)
            sessions.append(session)
            ready.set()
            while True:
                try:
                    _seen(session, await ws.get_message())
                except ConnectionClosed:
                    return
    import httpx

    from omnigent.config.tls import verify_for

    async with httpx.AsyncClient(base_url=url, timeout=None, verify=verify_for(url)) as sse, \
            sse.stream("GET", f"/v1/sessions/{sid}/stream") as response:
        response.raise_for_status()
        session = Session(sid, own)
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if not ready.is_set():  # the greeting: the stream is live from here
                sessions.append(session)
                ready.set()
                continue
            _seen(session, line[6:])


def _seen(session: Session, raw: str) -> None:
    """One event of the session's stream: a cheap look first (only a turn's first delta and its end matter)."""
    import trio

    if session.first is None and session.done is not None and '"response.output_text.delta"' in raw:
        session.first = trio.current_time() - session.posted
    if '"response.completed"' in raw or '"response.failed"' in raw:
        kind = json.loads(raw).get("type")
        if kind in ("response.completed", "response.failed") and session.done is not None:
            session.latency = trio.current_time() - session.posted
            session.done_mono = time.monotonic()
            session.failed = kind == "response.failed"
            done, session.done = session.done, None
            done.set()


async def turn(session: Session) -> float:
    import trio

    done = session.done = trio.Event()  # follow() clears session.done when it sets it
    session.turns += 1
    session.first = None
    session.posted = trio.current_time()
    posted_mono = time.monotonic()  # CLOCK_MONOTONIC, as the processes' timeline marks
    r = await session.http.post(f"/v1/sessions/{session.id}/events",
                        json={"type": "message", "data": {"role": "user",
                                                          "content": [{"type": "input_text", "text": "Say hi"}]}})
    if r.status_code >= 400:
        raise SystemExit(f"post failed: {r.status_code} {r.text[:200]}")
    await done.wait()
    if getattr(session, "failed", False):
        raise SystemExit("a turn failed")
    session.last = (r.json()["turn_id"], posted_mono, session.done_mono)
    return session.latency


async def load(url: str, server_pid: int, mock_pid: int, args) -> dict:
    import httpx
    import trio

    results: dict = {}
    profiler = Profiler(args.profile, server_pid)
    sampler = PerfSampler(args.perf, server_pid, tree_cpu)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with contextlib.AsyncExitStack() as clients, \
            httpx.AsyncClient(timeout=60, limits=limits) as http, trio.open_nursery() as nursery:
        # Short conversations: this measures the cost of a turn, not of a long history (issue 10's
        # flat-in-length figures are scripts/bench_history.py's). The lone session is a series of
        # sessions of at most MAX_TURNS turns each; each phase of many sessions has its own.
        # (each also takes one warm-up turn below)
        # every runner online first: one still starting (importing openai: ~1 s of CPU) would be
        # counted in the first phase's CPU per turn (a lone phase of 300 turns: +13 ms a turn)
        await all_online(http, url, args.runners)
        lone_sessions = await open_sessions(url, -(-(args.lone + 10) // (MAX_TURNS - 1)), nursery, http, clients,
                                            args.follow)
        sessions = await open_sessions(url, args.sessions, nursery, http, clients, args.follow)
        closed_sessions = await open_sessions(url, args.sessions, nursery, http, clients, args.follow)
        # warm every session (its first turn binds it to a runner), a few at a time: all at once, the
        # burst left each runner's HTTP pool holding ~30-55 idle connections to the model for their
        # keep-alive (5 s), which httpcore polls one by one at every request and release, and the
        # first seconds of the lone phase that followed paid it
        warming = trio.CapacityLimiter(args.runners)

        async def warm_up(s: Session) -> None:
            async with warming:
                await turn(s)

        async with trio.open_nursery() as warm:
            for s in lone_sessions + sessions + closed_sessions:
                warm.start_soon(warm_up, s)

        # lone: one session, one turn after the other
        def lone_session() -> Session:
            while lone_sessions[0].turns >= MAX_TURNS:
                lone_sessions.pop(0)
            return lone_sessions[0]

        for _ in range(10):
            await turn(lone_session())
        # this process's ~300 streams and clients live until the end: out of its collector's sight,
        # and its collections as rare as the server's (config/collector.py). At CPython's defaults
        # its own pauses (full collections of 75-86 ms, middle ones up to 34) land in the turns it times.
        from omnigent.config import collector

        gc.collect()
        collector.tune()
        profiler.start("lone")
        sampler.start("lone")
        cpu0, t0 = tree_cpu(server_pid), time.perf_counter()
        results["lone"], results["lone_first"], results["lone_ends"] = [], [], []
        for _ in range(args.lone):
            s = lone_session()
            results["lone"].append(await turn(s))
            results["lone_ends"].append(s.last)
            if s.first is not None:
                results["lone_first"].append(s.first)
        profiler.stop()
        sampler.stop(args.lone)
        cpu1 = tree_cpu(server_pid)
        results["lone_cpu"] = cpu_delta(cpu0, cpu1) / max(1, args.lone)
        results["lone_server_cpu"] = (cpu1[server_pid] - cpu0[server_pid]) / max(1, args.lone)
        results["lone_wall"] = time.perf_counter() - t0

        # paced: `rate` turns/s in all, each to a session with no turn in flight
        paced: list[float] = []
        idle = list(sessions)

        results["paced_ends"] = []

        async def paced_turn(s: Session) -> None:
            paced.append(await turn(s))
            results["paced_ends"].append(s.last)
            idle.append(s)

        async with trio.open_nursery() as pacing:
            interval = 1 / args.rate
            next_at = trio.current_time()
            end = next_at + args.paced_s
            while next_at < end:
                await trio.sleep_until(next_at)
                if idle:
                    pacing.start_soon(paced_turn, idle.pop(0))
                next_at += interval
        results["paced"] = paced

        # closed loop: every session posts its next turn as soon as its last is done
        closed: list[float] = []
        sessions = closed_sessions
        stop_at = trio.current_time() + args.closed_s
        profiler.start("closed")
        sampler.start("closed")
        cpu0 = tree_cpu(server_pid)
        mock0 = tree_cpu(mock_pid)
        me0 = self_cpu()
        t0 = time.perf_counter()

        async def loop(s: Session) -> None:
            while trio.current_time() < stop_at:
                closed.append(await turn(s))

        async with trio.open_nursery() as looping:
            for s in sessions:
                looping.start_soon(loop, s)
        wall = time.perf_counter() - t0
        cpu1 = tree_cpu(server_pid)
        profiler.stop()
        sampler.stop(len(closed))
        results["closed"] = closed
        results["closed_wall"] = wall
        results["closed_cpu"] = cpu_delta(cpu0, cpu1)
        results["closed_server_cpu"] = cpu1[server_pid] - cpu0[server_pid]
        results["shares"] = {pid: (cpu1[pid] - cpu0.get(pid, 0.0)) / wall for pid in cpu1}
        results["mock_share"] = cpu_delta(mock0, tree_cpu(mock_pid)) / wall
        results["loadgen_share"] = (self_cpu() - me0) / wall
        results["max_turns"] = max(s.turns for s in closed_sessions)
        nursery.cancel_scope.cancel()
    results["perf"] = sampler  # reported against the floor, timed after the phases
    return results


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def turn_timeline(path: Path, ends: list[tuple[str, float, float]], floor_lat: float, phase: str = "lone") -> list[str]:
    """Median time of each segment of a `phase` turn's path (TURN_POINTS), from the processes' marks.

    The server's marks carry its counts so far (`omnigent.config.timeline._counts`): SQL
    statements and trio task steps. A segment between two of its marks says how many it took,
    and one stored mark to the next, how many a whole turn takes.
    """
    marks: dict[str, dict[str, float]] = {}
    counts: dict[str, dict[str, tuple[str, dict[str, int]]]] = {}  # turn -> point -> (pid, counts so far)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        name, _, rest = line.partition(" ")
        point, _, turn_id = name.partition(":")
        if point.startswith("turn.") and turn_id and point[5:] not in marks.get(turn_id, {}):  # a turn's first
            at, pid, *counted = rest.split()
            marks.setdefault(turn_id, {})[point[5:]] = float(at)
            if counted:
                counts.setdefault(turn_id, {})[point[5:]] = (
                    pid, {what: int(n) for what, _, n in (c.partition("=") for c in counted)})
    rows, counted_rows = [], []
    for turn_id, posted, seen in ends:
        points = {**marks.get(turn_id, {}), "posted": posted, "seen": seen}
        if all(name in points for name, _ in TURN_POINTS):
            rows.append(points)
            counted_rows.append(counts.get(turn_id, {}))
    if not rows:
        have = sorted({point for points in marks.values() for point in points})
        return [f"no {phase} turn has every point of TURN_POINTS (marks seen: {', '.join(have) or 'none'})"]

    def made(pairs: list[tuple[tuple[str, dict[str, int]] | None, tuple[str, dict[str, int]] | None]]) -> str:
        """Median SQL statements and task steps between the two marks of each pair (one process's)."""
        got = []
        for what in ("sql", "steps"):
            spans = [b[1][what] - a[1][what] for a, b in pairs
                     if a and b and a[0] == b[0] and what in a[1] and what in b[1]]
            got.append(f"{statistics.median(spans):5.0f}" if spans else "     ")
        return " ".join(got)

    out = [f"where a {phase} turn's time goes ({len(rows)} turns; medians: ms, then the server's SQL statements"
           " and task steps; the marks and counts cost a little):"]
    for (a, what), (b, _) in zip(TURN_POINTS, TURN_POINTS[1:]):
        spans = [r[b] - r[a] for r in rows]
        extra = (f" (the floor's whole call: {floor_lat * 1000:.1f})" if a == "model_call" else "")
        out.append(f"  {a:>10} -> {b:<10} {statistics.median(spans) * 1000:6.2f}  p90 {pct(spans, .9) * 1000:6.2f}"
                   f"  {made([(c.get(a), c.get(b)) for c in counted_rows])}  {what}{extra}")
    total = [r["seen"] - r["posted"] for r in rows]
    whole = made([(a.get("stored"), b.get("stored")) for a, b in zip(counted_rows, counted_rows[1:])])
    out.append(f"  {'posted':>10} -> {'seen':<10} {statistics.median(total) * 1000:6.2f}"
               f"  {'':>10} {whole}  a whole turn (one stored mark to the next)")
    return out


def started_with_message(db: Path) -> tuple[int, int, int]:
    """(turns whose first attempt started in their message's transaction, turns posted, sessions with a
    turn), read from the server's store: such a turn's `input.consumed` and `response.created` share one
    `created_at`, since the store stamps a transaction's events once (`TurnService.queue_message`,
    `append_events`). A session's first turn binds its runner in that transaction too
    (`Placement.at_once`)."""
    import sqlite3

    from protocol import events as ev

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        started = conn.execute(
            """SELECT COUNT(*) FROM session_events a JOIN session_events b
                 ON b.conversation_id = a.conversation_id AND b.turn_id = a.turn_id
                WHERE a.type = ? AND b.type = ? AND b.created_at = a.created_at""",
            [ev.INPUT_CONSUMED, ev.RESPONSE_CREATED]).fetchone()[0]
        turns, sessions = conn.execute("SELECT COUNT(*), COUNT(DISTINCT conversation_id) FROM session_events "
                                       "WHERE type = ?", [ev.INPUT_CONSUMED]).fetchone()
    finally:
        conn.close()
    return started, turns, sessions


def read_stalls(path: Path, start: float) -> list[tuple[str, float, float]]:
    """The stalls since `start` of the server, its runners (`runner_` kinds) and this process
    (`loadgen_`): (kind, monotonic end, milliseconds)."""
    stalls: list[tuple[str, float, float]] = []
    if not path.exists():
        return stalls
    for line in path.read_text().splitlines():
        try:
            kind, at, ms = line.split()[:3]
        except ValueError:
            continue
        if float(at) >= start:
            stalls.append((kind, float(at), float(ms)))
    return stalls


def stall_report(stalls: list[tuple[str, float, float]]) -> list[str]:
    by_kind: dict[str, list[float]] = {}
    for kind, _, ms in stalls:
        by_kind.setdefault(kind, []).append(ms)
    return [f"{kind}: {len(v)} over 1 ms, max {max(v):.1f} ms, total {sum(v):.0f} ms"
            for kind, v in sorted(by_kind.items())]


def p99_stalls(phase: str, latencies: list[float], ends: list[tuple[str, float, float]],
               stalls: list[tuple[str, float, float]], floor_lat: float) -> str:
    """The phase's turns at or above its p99, slowest first, each with the stalls that overlapped it
    (issue 10: name the stalls when they show in the p99). A checkpoint runs in a thread: it pauses
    no loop, but takes a core."""
    cut = pct(latencies, .99)
    slow = sorted((lat, start, end) for lat, (_, start, end) in zip(latencies, ends) if lat >= cut)[::-1]
    parts = []
    for lat, start, end in slow[:5]:
        hit = [(kind, ms) for kind, at, ms in stalls if at >= start and at - ms / 1000 <= end]
        named = [f"{kind} {ms:.1f} ms" for kind, ms in hit if ms >= NOTABLE_MS]
        if len(hit) > len(named):
            named.append(f"{len(hit) - len(named)} under {NOTABLE_MS:.0f} ms")
        parts.append(f"+{(lat - floor_lat) * 1000:.1f} ms: {', '.join(named) or 'no stall over 1 ms'}")
    return f"  {phase} p99 turns ({len(slow)} of {len(latencies)}): " + "; ".join(parts)


# a stall named in a p99 turn: shorter ones are mostly the turn's own transactions (~1-2 ms each
# on the 2-core machine), counted but not named
NOTABLE_MS = 5.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay-ms", type=float, default=50)
    parser.add_argument("--lone", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--rate", type=float, default=25)
    parser.add_argument("--paced-s", type=float, default=15)
    parser.add_argument("--closed-s", type=float, default=10)
    parser.add_argument("--runners", type=int, default=4)
    parser.add_argument("--floor-calls", type=int, default=100)
    parser.add_argument("--profile", metavar="DIR", help="py-spy samples of the server and runners per phase")
    parser.add_argument("--perf", metavar="DIR",
                        help="perf's on-CPU samples of the server and runners per phase: their CPU a turn by layer "
                             "(interpreter, kernel, SQLite, ...)")
    parser.add_argument("--follow", choices=("sse", "ws"), default="sse",
                        help="how each session's stream is followed: SSE (/stream, as the SDK, the REPL and "
                             "attach do) or the websocket (/ws)")
    parser.add_argument("--timeline", action="store_true",
                        help="the server and runners mark each turn's path (OMNIGENT_TIMELINE): print its segments")
    parser.add_argument("--stream-words", type=int, default=0, metavar="N",
                        help="every answer (the floor's too) streams N words, one text delta each")
    parser.add_argument("--token-ms", type=float, default=0, metavar="MS",
                        help="with --stream-words: the mock sends each delta MS after the one before, as a model "
                             "streams tokens (default: the whole answer at once)")
    args = parser.parse_args()
    import trio

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench still stops its server

    if args.token_ms and not args.stream_words:
        parser.error("--token-ms paces the deltas of --stream-words: give both")
    mock, mock_url = start_mock(args.delay_ms, args.token_ms)
    if args.stream_words:
        import httpx

        httpx.post(f"{mock_url}/mock/set_fallback", json={"text": " ".join(["word"] * args.stream_words),
                                                          "stream": True}).raise_for_status()
    from omnigent.config.timeline import STALLS_VAR, watch_gc

    server = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sessions-") as tmp:
            stalls = Path(tmp) / "stalls"
            env = {**os.environ, "HOME": tmp, "OPENAI_BASE_URL": f"{mock_url}/v1", "OPENAI_API_KEY": "mock",
                   STALLS_VAR: str(stalls)}
            timeline = Path(tmp) / "timeline"
            if args.timeline:
                env["OMNIGENT_TIMELINE"] = str(timeline)
                env["OMNIGENT_TIMELINE_COUNTS"] = "1"  # the server's marks carry its statements and task steps
            floor_before = floor(mock_url, args.floor_calls)
            server, url = start_server(env, Path(tmp) / "data", args.runners)
            started = time.monotonic()
            # this process's own collections delay the turns it times as much as the server's do:
            # recorded in the same file, the same way
            os.environ[STALLS_VAR] = str(stalls)
            watch_gc("loadgen_")
            results = trio.run(load, url, server.pid, mock.pid, args)
            with_message = started_with_message(Path(tmp) / "data" / "chat.db")
            floor_after = floor(mock_url, args.floor_calls)
            stall_list = read_stalls(stalls, started)
            floor_median = statistics.median(floor_before["latency"] + floor_after["latency"])
            timeline_lines = []
            if args.timeline:
                for phase in ("lone", "paced"):  # where the paced turns' extra time goes, beside the lone ones'
                    if results[f"{phase}_ends"]:
                        timeline_lines += [""] * bool(timeline_lines) + turn_timeline(
                            timeline, results[f"{phase}_ends"], floor_median, phase)
            names = {}
            for pid in results["shares"]:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    names[pid] = "server" if pid == server.pid else ("runner" if b"omnigent.runner" in cmd else
                                                                    cmd[-2].decode() if len(cmd) > 1 else "?")
                except OSError:
                    names[pid] = "?"
    finally:
        if server is not None:
            stop_server(server)
        mock.terminate()
        mock.wait()

    floor_lat = statistics.median(floor_before["latency"] + floor_after["latency"])
    floor_cpu = statistics.median([floor_before["cpu"], floor_after["cpu"]])
    lone, paced, closed = results["lone"], results["paced"], results["closed"]
    streamed = f", streaming {args.stream_words} words (a delta each)" if args.stream_words else ""
    if args.token_ms:
        streamed += f" {args.token_ms:g} ms apart"
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; mock answers after "
          f"{args.delay_ms:.0f} ms{streamed}; server with {args.runners} runners; load generator in this process, "
          f"following each session over {'SSE' if args.follow == 'sse' else 'the websocket'}")
    print(f"per-turn floor (one warm trio process, the same openai streaming call): latency median "
          f"{floor_lat * 1000:.1f} ms (p99 {pct(floor_before['latency'] + floor_after['latency'], 0.99) * 1000:.1f}), "
          f"CPU {floor_cpu * 1000:.2f} ms per call (before/after: {floor_before['cpu'] * 1000:.2f} / "
          f"{floor_after['cpu'] * 1000:.2f})")
    print()
    print("| what | ratio / added | absolute |")
    print("| --- | --- | --- |")
    lone_server = results["lone_server_cpu"]
    if lone:  # a phase of no turns (--lone 0, --paced-s 0, --closed-s 0) prints no rows
        print(f"| CPU per turn, server + runners, lone session ({len(lone)} turns) | {results['lone_cpu'] / floor_cpu:.2f}× "
              f"the floor's | {results['lone_cpu'] * 1000:.1f} ms (server {lone_server * 1000:.1f}, "
              f"runners {(results['lone_cpu'] - lone_server) * 1000:.1f}) |")
    closed_cpu = results["closed_cpu"] / max(1, len(closed))
    closed_server = results["closed_server_cpu"] / max(1, len(closed))
    if closed:
        print(f"| CPU per turn, server + runners, {args.sessions} busy sessions (closed loop) | "
              f"{closed_cpu / floor_cpu:.2f}× | {closed_cpu * 1000:.1f} ms (server {closed_server * 1000:.1f}, "
              f"runners {(closed_cpu - closed_server) * 1000:.1f}) |")
    if lone:
        print(f"| lone session: added latency p50 / p99 | +{(pct(lone, .5) - floor_lat) * 1000:.1f} / "
              f"+{(pct(lone, .99) - floor_lat) * 1000:.1f} ms | {pct(lone, .5) * 1000:.1f} / {pct(lone, .99) * 1000:.1f} ms |")
    if results["lone_first"] and floor_before["first"]:
        first, floor_first = results["lone_first"], statistics.median(floor_before["first"] + floor_after["first"])
        print(f"| lone session: added time to the first text delta on the stream, p50 / p99 | "
              f"+{(pct(first, .5) - floor_first) * 1000:.1f} / +{(pct(first, .99) - floor_first) * 1000:.1f} ms | "
              f"{pct(first, .5) * 1000:.1f} / {pct(first, .99) * 1000:.1f} ms (the floor's "
              f"{floor_first * 1000:.1f} ms) |")
    if paced:
        print(f"| {args.sessions} sessions paced at {args.rate:.0f} turns/s ({len(paced)} turns): added p50 / p99 | "
              f"+{(pct(paced, .5) - floor_lat) * 1000:.1f} / +{(pct(paced, .99) - floor_lat) * 1000:.1f} ms | "
              f"{pct(paced, .5) * 1000:.1f} / {pct(paced, .99) * 1000:.1f} ms |")
    if closed:
        rate = len(closed) / results["closed_wall"]
        print(f"| {args.sessions} sessions, closed loop ({len(closed)} turns in {results['closed_wall']:.1f} s, "
              f"up to {results['max_turns']} turns per session) | {rate:.0f} turns/s | "
              f"latency p50 {pct(closed, .5) * 1000:.0f} ms, p99 {pct(closed, .99) * 1000:.0f} ms |")
        shares = sorted(((names[pid], share) for pid, share in results["shares"].items()), key=lambda x: -x[1])
        parts = [f"{name} {share:.2f}" for name, share in shares if share >= 0.005]
        parts += [f"mock {results['mock_share']:.2f}", f"load generator {results['loadgen_share']:.2f}"]
        print(f"| closed loop: share of the cores (1.0 = one core) | | {', '.join(parts)} |")
    started, turns, firsts = with_message
    print(f"| turns whose attempt started in their message's transaction (all phases; each session's first "
          f"binds its runner in it) | {started / max(1, turns):.0%} | "
          f"{started} of {turns} ({turns} turns of {firsts} sessions) |")
    if stall_list:
        print()
        print("stalls over the run (OMNIGENT_STALLS: the server's, its runners' `runner_`, this process's `loadgen_`):")
        for line in stall_report(stall_list):
            print(f"  {line}")
        if lone:
            print(p99_stalls("lone", lone, results["lone_ends"], stall_list, floor_lat))
        if paced:
            print(p99_stalls("paced", paced, results["paced_ends"], stall_list, floor_lat))
    if timeline_lines:
        print()
        print("\n".join(timeline_lines))
    perf_lines = results["perf"].report(floor_cpu * 1000)
    if perf_lines:
        print()
        print("CPU a turn by layer (perf's on-CPU samples; ms, share of the process's):")
        for line in perf_lines:
            print(f"  {line}")


if __name__ == "__main__":
    main()
