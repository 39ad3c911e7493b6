"""Incremental histories between the server and the runner that served a session's last step.

Why: sending the whole conversation with every model step is O(n) per step.
The server sends a runner that holds the session's last history (its hello
announced `history_cache`) only what is new, named against the runner's copy
by a length and a hash chain link; everything else gets the full history: a
runner that never asked, a rebinding, a runner lost and replaced, a copy the
runner no longer holds (it says so, and the step goes again in full without
a second model call). Whatever the runner was sent, the history it hands its
harness must be exactly the one a runner without the cache gets: the same
scenario is run both ways and the histories compared as bytes.

Real server pieces and host over fake runners (tests/support/fake_runners.py)
that keep their copy in the real `runner/history_cache.py`, on an autojump
MockClock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import trio

from protocol import events as ev
from tests.support.fake_runners import RunnerScript, ToolScript, TurnScript, calls, open_harness

TIMEOUT = 120
CACHE = 64 * 1024 * 1024
READ = ("read_file", '{"path": "notes.txt"}')
_MINTED = re.compile(rb"msg_[0-9a-f]{32}|call_[0-9a-f]{6}")


def _with_cache(script: RunnerScript, cache: int | None) -> RunnerScript:
    return RunnerScript(**{**script.__dict__, "history_cache": cache})


async def _scenario(tmp_path, scripts: Sequence[RunnerScript], prompts: int, cache: int | None,
                    name: str, *, permissions: str = "auto") -> tuple[list[bytes], Any]:
    """Run `prompts` turns; the whole histories the runners' harness got, as bytes, and the harness.

    Under "ask", every even-numbered approval is allowed, every odd one denied, as they come."""
    path = tmp_path / name
    path.mkdir()
    scripts = [_with_cache(s, cache) for s in scripts]
    async with open_harness(path, scripts, default=_with_cache(RunnerScript(), cache)) as h:
        await h.online(1)
        sid = h.new_session(spec={"tools": ["read_file", "write_file"], "permissions": permissions},
                            workspace=str(path))
        h.nursery.start_soon(_answer_approvals, h, sid)
        for n in range(prompts):
            turn = h.post(sid, f"question {n}")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
        got = [(t, json.dumps(start.input).encode()) for proc in h.processes for t, start in proc.turns_received]
        return _same_ids([body for _, body in sorted(got, key=lambda g: g[0])]), h


async def _answer_approvals(h, sid: str) -> None:
    watch, answered = h.watches[sid], 0
    while True:
        asked = [s.event for s in watch.seen if s.type == ev.APPROVAL_REQUESTED]
        for event in asked[answered:]:
            decision = "allow" if answered % 2 == 0 else "deny"
            assert h.store.resolve_approval(event["approval_id"], decision, "test") is not None
            h.turns.approval_answered(sid, event["approval_id"])
            answered += 1
        await watch.changed.wait()


def _same_ids(bodies: list[bytes]) -> list[bytes]:
    """Ids minted per run (item ids, call ids made of turn ids) numbered in order of appearance."""
    names: dict[bytes, bytes] = {}

    def name(match: re.Match[bytes]) -> bytes:
        return names.setdefault(match.group(0), b"id%d" % len(names))

    return [_MINTED.sub(name, body) for body in bodies]


async def _both_ways(tmp_path, scripts: Sequence[RunnerScript], prompts: int, cache: int = CACHE, **how: Any):
    with trio.fail_after(TIMEOUT):
        plain, _ = await _scenario(tmp_path, scripts, prompts, None, "plain", **how)
        cached, h = await _scenario(tmp_path, scripts, prompts, cache, "cached", **how)
    assert cached == plain  # the model gets exactly the same history, step by step
    return h


def _raw(h) -> list[tuple[int, int, int, int]]:
    """Every TurnStart as sent: (process, step, history_from, items carried)."""
    return [(proc.index, s.step, s.history_from, len(s.input)) for proc in h.processes for s in proc.raw_turns]


async def test_later_turns_on_the_same_runner_carry_only_what_is_new(autojump_clock, tmp_path):
    h = await _both_ways(tmp_path, [RunnerScript()], prompts=5)
    assert _raw(h) == [(0, 0, 0, 1), (0, 0, 1, 2), (0, 0, 3, 2), (0, 0, 5, 2), (0, 0, 7, 2)]
    assert h.processes[0].history.hits == 4


async def test_tool_steps_carry_their_new_items_only(autojump_clock, tmp_path):
    script = RunnerScript(turns=(calls(READ), TurnScript(text="read it"), calls(READ, READ),
                                 TurnScript(text="both")), tools=(ToolScript(output="A"),))
    h = await _both_ways(tmp_path, [script], prompts=2)
    # turn 1: its call and output come after the message; turn 2: the answer, the message, two calls
    assert _raw(h) == [(0, 0, 0, 1), (0, 2, 1, 2), (0, 0, 3, 2), (0, 3, 5, 4)]


async def test_a_failed_turn_rewritten_into_the_next_resends_from_the_settled_part(autojump_clock, tmp_path):
    script = RunnerScript(turns=(TurnScript(), TurnScript("fail"), TurnScript(), TurnScript()))
    h = await _both_ways(tmp_path, [script], prompts=4)
    # turn 3's message is merged into turn 2's (which failed): the copy's last item is not the start of
    # the next history, so the base goes back to what was settled (q0 and its answer)
    assert _raw(h) == [(0, 0, 0, 1), (0, 0, 1, 2), (0, 0, 2, 1), (0, 0, 3, 2)]


async def test_a_runner_that_lost_its_copy_says_so_and_the_step_goes_again_in_full(autojump_clock, tmp_path):
    h = await _both_ways(tmp_path, [RunnerScript()], prompts=3, cache=0)  # nothing fits: every delta misses
    assert _raw(h) == [(0, 0, 0, 1), (0, 0, 1, 2), (0, 0, 0, 3), (0, 0, 3, 2), (0, 0, 0, 5)]
    assert h.model_steps() == [(0, 0, 1)] * 3  # one model call per step: a miss calls none
    assert h.processes[0].history.misses == 2


async def test_a_replacement_runner_and_a_rebinding_get_the_full_history(autojump_clock, tmp_path):
    dies = RunnerScript(turns=(TurnScript(), TurnScript(), TurnScript("die", after=0.5)))
    h = await _both_ways(tmp_path, [dies, RunnerScript()], prompts=4)
    assert _raw(h) == [(0, 0, 0, 1), (0, 0, 1, 2), (0, 0, 3, 2),   # the third dies mid-call
                       (1, 0, 0, 5),                                # its retry, on the new runner: in full
                       (1, 0, 5, 2)]


async def test_a_runner_that_does_not_announce_the_cache_gets_full_histories(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        _, h = await _scenario(tmp_path, [RunnerScript()], 3, None, "plain")
    assert _raw(h) == [(0, 0, 0, 1), (0, 0, 0, 3), (0, 0, 0, 5)]


async def test_approved_and_denied_calls_carry_their_outputs_as_deltas(autojump_clock, tmp_path):
    write = ("write_file", '{"path": "x.txt", "content": "x"}')
    script = RunnerScript(turns=(calls(write), TurnScript(text="wrote it"), calls(write), TurnScript(text="no")),
                          tools=(ToolScript(output="written"),))
    h = await _both_ways(tmp_path, [script], prompts=3, permissions="ask")
    assert _raw(h) == [(0, 0, 0, 1), (0, 2, 1, 2), (0, 0, 3, 2), (0, 2, 5, 2), (0, 0, 7, 2)]
    outputs = [i["output"] for i in h.processes[0].turns_received[-1][1].input
               if i.get("type") == "function_call_output"]
    assert outputs[0] == "written" and "not approved" in outputs[1]
