"""Benchmark: a host dies, how soon its sessions are answered by another host.

One server (in-process, real socket), two `Host` pools of --runners runners
each, linked over the host websocket (`run_host_link`), runners as real
processes against the mock LLM. --sessions sessions without a workspace are
answered once (spread over both hosts). Then, each round, the host holding
sessions dies: its link is cut and its runner processes get SIGKILL; every
one of its sessions asks again, and the time until all are answered (by the
other host) is the figure. The dead host is then started again (a new pool,
the same identity) for the next round.

Prints per-round failover times (median, max) and the median as a ratio to the
floor `python -c "import openai, trio"`, timed once per round in the same run.

Usage: python scripts/bench_host_failover.py [--rounds 5] [--sessions 6] [--runners 1]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

import httpx
import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import protocol as p  # noqa: E402
from omnigent.agents import bundle_bytes  # noqa: E402
from omnigent.client import OmnigentClient, SessionsChat  # noqa: E402
from omnigent.host.pool import Host  # noqa: E402
from omnigent.host.ws_link import run_host_link  # noqa: E402
from omnigent.link.memory import memory_link  # noqa: E402
from omnigent.server.serve import run_server  # noqa: E402
from omnigent.server.sockets import bind_socket  # noqa: E402
from omnigent.store import Store  # noqa: E402

from bench_run import import_floor, start_mock  # noqa: E402

MODEL = "bench-hosts"


class Remote:
    def __init__(self, url: str, host_id: str, secret: str, tmp: Path, env: dict[str, str], runners: int):
        self.url, self.host_id, self.secret, self.tmp, self.env, self.runners = url, host_id, secret, tmp, env, runners
        self.scope = trio.CancelScope()

    async def start(self, nursery: trio.Nursery) -> None:
        server_end, host_end = memory_link()
        pool = Host(self.url, host_end, log_dir=self.tmp / self.host_id, workspace=str(self.tmp),
                    runners=self.runners, env=self.env)
        self.scope = trio.CancelScope()

        def hello() -> p.HostHello:
            return p.HostHello(host_id=self.host_id, pid=os.getpid(), protocol_version=p.PROTOCOL_VERSION,
                               runners=list(pool._online))

        async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with self.scope:
                async with trio.open_nursery() as n:
                    await n.start(lambda task_status: run_host_link(self.url, self.host_id, self.secret,
                                                                    server_end, hello, task_status=task_status))
                    n.start_soon(pool.run)
                    task_status.started()

        await nursery.start(run)


async def until(registry, predicate) -> None:
    with trio.fail_after(60):
        while not predicate():
            await registry.wait_changed()


async def main(args: argparse.Namespace) -> None:
    mock, mock_url = start_mock()
    tmp = Path(tempfile.mkdtemp(prefix="bench-hosts-"))
    env = {**os.environ, "OPENAI_BASE_URL": f"{mock_url}/v1", "OPENAI_API_KEY": "k",
           "PYTHONPATH": str(REPO)}
    httpx.post(f"{mock_url}/mock/set_fallback", json={"key": MODEL, "text": "OK"}).raise_for_status()
    agent = tmp / "agent.yaml"
    agent.write_text(f"name: bench_hosts\nprompt: p\nexecutor:\n  model: {MODEL}\n")
    store = Store(tmp / "chat.db")
    times: list[float] = []
    floors: list[float] = []  # `python -c "import openai, trio"`, once per round, in the same run
    try:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(lambda task_status: run_server(
                store, bind_socket(), token=None, runner_wait=30, ping_interval=1.0, ping_allowance=6.0,
                task_status=task_status))
            registry = server.state.registry
            remotes = []
            async with httpx.AsyncClient(base_url=server.url) as http:
                for name in ("a", "b"):
                    body = (await http.post("/v1/hosts", json={"name": name})).json()
                    remotes.append(Remote(server.url, body["host_id"], body["host_secret"], tmp, env, args.runners))
            for r in remotes:
                await r.start(nursery)
            await until(registry, lambda: all(len(registry.host_runners(r.host_id)) == args.runners for r in remotes))
            async with OmnigentClient(server.url) as client:
                sessions = [await client.sessions.create(bundle_bytes(agent)) for _ in range(args.sessions)]
                for s in sessions:
                    await SessionsChat(namespace=client.sessions, session=s).query("hi")
                for round_ in range(args.rounds):
                    bound = {s.id: store.get_conversation(s.id)["runner_id"] for s in sessions}
                    victim = max(remotes, key=lambda r: sum(registry.host_of(rid) == r.host_id
                                                             for rid in bound.values()))
                    theirs = [sid for sid, rid in bound.items() if registry.host_of(rid) == victim.host_id]
                    pids = [registry.pids[rid] for rid in registry.host_runners(victim.host_id)]
                    start = trio.current_time()
                    victim.scope.cancel()
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    async with trio.open_nursery() as asks:
                        for sid in theirs:
                            asks.start_soon(SessionsChat(namespace=client.sessions, session=sid).query, "again")
                    times.append(trio.current_time() - start)
                    print(f"round {round_ + 1}: {len(theirs)} sessions of the dead host answered by the other "
                          f"in {times[-1]:.2f} s")
                    floors.append(await trio.to_thread.run_sync(import_floor, env))
                    await victim.start(nursery)
                    await until(registry, lambda: len(registry.host_runners(victim.host_id)) == args.runners)  # noqa: B023 (called at once)
            floor = statistics.median(floors)
            print(f"failover: median {statistics.median(times):.2f} s, max {max(times):.2f} s "
                  f"over {len(times)} rounds; `python -c 'import openai, trio'` in the same run: "
                  f"median {floor:.3f} s; ratio {statistics.median(times) / floor:.2f}")
            for r in remotes:
                r.scope.cancel()
            await server.aclose()
    finally:
        store.close()
        mock.terminate()
        mock.wait(timeout=5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--runners", type=int, default=1)
    trio.run(main, parser.parse_args())
