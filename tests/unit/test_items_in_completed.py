"""A runner's last items in its TurnCompleted only (`items_in_completed`): the session's events unchanged.

Why: the runner sent each item's `response.output_item.done`, then the step's `TurnCompleted`
carrying the same items; one message a turn each way for nothing. A runner whose hello the
server acknowledges leaves those events out and says how many (`TurnCompleted.unannounced`);
the server publishes them as it stores the step. What a watcher sees and the store keeps must
be what a runner that sends them produces: the same scenario is run both ways and the stored
events compared. Real server pieces over fake runners, on an autojump MockClock.
"""

from __future__ import annotations

from typing import Any

import trio

from protocol import events as ev
from tests.support.fake_runners import RunnerScript, ToolScript, TurnScript, calls, open_harness

TIMEOUT = 120
READ = ("read_file", '{"path": "notes.txt"}')


def _shape(event: dict[str, Any]) -> tuple:
    """An event without what differs between runs (ids, times)."""
    item = event.get("item") or {}
    return (event["type"], event.get("step"), item.get("type"), item.get("name"), str(item.get("content")))


async def _events(tmp_path, name: str, fold: bool) -> tuple[list[tuple], Any]:
    path = tmp_path / name
    path.mkdir()
    script = RunnerScript(turns=(calls(READ, text="let me look"), TurnScript(text="read it"),
                                 TurnScript(text="plain")), tools=(ToolScript(output="A"),), item_events=True,
                          fold_items=fold)
    async with open_harness(path, [script], stored_events=True) as h:
        await h.online(1)
        sid = h.new_session(spec={"tools": ["read_file"], "permissions": "auto"}, workspace=str(path))
        for n in range(2):
            turn = h.post(sid, f"question {n}")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
        return [_shape(e) for e in h.store.read_events(sid, 0)], h


async def test_the_server_publishes_the_folded_items_where_the_runner_would_have(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        sent, by_runner = await _events(tmp_path, "sent", fold=False)
        folded, by_server = await _events(tmp_path, "folded", fold=True)
    [runner] = by_runner.processes
    [folding] = by_server.processes
    assert not runner.folds and folding.folds  # the server acknowledged only the runner that asked
    sent_items = [f for _, f in runner.sent if getattr(f, "event", {}).get("type") == ev.ITEM_DONE]
    assert len(sent_items) == 4 and not [f for _, f in folding.sent if getattr(f, "event", {}).get("type") == ev.ITEM_DONE]
    assert folded == sent
    # the call's item is out before its tool runs, the answer's before the step's usage
    types = [shape[0] for shape in folded]
    call = types.index(ev.ITEM_DONE, types.index(ev.TEXT_DELTA))
    assert folded[call + 1][2] == "function_call" and types[call + 2] == ev.USAGE
    assert types[-5:] == [ev.TEXT_DELTA, ev.ITEM_DONE, ev.USAGE, ev.COMPLETED, ev.SESSION_STATUS]
