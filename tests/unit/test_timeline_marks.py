"""The timeline's points (`OMNIGENT_TIMELINE`): written only when asked for, private, and a point
stamped earlier is written with the moment it was stamped (and no counts, which are the
moment of writing's)."""

from __future__ import annotations

import os
import stat

from omnigent.config import timeline


def test_no_timeline_writes_nothing_and_stamps_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv(timeline.ENV_VAR, raising=False)
    assert timeline.stamp() is None
    timeline.mark("turn.stored:t1")
    timeline.mark("turn.entered:t1", at=1.0)
    assert list(tmp_path.iterdir()) == []


def test_a_point_stamped_earlier_keeps_its_moment_and_carries_no_counts(monkeypatch, tmp_path):
    path = tmp_path / "timeline"
    monkeypatch.setenv(timeline.ENV_VAR, str(path))
    monkeypatch.setattr(timeline, "_counts", {"sql": 7, "steps": 3})
    entered = timeline.stamp()
    assert entered is not None
    timeline.mark("turn.stored:t1")
    timeline.mark("turn.entered:t1", at=entered)
    stored, early = path.read_text().splitlines()
    name, at, pid, *counts = stored.split()
    assert (name, int(pid), counts) == ("turn.stored:t1", os.getpid(), ["sql=7", "steps=3"])
    assert early.split() == ["turn.entered:t1", f"{entered:.6f}", str(os.getpid())]
    assert entered <= float(at)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
