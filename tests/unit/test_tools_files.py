"""The file tools at their edges, and the workspace confinement (symlinks, `..`, races)."""

from __future__ import annotations

import json
import os
import threading

import pytest

from omnigent.tools import ToolContext, preview, run_tool
from omnigent.tools import files as files_mod
from omnigent.tools import paths
from omnigent.tools.paths import PathError, Workspace

OUTSIDE_TEXT = "outside-secret-content\n"


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "outside.txt").write_text(OUTSIDE_TEXT)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "o.txt").write_text(OUTSIDE_TEXT)
    return root


async def call(ws, name, **args):
    return await run_tool(name, json.dumps(args), ToolContext(str(ws), 10.0, {}, []))


# --- arguments ------------------------------------------------------------------------

async def test_model_mistakes_are_errors_not_exceptions(ws):
    ctx = ToolContext(str(ws), 10.0, {}, [])
    bad = await run_tool("read_file", "{not json", ctx)
    assert bad.status == "error" and "not valid JSON" in bad.output
    assert (await run_tool("read_file", "[1, 2]", ctx)).status == "error"
    unknown = await run_tool("rm_rf", "{}", ctx)
    assert unknown.status == "error" and "unknown tool" in unknown.output
    missing = await call(ws, "read_file")
    assert missing.status == "error" and "missing argument 'path'" in missing.output
    assert (await call(ws, "read_file", path="a", offset="x")).status == "error"
    assert (await call(ws, "shell", command="true", timeout_s=-1)).status == "error"


# --- confinement -------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["../outside.txt", "a/../../outside.txt", "..", "/etc/passwd",
                                  "../ws/../outside.txt"])
async def test_paths_outside_are_refused(ws, path):
    for tool, extra in [("read_file", {}), ("write_file", {"content": "x"}), ("list_dir", {}),
                        ("grep", {"pattern": "."}),
                        ("edit_file", {"old_string": "outside", "new_string": "x"})]:
        out = await call(ws, tool, path=path, **extra)
        assert out.status == "error" and "outside the workspace" in out.output, (tool, out)
    assert (ws.parent / "outside.txt").read_text() == OUTSIDE_TEXT


async def test_absolute_paths_inside_and_dotdot_inside_are_fine(ws):
    (ws / "a").mkdir()
    (ws / "b.txt").write_text("bee\n")
    assert (await call(ws, "read_file", path=str(ws / "b.txt"))).output == "     1\tbee"
    assert (await call(ws, "read_file", path="a/../b.txt")).output == "     1\tbee"
    assert (await call(ws, "read_file", path="./a/./../b.txt")).status == "completed"


async def test_workspace_given_through_a_symlink_works(ws):
    link = ws.parent / "ws-link"
    link.symlink_to(ws)
    (ws / "f").write_text("x\n")
    ctx = ToolContext(str(link), 10.0, {}, [])
    assert (await run_tool("read_file", json.dumps({"path": str(link / "f")}), ctx)).status == "completed"
    assert (await run_tool("read_file", json.dumps({"path": str(ws / "f")}), ctx)).status == "completed"


async def test_symlinks_are_refused_with_a_reason(ws):
    (ws / "to-file").symlink_to(ws.parent / "outside.txt")
    (ws / "to-dir").symlink_to(ws.parent / "outside")
    (ws / "inner").write_text("in\n")
    (ws / "to-inner").symlink_to("inner")  # even one that stays inside: refused, simply
    for path in ["to-file", "to-dir/o.txt", "to-inner"]:
        out = await call(ws, "read_file", path=path)
        assert out.status == "error" and "symbolic link" in out.output, out
    assert "symbolic link" in (await call(ws, "list_dir", path="to-dir")).output
    wrote = await call(ws, "write_file", path="to-file", content="pwned")
    assert wrote.status == "error" and "symbolic link" in wrote.output
    assert (await call(ws, "write_file", path="to-dir/new.txt", content="pwned")).status == "error"
    assert not (ws.parent / "outside" / "new.txt").exists()
    edited = await call(ws, "edit_file", path="to-file", old_string="outside", new_string="x")
    assert edited.status == "error"
    assert (ws.parent / "outside.txt").read_text() == OUTSIDE_TEXT


def test_a_file_swapped_for_a_symlink_after_the_check_is_not_followed(ws, monkeypatch):
    """The race the issue names: the path checks out, then shell swaps in a symlink before the open."""
    (ws / "notes.txt").write_text("harmless\n")
    real_parts = paths.relative_parts

    def check_then_swap(workspace, path):
        parts = real_parts(workspace, path)  # the lexical check passes ...
        os.unlink(ws / "notes.txt")          # ... and then the file becomes a symlink out
        os.symlink("/etc/passwd", ws / "notes.txt")
        return parts

    monkeypatch.setattr(files_mod, "relative_parts", check_then_swap)
    with pytest.raises(PathError, match="symbolic link"):
        files_mod.read_file(Workspace(str(ws)), {"path": "notes.txt"})


def test_a_directory_swapped_for_a_symlink_mid_walk_is_not_followed(ws, monkeypatch):
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "f.txt").write_text("inside\n")
    real_open = os.open
    swapped = []

    def open_then_swap(name, flags, *args, **kwargs):
        fd = real_open(name, flags, *args, **kwargs)
        if name == "a" and not swapped:  # we hold a/; now b becomes a symlink out
            swapped.append(1)
            os.rename(ws / "a" / "b", ws.parent / "b-moved")
            os.symlink(ws.parent / "outside", ws / "a" / "b")
        return fd

    monkeypatch.setattr(paths.os, "open", open_then_swap)
    with pytest.raises(PathError, match="symbolic link"):
        files_mod.read_file(Workspace(str(ws)), {"path": "a/b/o.txt"})
    assert swapped


def test_a_directory_moved_out_while_held_is_caught_by_the_fd_recheck(ws, monkeypatch):
    (ws / "a").mkdir()
    (ws / "a" / "f.txt").write_text("inside\n")
    real_open = os.open

    def open_then_move(name, flags, *args, **kwargs):
        fd = real_open(name, flags, *args, **kwargs)
        if name == "a":  # we hold a/ ... and it is moved outside the workspace
            os.rename(ws / "a", ws.parent / "outside" / "a")
        return fd

    monkeypatch.setattr(paths.os, "open", open_then_move)
    with pytest.raises(PathError, match="resolves outside the workspace"):
        files_mod.read_file(Workspace(str(ws)), {"path": "a/f.txt"})


def test_write_never_goes_through_a_symlink_swapped_in_before_the_rename(ws, monkeypatch):
    (ws / "target.txt").write_text("old\n")
    real_target = files_mod._target

    def check_then_swap(wsp, dir_fd, name, shown):
        st = real_target(wsp, dir_fd, name, shown)  # a regular file when checked ...
        os.unlink(ws / "target.txt")                 # ... a symlink out when written
        os.symlink(ws.parent / "outside.txt", ws / "target.txt")
        return st

    monkeypatch.setattr(files_mod, "_target", check_then_swap)
    files_mod.write_file(Workspace(str(ws)), {"path": "target.txt", "content": "new\n"})
    assert (ws.parent / "outside.txt").read_text() == OUTSIDE_TEXT
    assert not (ws / "target.txt").is_symlink() and (ws / "target.txt").read_text() == "new\n"


async def test_write_through_a_hard_link_does_not_change_the_other_name(ws):
    os.link(ws.parent / "outside.txt", ws / "hard.txt")
    assert (await call(ws, "write_file", path="hard.txt", content="new\n")).status == "completed"
    assert (ws.parent / "outside.txt").read_text() == OUTSIDE_TEXT


def test_swapping_races_never_leak_the_outside_file(ws):
    """A real race: a thread flips a name between a file and a symlink out while reads go on."""
    (ws / "flip-real").write_text("inside\n")
    stop = threading.Event()

    def flipper():
        while not stop.is_set():
            try:
                os.symlink(ws.parent / "outside.txt", ws / "tmp-link")
                os.replace(ws / "tmp-link", ws / "flip")
                os.link(ws / "flip-real", ws / "tmp-hard")
                os.replace(ws / "tmp-hard", ws / "flip")
            except OSError:
                pass

    thread = threading.Thread(target=flipper)
    thread.start()
    try:
        w = Workspace(str(ws))
        outcomes = set()
        for _ in range(300):
            try:
                out = files_mod.read_file(w, {"path": "flip"})
                outcomes.add("read")
                assert "outside-secret" not in out
            except PathError as exc:
                outcomes.add("refused")
                assert "outside-secret" not in str(exc)
    finally:
        stop.set()
        thread.join()
    assert outcomes  # both usually happen; never the outside content


# --- read_file ------------------------------------------------------------------------------

async def test_read_numbers_lines_with_offset_and_limit(ws):
    (ws / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    out = await call(ws, "read_file", path="f.txt", offset=3, limit=2)
    assert out.output == "     3\tline 3\n     4\tline 4\n[lines 3-4 shown; the file goes on: read on with offset=5]"
    assert (await call(ws, "read_file", path="f.txt", offset=10)).output == "    10\tline 10"
    past = await call(ws, "read_file", path="f.txt", offset=11)
    assert "past the end of the file (10 lines)" in past.output
    assert (await call(ws, "read_file", path="f.txt", offset=0)).status == "error"


async def test_read_caps_at_2000_lines_and_256_kib(ws):
    (ws / "many.txt").write_text("x\n" * 2500)
    out = (await call(ws, "read_file", path="many.txt", limit=5000)).output
    assert out.count("\n") == 2000 and out.endswith("read on with offset=2001]")
    (ws / "wide.txt").write_text(("y" * 1000 + "\n") * 1000)
    wide = (await call(ws, "read_file", path="wide.txt")).output
    assert len(wide.encode()) <= 256 * 1024 + 200 and "256 KiB cap" in wide
    (ws / "one.txt").write_text("z" * (600 * 1024))
    one = (await call(ws, "read_file", path="one.txt")).output
    assert len(one.encode()) <= 256 * 1024 + 200 and "line 1 cut at the 256 KiB cap" in one


async def test_read_edges(ws):
    (ws / "empty").write_text("")
    assert (await call(ws, "read_file", path="empty")).output == "empty: (empty file)"
    (ws / "bin").write_bytes(b"\x7fELF\x00\x01\x02")
    assert "binary file" in (await call(ws, "read_file", path="bin")).output
    (ws / "d").mkdir()
    assert "is a directory" in (await call(ws, "read_file", path="d")).output
    assert "no such file" in (await call(ws, "read_file", path="nope")).output
    os.mkfifo(ws / "fifo")
    assert "not a regular file" in (await call(ws, "read_file", path="fifo")).output  # and no hang
    (ws / "latin").write_bytes(b"caf\xe9\n")
    assert (await call(ws, "read_file", path="latin")).output == "     1\tcaf\ufffd"


# --- write_file / edit_file ---------------------------------------------------------------------

async def test_write_creates_parents_and_replaces_keeping_the_mode(ws):
    out = await call(ws, "write_file", path="new/deep/f.sh", content="echo 1\n")
    assert out.output == "wrote 7 bytes to new/deep/f.sh (created)"
    os.chmod(ws / "new/deep/f.sh", 0o750)
    out = await call(ws, "write_file", path="new/deep/f.sh", content="echo 2\n")
    assert out.output.endswith("(replaced)") and (ws / "new/deep/f.sh").read_text() == "echo 2\n"
    assert os.stat(ws / "new/deep/f.sh").st_mode & 0o777 == 0o750
    assert [p.name for p in (ws / "new/deep").iterdir()] == ["f.sh"]  # no temporary left


async def test_write_cap_and_refusals(ws):
    big = await call(ws, "write_file", path="big", content="x" * (1024 * 1024 + 1))
    assert big.status == "error" and "at most 1 MiB" in big.output and not (ws / "big").exists()
    assert (await call(ws, "write_file", path="ok", content="x" * (1024 * 1024))).status == "completed"
    (ws / "d").mkdir()
    assert "is a directory" in (await call(ws, "write_file", path="d", content="x")).output
    assert (await call(ws, "write_file", path=".", content="x")).status == "error"
    (ws / "file").write_text("")
    assert "not a directory" in (await call(ws, "write_file", path="file/x", content="x")).output


async def test_edit_needs_exactly_one_match(ws):
    (ws / "e.py").write_text("a = 1\nb = 2\na = 1\n")
    two = await call(ws, "edit_file", path="e.py", old_string="a = 1", new_string="a = 3")
    assert two.status == "error" and "matches 2 times" in two.output
    none = await call(ws, "edit_file", path="e.py", old_string="c = 3", new_string="x")
    assert none.status == "error" and "not found" in none.output
    one = await call(ws, "edit_file", path="e.py", old_string="b = 2\na", new_string="b = 5\na")
    assert one.output == "edited e.py: replaced 1 occurrence at line 2"
    assert (ws / "e.py").read_text() == "a = 1\nb = 5\na = 1\n"
    assert (await call(ws, "edit_file", path="e.py", old_string="", new_string="x")).status == "error"
    assert (await call(ws, "edit_file", path="missing", old_string="a", new_string="b")).status == "error"


async def test_edit_keeps_bytes_that_are_not_utf8(ws):
    (ws / "raw").write_bytes(b"\xff\xfe key = 1\n")
    assert (await call(ws, "edit_file", path="raw", old_string="key = 1", new_string="key = 2")).status == "completed"
    assert (ws / "raw").read_bytes() == b"\xff\xfe key = 2\n"


async def test_preview_is_the_diff_and_changes_nothing(ws):
    (ws / "p.txt").write_text("one\ntwo\n")
    diff = await preview("edit_file", json.dumps({"path": "p.txt", "old_string": "two", "new_string": "2"}), str(ws))
    assert "-two\n+2\n" in diff and diff.startswith("--- a/p.txt\n+++ b/p.txt\n")
    new = await preview("write_file", json.dumps({"path": "n/q.txt", "content": "hi\n"}), str(ws))
    assert "--- /dev/null" in new and "+hi" in new
    assert (ws / "p.txt").read_text() == "one\ntwo\n" and not (ws / "n").exists()
    assert await preview("edit_file", json.dumps({"path": "p.txt", "old_string": "zzz", "new_string": "2"}), str(ws)) == ""
    assert await preview("shell", "{}", str(ws)) == ""
    assert await preview("write_file", json.dumps({"path": "../x", "content": ""}), str(ws)) == ""
    (ws / "to-dir").symlink_to(ws.parent / "outside")  # the write would be refused: no diff either
    assert await preview("write_file", json.dumps({"path": "to-dir/x", "content": "a"}), str(ws)) == ""


# --- list_dir / grep --------------------------------------------------------------------------------

async def test_list_dir_types_and_symlinks_not_followed(ws):
    (ws / "sub").mkdir()
    (ws / "f.txt").write_text("12345")
    (ws / "out").symlink_to(ws.parent / "outside")
    out = (await call(ws, "list_dir")).output
    assert out.splitlines() == [
        "./: 3 entries",
        "file     f.txt (5 B)",
        f"symlink  out -> {ws.parent / 'outside'} (not followed)",
        "dir      sub/",
    ]
    assert (await call(ws, "list_dir", path="sub")).output == "sub/: (empty directory)"
    assert "not a directory" in (await call(ws, "list_dir", path="f.txt")).output


async def test_list_dir_cap(ws):
    for i in range(1005):
        (ws / f"f{i:04}").write_text("")
    out = (await call(ws, "list_dir")).output
    assert out.count("\n") == 1001 and out.endswith("[... 5 more entries not shown (1,000 entry cap)]")


async def test_grep_matches_globs_and_skips(ws):
    (ws / "src").mkdir()
    (ws / "src" / "a.py").write_text("import os\nx = 1\n")
    (ws / "src" / "b.txt").write_text("import nothing\n")
    (ws / "bin.dat").write_bytes(b"import\x00binary")
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("import git\n")
    (ws / "link-out").symlink_to(ws.parent / "outside")
    (ws / "link-file").symlink_to(ws.parent / "outside.txt")
    out = (await call(ws, "grep", pattern=r"^import")).output
    assert out.splitlines() == ["src/a.py:1:import os", "src/b.txt:1:import nothing"]
    assert (await call(ws, "grep", pattern="import", glob="*.py")).output == "src/a.py:1:import os"
    assert (await call(ws, "grep", pattern="x =", path="src/a.py")).output == "src/a.py:2:x = 1"
    assert (await call(ws, "grep", pattern="outside-secret")).output.startswith("no matches")
    assert "symbolic link" in (await call(ws, "grep", pattern=".", path="link-out")).output
    bad = await call(ws, "grep", pattern="(")
    assert bad.status == "error" and "invalid regular expression" in bad.output


async def test_grep_caps_at_500_matches(ws):
    (ws / "m.txt").write_text("hit\n" * 700)
    out = (await call(ws, "grep", pattern="hit")).output
    assert out.count("m.txt:") == 500 and out.endswith("[stopped at 500 matches; narrow the pattern, the path or the glob]")


async def test_a_read_only_tool_that_takes_too_long_times_out(ws, monkeypatch):
    import time as _time

    from omnigent.tools import search

    real_file = search._Search.file

    def slow_file(self, *args):
        _time.sleep(0.05)
        return real_file(self, *args)

    monkeypatch.setattr(search._Search, "file", slow_file)
    for i in range(100):
        (ws / f"f{i}").write_text("x\n")
    out = await run_tool("grep", json.dumps({"pattern": "x"}), ToolContext(str(ws), 0.2, {}, []))
    assert out.status == "timeout" and out.output == "grep timed out after 0.2 s"
