"""Stdin as context for `-p`: which stdin is read, the wait for a first byte, one message."""

from __future__ import annotations

import os
import pty
import socket

import pytest
import trio

from omnigent.repl.stdin import (
    MAX_CONTEXT,
    StdinContext,
    StdinError,
    compose,
    fence_for,
    kind,
    read_prompt,
    timeout_from_env,
)

SHORT = 0.2  # the 2 s default, made short as OMNIGENT_STDIN_TIMEOUT would


def test_only_a_pipe_or_a_regular_file_is_read(tmp_path):
    r, w = os.pipe()
    path = tmp_path / "f"
    path.write_text("x")
    master, slave = pty.openpty()
    a, b = socket.socketpair()
    with open(path) as f, open(os.devnull) as null:
        try:
            assert kind(r) == "pipe"
            assert kind(f.fileno()) == "file"
            assert kind(null.fileno()) is None  # /dev/null: never read
            assert kind(slave) is None           # a terminal: never read
            assert kind(a.fileno()) is None
        finally:
            for fd in (r, w, master, slave):
                os.close(fd)
            a.close()
            b.close()
    assert kind(r) is None  # closed


async def test_a_pipe_is_read_to_eof_and_empty_stdin_adds_nothing():
    for data, expected in ((b"diff --git a b\n+x\n", "diff --git a b\n+x\n"), (b"", None), (b" \n\t\n", None),
                           (b"caf\xc3\xa9 \xff", "café \ufffd")):
        r, w = os.pipe()
        os.write(w, data)
        os.close(w)
        try:
            assert await StdinContext(fd=r, timeout=SHORT).read() == (expected, None)
        finally:
            os.close(r)


async def test_an_idle_pipe_is_given_up_after_the_timeout_with_one_note():
    r, w = os.pipe()  # the writer stays open and silent, as a test harness leaves it
    try:
        start = trio.current_time()
        context, note = await StdinContext(fd=r, timeout=SHORT, started=start).read()
        assert context is None
        assert note.startswith("omnigent: nothing arrived on stdin within 0.2 s; going on without it")
        assert "\n" not in note
        assert os.get_blocking(r)  # the fd's blocking flag is put back
    finally:
        os.close(r)
        os.close(w)


async def test_the_wait_counts_from_the_start_of_the_run():
    r, w = os.pipe()
    try:
        # started long ago: the deadline is past, so nothing more is waited for
        context, note = await StdinContext(fd=r, timeout=SHORT, started=trio.current_time() - 10).read()
        assert context is None and note is not None
    finally:
        os.close(r)
        os.close(w)


async def test_what_came_during_a_slow_start_up_still_counts():
    r, w = os.pipe()
    try:
        os.write(w, b"+ added line\n")  # piped at once, but the run took longer than the wait to start
        os.close(w)
        w = -1
        context, note = await StdinContext(fd=r, timeout=SHORT, started=trio.current_time() - 10).read()
        assert (context, note) == ("+ added line\n", None)
    finally:
        os.close(r)
        if w != -1:
            os.close(w)


async def test_after_the_first_byte_a_slow_writer_is_waited_for():
    r, w = os.pipe()

    async def slow_writer():
        os.write(w, b"first ")
        await trio.sleep(SHORT * 2)  # longer than the timeout: it only bounds the first byte
        os.write(w, b"second\n")
        os.close(w)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_writer)
            assert await StdinContext(fd=r, timeout=SHORT).read() == ("first second\n", None)
    finally:
        os.close(r)


async def test_a_regular_file_is_read_and_too_much_is_one_clear_error(tmp_path):
    path = tmp_path / "ctx"
    path.write_text("from a file\n")
    with open(path) as f:
        assert await StdinContext(fd=f.fileno()).read() == ("from a file\n", None)
    path.write_bytes(b"x" * (MAX_CONTEXT + 1))
    with open(path) as f:
        with pytest.raises(StdinError, match="more than 768 KiB"):
            await StdinContext(fd=f.fileno()).read()


def test_context_and_prompt_are_one_message_with_the_context_fenced():
    assert compose("a\nb", "review this") == "```\na\nb\n```\n\nreview this"
    assert compose(None, "p") == "p" and compose("  \n", "p") == "p"
    # a fence inside the context cannot close the block early
    assert fence_for("x ``` y ```` z") == "`````"
    assert compose("```py\n1\n```\n", "p").startswith("````\n```py\n")


def test_the_timeout_comes_from_the_environment():
    assert timeout_from_env({}) == 2.0
    assert timeout_from_env({"OMNIGENT_STDIN_TIMEOUT": "0.25"}) == 0.25
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(StdinError, match="OMNIGENT_STDIN_TIMEOUT"):
            timeout_from_env({"OMNIGENT_STDIN_TIMEOUT": bad})


def test_dash_p_dash_reads_the_whole_prompt():
    r, w = os.pipe()
    os.write(w, b"the prompt\nsecond line\n")
    os.close(w)
    try:
        assert read_prompt(r) == "the prompt\nsecond line"
    finally:
        os.close(r)
