"""RestartTracker is pure: its delays and give-up decisions are checked without trio."""

import random

import pytest

from supervisor import RestartPolicy, RestartTracker


def crash_every(tracker: RestartTracker, lifetime: float, count: int) -> list[float | None]:
    """Drive the tracker like a supervisor would: run `lifetime`, exit, wait the delay."""
    now, delays = 0.0, []
    for _ in range(count):
        delay = tracker.on_exit(now, now + lifetime)
        delays.append(delay)
        if delay is None:
            break
        now += lifetime + delay
    return delays


def test_exact_exponential_delays_without_jitter():
    tracker = RestartTracker(RestartPolicy(base=0.5, factor=2, jitter=0, intensity=100))
    assert crash_every(tracker, 1.0, 5) == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_delay_is_capped():
    tracker = RestartTracker(RestartPolicy(base=1, factor=3, cap=10, jitter=0, forever=True))
    assert crash_every(tracker, 0.0, 6) == [1, 3, 9, 10, 10, 10]


def test_cap_holds_forever_without_overflow():
    tracker = RestartTracker(RestartPolicy(base=0.1, factor=2, cap=5, jitter=0, forever=True))
    delays = crash_every(tracker, 0.0, 3000)
    assert delays[-1] == 5 and len(delays) == 3000


def test_healthy_run_resets_backoff():
    tracker = RestartTracker(RestartPolicy(base=0.5, factor=2, jitter=0, reset_after=30, intensity=100))
    assert [tracker.on_exit(t, t + 1) for t in (0, 10, 20)] == [0.5, 1.0, 2.0]
    assert tracker.on_exit(100, 130) == 0.5  # ran exactly reset_after: healthy
    assert tracker.on_exit(131, 132) == 1.0
    assert tracker.on_exit(140, 169.9) == 2.0  # just short of healthy


def test_gives_up_on_more_than_intensity_exits_within_period():
    tracker = RestartTracker(RestartPolicy(base=0.5, factor=2, jitter=0, intensity=5, period=60))
    # exits at 1, 2.5, 4.5, 7.5, 12.5 are restarted; the sixth (21.5) is one too many
    assert crash_every(tracker, 1.0, 10) == [0.5, 1.0, 2.0, 4.0, 8.0, None]


def test_old_exits_leave_the_window():
    policy = RestartPolicy(base=1, factor=1, jitter=0, intensity=2, period=10, reset_after=1000)
    tracker = RestartTracker(policy)
    assert tracker.on_exit(0, 1) == 1
    assert tracker.on_exit(2, 3) == 1
    assert tracker.on_exit(10, 11) == 1  # the exit at 1 is exactly `period` old: out
    assert tracker.on_exit(11.5, 12) is None  # 3, 11, 12 within 10 s


def test_intensity_zero_never_restarts():
    assert RestartTracker(RestartPolicy(intensity=0)).on_exit(0, 100) is None


def test_forever_ignores_intensity():
    tracker = RestartTracker(RestartPolicy(base=0.01, cap=0.01, jitter=0, intensity=1, forever=True))
    assert crash_every(tracker, 0.0, 50) == [0.01] * 50


def test_jitter_stays_within_bounds_and_is_seeded():
    policy = RestartPolicy(base=1, factor=1, cap=1, jitter=0.1, forever=True)
    a = crash_every(RestartTracker(policy, random.Random(7)), 0.0, 200)
    b = crash_every(RestartTracker(policy, random.Random(7)), 0.0, 200)
    assert a == b
    assert all(0.9 <= d <= 1.1 for d in a)
    assert len(set(a)) > 100  # actually jittered


@pytest.mark.parametrize(
    "kwargs",
    [{"base": -1}, {"factor": 0.5}, {"jitter": 1.0}, {"jitter": -0.1}, {"intensity": -1}, {"period": 0}],
)
def test_nonsense_policies_are_refused(kwargs):
    with pytest.raises(ValueError):
        RestartPolicy(**kwargs)
