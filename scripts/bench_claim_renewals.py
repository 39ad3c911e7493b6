"""What keeping claims costs a process: renewal statements and CPU, as many turns run at once (issue 10).

Why: each running turn holds its conversation's claim (`server/claims.py`), whose lease is
renewed every 2 s. A loaded server runs many turns, and slower ones, so what a renewal costs
is paid most when there is least to spare. This measures it directly, without the rest of a
server: `Claims` on a real store, the real clock, `--claims` claims each held `--hold` s inside
`Claims.renewed`, their starts spread over 2 s as a busy server's turns are.

Printed, per hold: the lease renewals written (`UPDATE conversation_claims` statements) and the
CPU of the whole run (entering and leaving `renewed`, the releases, the renewals), each also
per claim, and the CPU as a ratio to the floor (`python -c "import openai, trio"`, timed in the
same run before and after). A hold shorter than 2 s renews nothing: what is left is the cost of
holding a claim at all. Prints figures; asserts nothing.

Run it in a checkout of another commit (`PYTHONPATH=that checkout`) to compare; a `Claims`
without `renew_in` (before one renewer served them all) is driven as it was.

    python scripts/bench_claim_renewals.py                  # 100 claims, held 10 s and 1 s
    python scripts/bench_claim_renewals.py --claims 1000 --hold 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run import floor_seconds  # noqa: E402  (a sibling script)

from omnigent.server.claims import LEASE, RENEW_EVERY, Claims  # noqa: E402
from omnigent.store import Store  # noqa: E402


async def measure(claims_n: int, hold: float, tmp: Path) -> tuple[int, float]:
    """(lease renewals written, CPU seconds) for `claims_n` claims each held `hold` s."""
    with Store(tmp / "chat.db") as store:
        claims = Claims(store)
        sessions = [store.create_conversation(agent_id=None)["id"] for _ in range(claims_n)]
        for n, sid in enumerate(sessions):
            assert store.claim_conversation(sid, claims.owner, turn_id=f"turn_{n}", lease=LEASE)
        renewals = [0]

        def count(sql: str) -> None:
            renewals[0] += sql.startswith("UPDATE conversation_claims")

        store.conn.set_trace_callback(count)
        started = time.process_time()
        async with trio.open_nursery() as nursery:
            if hasattr(claims, "renew_in"):
                claims.renew_in(nursery)

            async def held(n: int, sid: str) -> None:
                await trio.sleep(n * RENEW_EVERY / claims_n)  # spread as a busy server's turns start
                async with claims.renewed(sid, f"turn_{n}"):
                    await trio.sleep(hold)

            for n, sid in enumerate(sessions):
                nursery.start_soon(held, n, sid)
        cpu = time.process_time() - started
        store.conn.set_trace_callback(None)
    return renewals[0], cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--hold", type=float, action="append",
                        help="seconds each claim is held (repeatable; default: 10 and 1)")
    args = parser.parse_args()
    holds = args.hold or [10.0, 1.0]
    before = floor_seconds()
    rows = []
    for hold in holds:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append((hold, *trio.run(measure, args.claims, hold, Path(tmp))))
    floor = (before + floor_seconds()) / 2
    print(f"floor (python -c 'import openai, trio'): {floor * 1000:.0f} ms (three runs before and three after, "
          "medians averaged)")
    print(f"{args.claims} claims, their starts spread over {RENEW_EVERY:g} s, each held inside Claims.renewed")
    print("| held | renewals written | per claim | CPU of the run (× floor) | CPU per claim |")
    print("| --- | --- | --- | --- | --- |")
    for hold, renewals, cpu in rows:
        print(f"| {hold:g} s | {renewals} | {renewals / args.claims:.2f} | {cpu * 1000:.0f} ms ({cpu / floor:.3f}×) "
              f"| {cpu / args.claims * 1000:.2f} ms ({cpu / args.claims / floor:.1e}×) |")


if __name__ == "__main__":
    main()
