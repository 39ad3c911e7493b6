"""Benchmark: how fast a killed runner is repaired, with and without a warm spare.

Runs the real `omnigent run` tree in-process (server + host + real runner
processes) against the mock LLM, and measures with the real clock:
  - SIGKILL of an idle runner -> a replacement online and the session rebound
  - SIGKILL in the middle of a turn -> the answer shown (turn retried once)
  - memory (PSS) of the runner processes, i.e. what the spare costs
Prints figures; asserts nothing.

Usage: python scripts/bench_recovery.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import httpx
import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omnigent.agents import bundle_bytes  # noqa: E402
from omnigent.host.pool import DEFAULT_POLICY  # noqa: E402
from omnigent.tree.local import run_tree  # noqa: E402

from bench_run import pss_kib, start_mock  # noqa: E402


async def wait_event(stream, kind: str) -> dict:
    with trio.fail_after(30):
        return await _next_of(stream, kind)


async def _next_of(stream, kind: str) -> dict:
    async for event in stream:
        if event["type"] == kind:
            return event
    raise RuntimeError(f"stream ended before {kind}")


async def settled(client, n: int) -> None:
    """Before the next kill: `n` runners online again (a replacement or spare starts in ~1 s on the
    2-core machine; a pause alone was shorter than that on a slow day, and a kill then found no
    spare), and then up for longer than the policy's `reset_after`, so the kill is a lone incident."""
    with trio.fail_after(30):
        while len(await client.list_runners()) < n:
            await trio.sleep(0.01)
    await trio.sleep(1.0)


def measure(spares: int, rounds: int, mock_url: str) -> dict[str, list[float]]:
    """One runner and `spares` warm spares, as the REPL has: the spare starts after the first turn."""
    figures: dict[str, list[float]] = {"idle": [], "midturn": [], "runner_pss": []}
    bundle = bundle_bytes(REPO / "examples" / "hello.yaml")
    gate = trio.Event()

    async def front(client) -> int:
        sid = (await client.create_session(bundle))["id"]
        await client.run_turn(sid, "warm up")
        gate.set()  # what the REPL does once its first turn is done
        await trio.sleep(1.5)  # let the spare start and runners finish their idle warm-up
        for _ in range(rounds):
            # idle kill -> rebound to an online runner
            rid = (await client.get_session(sid))["runner_id"]
            pid = (await client.runner_status(rid))["pid"]
            async with client.events(sid) as stream:
                await anext(stream)
                t0 = trio.current_time()
                os.kill(pid, signal.SIGKILL)
                rebound = await wait_event(stream, "session.runner.rebound")
                new = (await client.runner_status(rebound["new_runner_id"]))["online"]
                figures["idle"].append(trio.current_time() - t0)
                assert new
            await settled(client, 1 + spares)
            # mid-turn kill -> answer shown
            httpx.post(f"{mock_url}/mock/configure",
                       json={"responses": [{"block": True, "text": "lost"}, {"text": "recovered"}]})
            rid = (await client.get_session(sid))["runner_id"]
            pid = (await client.runner_status(rid))["pid"]
            async with client.events(sid) as stream:
                await anext(stream)
                posted = await client.post_message(sid, "please answer")
                while not httpx.get(f"{mock_url}/gate/pending").json()["count"]:
                    await trio.sleep(0.005)
                t0 = trio.current_time()
                os.kill(pid, signal.SIGKILL)
                done = await wait_event(stream, "response.completed")
                figures["midturn"].append(trio.current_time() - t0)
                assert done["turn_id"] == posted["turn_id"]
            httpx.post(f"{mock_url}/gate/release", json={})
            await settled(client, 1 + spares)
        await trio.sleep(1.5)  # every slot refilled and warm
        runner_pids = [r["pid"] for r in await client.list_runners()]
        figures["runner_pss"].append(sum(pss_kib(p) for p in runner_pids) / 1024)
        return 0

    old_home = os.environ.get("HOME")
    with tempfile.TemporaryDirectory() as home:
        os.environ["HOME"] = home
        try:
            # each kill is a lone incident: 2 kills a round would exceed the default restart
            # intensity (5 in 30 s) and grow the backoff; the bench measures one crash, repeatedly
            policy = replace(DEFAULT_POLICY, intensity=1000, reset_after=0.5)
            code = trio.run(lambda: run_tree(Path(home) / "chat.db", lambda: front, runners=1, spares=spares,
                                             spare_gate=gate, policy=policy))
            if code:
                raise SystemExit(f"the tree exited with {code}; logs in {home}/.omnigent/logs")
        finally:
            if old_home is not None:
                os.environ["HOME"] = old_home
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    mock, url = start_mock()
    os.environ.update(OPENAI_BASE_URL=f"{url}/v1", OPENAI_API_KEY="mock")
    try:
        for spares, label in ((0, "no spare (1 runner)"), (1, "warm spare (1 runner + 1 spare)")):
            f = measure(spares, args.rounds, url)
            print(f"{label}, {args.rounds} rounds:")
            print(f"  SIGKILL idle runner -> replacement online, session rebound: "
                  f"median {statistics.median(f['idle']):.3f} s (max {max(f['idle']):.3f})")
            print(f"  SIGKILL mid-turn -> answer shown: "
                  f"median {statistics.median(f['midturn']):.3f} s (max {max(f['midturn']):.3f})")
            print(f"  runner processes' memory (PSS): {f['runner_pss'][0]:.1f} MiB")
    finally:
        mock.terminate()
        mock.wait()


if __name__ == "__main__":
    main()
