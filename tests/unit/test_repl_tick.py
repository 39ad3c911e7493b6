"""The REPL's status tick (MockClock): once a second of a running turn, never between turns.

An idle REPL at its prompt should not wake for a status line it does not show."""

from __future__ import annotations

import pytest
import trio

from omnigent.repl.options import FrontOptions
from omnigent.repl.repl import Repl


class _Lines:
    interactive = True

    def shown_prompt(self) -> str | None:
        return None


async def test_the_status_ticks_once_a_second_of_a_turn_and_sleeps_between_turns(autojump_clock):
    repl = Repl(None, FrontOptions(agent_path="agent.yaml", agent_name="a", bundle=b""), None, _Lines())  # type: ignore[arg-type]
    ticks: list[float] = []
    repl.console.tick = lambda: ticks.append(trio.current_time())  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(repl._tick)
        await trio.sleep(10.3)
        assert ticks == []  # no turn: never woken
        repl._turn_started()
        await trio.sleep(2.5)
        assert ticks == pytest.approx([11.3, 12.3])  # each whole second of the turn
        repl.console.turn_ended()
        await trio.sleep(10)
        assert ticks == pytest.approx([11.3, 12.3])  # the second under way when it ended draws nothing
        repl._turn_started()
        await trio.sleep(1.25)
        assert ticks == pytest.approx([11.3, 12.3, 23.8])  # the next turn's first second
        nursery.cancel_scope.cancel()
