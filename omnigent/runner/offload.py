"""Keep the openai SDK's request building off the runner's trio loop.

`client.responses.create(input=history)` first walks the whole request
through the SDK's TypedDict transform (`async_maybe_transform`): pure Python,
synchronous despite its name, about 0.5 s for a 1,000-item history and several
seconds on a loaded machine. On the loop it starves every other task, pongs
included, and the server then kills a live runner as hung (issue 7 §9;
scripts/bench_pings.py: 6.4 s of silence with 3 such turns at once under
load, 1.0 s with this). Here the transform runs in a worker thread: the loop
keeps getting the GIL every switch interval and answers pings meanwhile.

The SDK's own function is reused unchanged (only where it runs changes), and
only the two resources the harnesses call are touched. If a future SDK
renames them, nothing is patched and the runner says so once in its log.
"""

from __future__ import annotations

import functools
from typing import Any

import trio

_MODULES = ("openai.resources.responses.responses", "openai.resources.chat.completions.completions")


def install() -> list[str]:
    """Route the request transform of the harnesses' resources through a thread; returns what was patched."""
    import importlib

    from openai import _utils

    sync_transform = getattr(_utils, "maybe_transform", None)
    if sync_transform is None:
        return []

    async def transform_in_thread(data: Any, expected_type: Any) -> Any:
        return await trio.to_thread.run_sync(functools.partial(sync_transform, data, expected_type))

    patched = []
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "async_maybe_transform"):
            setattr(module, "async_maybe_transform", transform_in_thread)  # noqa: B010 (mypy: not every module has it)
            patched.append(name)
    return patched
