"""Garbage collections a test can count: automatic ones off, the rest recorded."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def only_explicit_collections() -> Iterator[list[int]]:
    """The generation of each collection from here on, with CPython's automatic ones off, so
    that every one recorded was asked for (by `gc.collect` or an instrument). Restores the
    collector as it was."""
    seen: list[int] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    was_enabled = gc.isenabled()
    gc.disable()
    gc.collect()  # what is garbage now is not the test's
    gc.callbacks.append(record)
    try:
        yield seen
    finally:
        gc.callbacks.remove(record)
        if was_enabled:
            gc.enable()
