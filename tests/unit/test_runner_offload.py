"""The openai SDK's request transform runs in a worker thread, with the SDK's own result."""

from __future__ import annotations

import threading

import trio

from omnigent.runner import harness, offload  # noqa: F401  (harness: the resources the turns use)


async def test_the_request_transform_of_both_harnesses_runs_off_the_loop(monkeypatch):
    from openai import _utils
    from openai.resources.chat.completions import completions
    from openai.resources.responses import responses
    from openai.types.responses import response_create_params

    threads = []
    real = _utils.maybe_transform

    def spy(data, expected_type):
        threads.append(threading.current_thread())
        return real(data, expected_type)

    monkeypatch.setattr(_utils, "maybe_transform", spy)
    monkeypatch.setattr(responses, "async_maybe_transform", responses.async_maybe_transform)
    monkeypatch.setattr(completions, "async_maybe_transform", completions.async_maybe_transform)
    assert sorted(offload.install()) == sorted(offload._MODULES)

    params = {"model": "m", "input": [{"type": "message", "role": "user", "content": "hi"}], "stream": True}
    got = await responses.async_maybe_transform(params, response_create_params.ResponseCreateParamsStreaming)
    assert got == real(params, response_create_params.ResponseCreateParamsStreaming)
    assert threads and threads[0] is not threading.main_thread()
    await trio.lowlevel.checkpoint()
