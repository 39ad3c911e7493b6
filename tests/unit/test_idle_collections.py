"""`collector.idle_collections`: a loop about to wait with nothing to run collects the generation
CPython would have collected, once its young generation is far enough along; a busy loop does not."""

from __future__ import annotations

import gc

import pytest
import trio

from omnigent.config import collector
from tests.support.collections import only_explicit_collections


class _FakeGc:
    def __init__(self, counts: tuple[int, int, int]) -> None:
        self.counts = counts
        self.collected: list[int] = []

    def get_count(self) -> tuple[int, int, int]:
        return self.counts

    def collect(self, generation: int) -> int:
        self.collected.append(generation)
        return 0


def _after_wait(monkeypatch: pytest.MonkeyPatch, counts: tuple[int, int, int], timeout: float) -> list[int]:
    fake = _FakeGc(counts)
    monkeypatch.setattr(collector, "gc", fake)
    collector.idle_collections().before_io_wait(timeout)
    return fake.collected


@pytest.mark.parametrize(("counts", "generation"), [
    ((collector.IDLE_AT, 0, 0), 0),
    ((collector.IDLE_AT, collector.THRESHOLDS[1], 0), 0),  # CPython collects a generation past its threshold
    ((collector.IDLE_AT, collector.THRESHOLDS[1] + 1, 0), 1),
    ((collector.IDLE_AT, collector.THRESHOLDS[1] + 1, collector.THRESHOLDS[2] + 1), 2),
    ((collector.IDLE_AT, 0, collector.THRESHOLDS[2] + 1), 2),
])
def test_a_waiting_loop_collects_the_generation_cpython_would(monkeypatch: pytest.MonkeyPatch,
                                                              counts: tuple[int, int, int], generation: int) -> None:
    assert _after_wait(monkeypatch, counts, 1.0) == [generation]


def test_nothing_is_collected_before_the_young_generation_is_far_enough_along(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _after_wait(monkeypatch, (collector.IDLE_AT - 1, 5, 99), 1.0) == []


def test_a_loop_with_a_task_to_run_or_a_deadline_near_does_not_collect(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _after_wait(monkeypatch, (collector.IDLE_AT, 0, 0), 0.0) == []
    assert _after_wait(monkeypatch, (collector.IDLE_AT, 0, 0), collector.IDLE_WAIT / 2) == []


async def test_in_a_trio_run_the_collection_happens_while_the_loop_waits() -> None:
    instrument = collector.idle_collections()
    with only_explicit_collections() as collections:
        trio.lowlevel.add_instrument(instrument)
        try:
            kept = [[] for _ in range(collector.IDLE_AT + 100)]  # young tracked containers, alive
            await trio.lowlevel.checkpoint()  # runnable at once: no wait, no collection
            assert collections == []
            await trio.sleep(collector.IDLE_WAIT * 4)  # the loop waits with nothing to run
            assert collections == [0]
            assert gc.get_count()[0] < collector.IDLE_AT
            del kept
        finally:
            trio.lowlevel.remove_instrument(instrument)
