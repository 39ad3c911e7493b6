"""The mock LLM's paced streaming (`--token-ms`): a streamed answer sent as a model streams it.

Why: `scripts/bench_sessions.py --token-ms` measures the time to an answer's
first token against the floor's; that figure means something only if the mock
sends the first delta at once and each later one a token's time after the one
before, with nothing of the answer's end ahead of its last delta.
"""

from __future__ import annotations

import trio

from omnigent.testing import mock_llm, mock_llm_payloads as payloads


async def _chunks(frames: list[str], token_delay: float) -> list[tuple[float, str]]:
    start = trio.current_time()
    return [(trio.current_time() - start, chunk.decode()) async for chunk in mock_llm._paced(frames, token_delay)]


def _deltas(chunk: str) -> int:
    return chunk.count("event: response.output_text.delta\n")


async def test_the_first_delta_goes_at_once_and_each_later_one_a_token_later(autojump_clock):
    frames = payloads.response_sse_frames({"text": "one two three", "stream": True}, "m")
    chunks = await _chunks(frames, 0.25)
    assert [at for at, _ in chunks] == [0.0, 0.25, 0.5]
    assert [_deltas(chunk) for _, chunk in chunks] == [1, 1, 1]
    first, last = chunks[0][1], chunks[-1][1]
    assert first.startswith("event: response.created\n") and "response.output_item.added" in first
    assert "response.output_text.done" in last and "response.completed" in last  # the end comes with the last delta
    assert "".join(chunk for _, chunk in chunks) == "".join(frames)  # the same body, only paced


async def test_a_late_send_does_not_make_the_later_tokens_late(autojump_clock):
    # a mock busy with other streams sends a token late: the next ones keep their instants
    frames = payloads.response_sse_frames({"text": "one two three four", "stream": True}, "m")
    start, times = trio.current_time(), []
    async for _ in mock_llm._paced(frames, 0.25):
        times.append(trio.current_time() - start)
        if len(times) == 2:
            await trio.sleep(0.1)  # the second chunk's send took 0.1 s
    assert times == [0.0, 0.25, 0.5, 0.75]


async def test_an_answer_without_deltas_goes_whole_at_once(autojump_clock):
    frames = payloads.response_sse_frames({"text": "one two three"}, "m")
    assert await _chunks(frames, 0.25) == [(0.0, "".join(frames))]
