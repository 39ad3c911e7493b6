"""The daemon's files (keys, identity, the liveness lock) and its control socket, without a daemon."""

from __future__ import annotations

import json

import pytest
import trio

from omnigent.host import control, records


@pytest.mark.parametrize("a,b", [
    ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
    ("HTTP://LocalHost:8080", "http://localhost:8080"),
    ("http://example.com:80/api/", "http://example.com/api"),
    ("https://example.com:443", "https://example.com"),
    ("http://[::1]:80/", "http://[::1]"),
    ("http://[::1]:8080", "http://[::1]:8080/"),
])
def test_one_server_one_key(a, b):
    assert records.normalize_url(a) == records.normalize_url(b)
    assert records.key_of(a) == records.key_of(b) and len(records.key_of(a)) == 16


def test_ipv6_keeps_brackets():
    assert records.normalize_url("http://[::1]:8080/") == "http://[::1]:8080"


def test_different_servers_different_keys():
    assert records.key_of("http://127.0.0.1:8080") != records.key_of("http://127.0.0.1:8081")


def test_paths_are_keyed_by_home(tmp_path):
    one = records.Paths.of(tmp_path / "a", "http://x:1")
    two = records.Paths.of(tmp_path / "b", "http://x:1")
    assert one.identity != two.identity and one.identity.name == two.identity.name
    assert one.pid_file == tmp_path / "a" / ".omnigent" / "host.pid"
    assert one.log_dir == tmp_path / "a" / ".omnigent" / "logs" / "host-daemon"


def test_identity_round_trip_private(tmp_path):
    paths = records.Paths.of(tmp_path, "http://x:1/")
    assert records.read_identity(paths) is None
    records.write_identity(paths, "host_1", "s3cret")
    assert records.read_identity(paths) == ("host_1", "s3cret")
    assert paths.identity.stat().st_mode & 0o777 == 0o600
    assert paths.identity.parent.stat().st_mode & 0o777 == 0o700
    assert json.loads(paths.identity.read_text())["server_url"] == "http://x:1"
    paths.identity.write_text("{torn")
    assert records.read_identity(paths) is None


def test_lock_says_who_is_alive(tmp_path):
    path = tmp_path / "d" / "k.lock"
    assert not path.exists() or not records.lock_held(path)
    lock = records.Lock(path)
    assert lock.try_acquire()
    assert records.lock_held(path)
    assert not records.Lock(path).try_acquire()  # a second holder, even in this process
    lock.release()
    assert not records.lock_held(path)


def test_clear_own_files_leaves_anothers(tmp_path):
    paths = records.Paths.of(tmp_path, "http://x:1")
    records.write_private(paths.record, json.dumps({"pid": 2}))
    records.write_pid_file(paths, 2)
    records.clear_own_files(paths, 1)
    assert paths.record.exists() and paths.pid_file.exists()
    records.clear_own_files(paths, 2)
    assert not paths.record.exists() and not paths.pid_file.exists()


@pytest.mark.parametrize("depth", [1, 12])  # 12: deeper than a sockaddr_un holds
async def test_control_socket_round_trip(tmp_path, depth):
    folder = tmp_path.joinpath(*["d" * 9] * depth)
    folder.mkdir(parents=True)
    path = folder / "c.sock"

    async def handler(request):
        if request["op"] == "no":
            raise control.ControlError("refused")
        return {"ok": True, "echo": request}

    async with trio.open_nursery() as nursery:
        await nursery.start(control.serve, path, handler)
        assert path.stat().st_mode & 0o777 == 0o600
        answer = await control.request(path, {"op": "hello", "x": 1})
        assert answer == {"ok": True, "echo": {"op": "hello", "x": 1}}
        with pytest.raises(control.ControlError, match="refused"):
            await control.request(path, {"op": "no"})
        # malformed lines get an answer, and the connection stays usable
        with control._address(path) as address:
            stream = await trio.open_unix_socket(address)
        async with stream:
            await stream.send_all(b"not json\n[1]\n")
            data = b""
            while data.count(b"\n") < 2:
                data += await stream.receive_some(4096)
        first, second = (json.loads(line) for line in data.splitlines())
        assert first["ok"] is False and second["ok"] is False
        nursery.cancel_scope.cancel()
    assert not path.exists()


async def test_control_request_without_a_daemon(tmp_path):
    with pytest.raises(control.ControlError, match="cannot reach"):
        await control.request(tmp_path / "none.sock", {"op": "hello"})
