"""The model retry policy (omnigent/runner/retry.py) through `harness.execute`.

Why: one 429 or 500 must not fail a turn, but a retry must never repeat an
answer that had begun, never hide a real error (400, 401), and never wait
longer than the window. The real openai client runs over
`httpx2.MockTransport` and every sleep is on trio's MockClock, so the
backoff, Retry-After and the window are checked without waiting.
"""

from __future__ import annotations

import email.utils
import random
import time
from typing import Any

import httpx2
import openai
import pytest
import trio

from omnigent.runner import harness, retry
from protocol import TurnCompleted, TurnFailed
from protocol import events as ev
from tests.unit.test_runner_harness import (
    ENV, Recorder, StubPool, chat_chunk, chat_finish, make_turn, responses_stream, sse, sse_response,
)


def status(code: int, message: str = "busy", headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.Response(code, json={"error": {"message": message, "type": "x"}}, headers=headers or {})


class Script:
    """A MockTransport handler answering each request with the next scripted step."""

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.calls: list[float] = []  # trio time of each request

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.calls.append(trio.current_time())
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise type(step)(str(step), request=request)
        return step


@pytest.fixture
async def scripted():
    clients: list[openai.AsyncOpenAI] = []

    def make(*steps: Any) -> tuple[Script, StubPool]:
        script = Script(*steps)
        clients.append(openai.AsyncOpenAI(api_key="x", base_url="http://mock/v1", max_retries=0,
                                          http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(script))))
        return script, StubPool(clients[-1])

    yield make
    for client in clients:
        await client.close()


def ok() -> httpx2.Response:
    return sse_response(responses_stream("fine", deltas=["fine"]))


def retries(rec: Recorder) -> list[dict[str, Any]]:
    return [f.event for f in rec.frames if f.event["type"] == ev.MODEL_RETRY]


async def run(pool: StubPool, env: dict[str, str] | None = None, harness_name: str = "openai-agents"):
    rec = Recorder()
    result = await harness.execute(pool, make_turn(harness_name), rec, env or ENV, rng=random.Random(7))
    return result, rec


async def test_429_with_retry_after_is_retried_after_that_wait_and_announced(autojump_clock, scripted):
    script, pool = scripted(status(429, headers={"retry-after": "2"}), ok())
    result, rec = await run(pool)
    assert isinstance(result, TurnCompleted)
    assert len(script.calls) == 2
    assert script.calls[1] - script.calls[0] == pytest.approx(2.0)
    [notice] = retries(rec)
    assert notice == {"type": ev.MODEL_RETRY, "turn_id": "turn_1", "error": "model error 429 (rate limited)",
                      "attempt": 2, "attempts": 3, "delay": 2.0}
    assert rec.types.index(ev.MODEL_RETRY) < rec.types.index(ev.TEXT_DELTA)


async def test_retry_after_ms_and_http_date_are_understood(autojump_clock, scripted):
    when = email.utils.formatdate(time.time() + 4, usegmt=True)
    script, pool = scripted(status(503, headers={"retry-after-ms": "1500"}), status(503, headers={"retry-after": when}),
                            ok())
    await run(pool)
    assert script.calls[1] - script.calls[0] == pytest.approx(1.5)
    assert 2.0 <= script.calls[2] - script.calls[1] <= 4.0  # a date: whole seconds, from the wall clock


async def test_5xx_backs_off_exponentially_with_jitter_then_gives_up_after_3_attempts(autojump_clock, scripted):
    script, pool = scripted(status(500, "mock failure"), status(502), status(503))
    result, rec = await run(pool)
    assert len(script.calls) == 3
    first, second = (b - a for a, b in zip(script.calls, script.calls[1:]))
    assert 0.5 <= first <= 1.0 and 1.0 <= second <= 2.0  # base 1 s, doubling, 50-100 % jitter
    assert [(n["attempt"], n["error"]) for n in retries(rec)] == [
        (2, "model error 500 (server error)"),
        (3, "model error 502 (server error)")]
    assert result == TurnFailed("turn_1", "model_error", "Error code: 503 - busy (gave up after 3 attempts)")


@pytest.mark.parametrize("code", [400, 401, 403, 404, 422])
async def test_other_4xx_are_not_retried(autojump_clock, scripted, code):
    script, pool = scripted(status(code, "no"))
    result, rec = await run(pool)
    assert len(script.calls) == 1 and retries(rec) == []
    assert result == TurnFailed("turn_1", "model_error", f"Error code: {code} - no")


@pytest.mark.parametrize("code", [408, 409])
async def test_408_and_409_are_retried(autojump_clock, scripted, code):
    script, pool = scripted(status(code), ok())
    result, _ = await run(pool)
    assert isinstance(result, TurnCompleted) and len(script.calls) == 2


async def test_connection_reset_and_timeout_before_output_are_retried(autojump_clock, scripted):
    script, pool = scripted(httpx2.ConnectError("refused"), httpx2.ReadTimeout("slow"), ok())
    result, rec = await run(pool)
    assert isinstance(result, TurnCompleted) and len(script.calls) == 3
    assert [n["error"] for n in retries(rec)] == ["model error: could not reach the model endpoint",
                                                 "model error: the request timed out"]


async def test_retry_after_beyond_the_window_is_not_waited_for(autojump_clock, scripted):
    script, pool = scripted(status(429, "slow down", headers={"retry-after": "60"}))
    result, rec = await run(pool)
    assert len(script.calls) == 1 and retries(rec) == []
    assert result.message == ("Error code: 429 - slow down (the server asked to retry after 60 s, "
                              "beyond the 20 s retry window)")


async def test_attempts_and_window_come_from_the_environment(autojump_clock, scripted):
    script, pool = scripted(*[status(500)] * 5, ok())
    result, rec = await run(pool, {**ENV, "OMNIGENT_MODEL_ATTEMPTS": "6", "OMNIGENT_MODEL_RETRY_WINDOW": "5"})
    # 1 + 2 + 4 s of backoff (jittered) run past 5 s: the window ends the retries first
    assert isinstance(result, TurnFailed) and "retry window" in result.message
    assert script.calls[-1] - script.calls[0] <= 5.0
    assert len(script.calls) == len(retries(rec)) + 1


async def test_no_retry_once_output_has_begun(autojump_clock, scripted):
    class Dropping(httpx2.AsyncByteStream):
        async def __aiter__(self):
            yield responses_stream("partial answer", deltas=["partial ", "ans"]).split(b"event: response.output_text.done")[0]
            raise httpx2.RemoteProtocolError("peer closed connection without sending complete message body")

    dropped = httpx2.Response(200, stream=Dropping(), headers={"content-type": "text/event-stream"})
    script, pool = scripted(dropped, ok())
    result, rec = await run(pool)
    assert len(script.calls) == 1 and retries(rec) == []
    assert isinstance(result, TurnFailed) and result.code == "stream_dropped"
    assert result.message == "the model's stream ended after 11 characters"
    [partial] = result.output
    assert partial["status"] == "incomplete" and partial["id"] == "msg_x"  # the endpoint's id, from output_item.added
    assert partial["content"][0]["text"] == "partial ans"


async def test_chat_stream_that_ends_without_finishing_keeps_the_partial(autojump_clock, scripted):
    script, pool = scripted(sse_response(sse([chat_chunk("half an")])))
    result, rec = await run(pool, harness_name="openai-chat")
    assert len(script.calls) == 1
    assert result.code == "stream_dropped" and result.message == "the model's stream ended after 7 characters"
    assert result.output[0]["content"][0]["text"] == "half an"


async def test_a_stream_that_ends_before_any_output_is_retried(autojump_clock, scripted):
    script, pool = scripted(sse_response(sse([])), sse_response(sse([chat_chunk("ok"), chat_finish()], done=True)))
    result, rec = await run(pool, harness_name="openai-chat")
    assert isinstance(result, TurnCompleted) and len(script.calls) == 2
    assert retries(rec)[0]["error"] == "model error: the stream ended before any output"


async def test_a_successful_call_is_exactly_one_request(autojump_clock, scripted):
    script, pool = scripted(ok())
    result, rec = await run(pool)
    assert isinstance(result, TurnCompleted) and len(script.calls) == 1 and retries(rec) == []


def test_policy_from_env_checks_values_in_one_line():
    assert retry.policy_from_env({}) == retry.RetryPolicy(attempts=3, window=20.0)
    assert retry.policy_from_env({"OMNIGENT_MODEL_ATTEMPTS": "1", "OMNIGENT_MODEL_RETRY_WINDOW": "2.5"}) == \
        retry.RetryPolicy(attempts=1, window=2.5)
    for env, message in [({"OMNIGENT_MODEL_ATTEMPTS": "two"}, "OMNIGENT_MODEL_ATTEMPTS must be a whole number"),
                         ({"OMNIGENT_MODEL_ATTEMPTS": "0"}, "OMNIGENT_MODEL_ATTEMPTS must be at least 1"),
                         ({"OMNIGENT_MODEL_RETRY_WINDOW": "-1"}, "OMNIGENT_MODEL_RETRY_WINDOW must be 0 or more"),
                         ({"OMNIGENT_MODEL_RETRY_WINDOW": "soon"}, "OMNIGENT_MODEL_RETRY_WINDOW must be a number")]:
        with pytest.raises(ValueError, match=message):
            retry.policy_from_env(env)


async def test_a_bad_setting_fails_the_turn_with_that_line(scripted):
    script, pool = scripted()
    result, _ = await run(pool, {**ENV, "OMNIGENT_MODEL_ATTEMPTS": "x"})
    assert result.code == "config_error" and "OMNIGENT_MODEL_ATTEMPTS" in result.message


async def test_the_jitter_generator_is_made_at_the_first_retry_and_only_once(autojump_clock, monkeypatch):
    """Seeding a generator (from os.urandom) for every model call was ~3 % of a runner's CPU a turn:
    a call that succeeds makes none, and retries share one per process."""
    made: list[random.Random] = []

    class Counted(random.Random):
        def __init__(self) -> None:
            super().__init__(0)
            made.append(self)

    monkeypatch.setattr(retry.random, "Random", Counted)
    retry._jitter.cache_clear()
    try:
        policy = retry.RetryPolicy(attempts=3, window=60.0)

        async def notify(step: Any) -> None:
            pass

        def transient(exc: BaseException) -> retry.Transient:
            return retry.Transient("busy")

        async def ok() -> str:
            return "answer"

        for _ in range(3):
            assert await retry.call_with_retries(ok, policy, classify=transient, output_started=lambda: False,
                                                 notify=notify) == "answer"
        assert made == []
        calls = 0

        async def every_other_busy() -> str:  # each run below: busy once, then the answer
            nonlocal calls
            calls += 1
            if calls % 2:
                raise RuntimeError("busy")
            return "answer"

        for _ in range(2):
            assert await retry.call_with_retries(every_other_busy, policy, classify=transient,
                                                 output_started=lambda: False, notify=notify) == "answer"
        assert calls == 4
        assert len(made) == 1
    finally:
        retry._jitter.cache_clear()
