"""Server restarts, link drops and moved sessions under seeded schedules (tests/sim/restart_sim.py).

    SIM_SEED=12 .venv/bin/python -m pytest -q tests/sim -k restart     # that seed alone, verbose
    SIM_RESTART_SEEDS=500 .venv/bin/python -m pytest -q tests/sim -k restart
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from .restart_sim import Outcome, run_seed

DEFAULT_SEEDS = int(os.environ.get("SIM_RESTART_SEEDS", "20"))  # the slow pass runs 1,000
SLOW_SEEDS = 1000


def _run(seeds: range) -> None:
    failed: list[Outcome] = []
    totals: Counter = Counter()
    for seed in seeds:
        outcome = run_seed(seed)
        totals += outcome.counts
        if outcome.violations:
            failed.append(outcome)
    print(f"\nrestart seeds {seeds.start}..{seeds.stop - 1}: "
          + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))
    if failed:
        shown = "\n\n".join(o.report() for o in failed[:5])
        pytest.fail(f"{len(failed)} of {len(seeds)} seeds broke an invariant "
                    f"(first: {[o.plan.seed for o in failed[:20]]}):\n\n{shown}", pytrace=False)


def test_restart_seeds(capsys: pytest.CaptureFixture[str]) -> None:
    only = os.environ.get("SIM_SEED")
    if only is None:
        _run(range(DEFAULT_SEEDS))
        return
    outcome = run_seed(int(only))
    with capsys.disabled():
        print(f"\n{outcome.plan.describe()}\nfingerprint {outcome.fingerprint}")
        for entry in outcome.trace:
            print("  ", entry)
    assert not outcome.violations, outcome.report()


@pytest.mark.slow
def test_many_restart_seeds() -> None:
    _run(range(DEFAULT_SEEDS, DEFAULT_SEEDS + SLOW_SEEDS))


def test_a_restart_seed_reruns_identically() -> None:
    for seed in (1, 7, 23):
        first, second = run_seed(seed), run_seed(seed)
        assert first.trace == second.trace, f"seed {seed} diverged"
        assert first.violations == second.violations
