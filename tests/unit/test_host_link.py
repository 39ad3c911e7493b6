"""The host link and host affinity, deterministically (MockClock, memory channels).

The real server pieces (`open_harness` with an in-process host of no
runners) plus the real `serve_host` for remote hosts; hosts and runners here
are scripted peers on memory channels, so a test can make a host fall
silent, drop, come back, at an exact virtual time.
"""

from __future__ import annotations

import math

import trio

import protocol as p
from omnigent.link.runner_secrets import hash_secret, mint_secret
from omnigent.server.host_link import revoke_host, serve_host
from omnigent.server.registry import LOCAL_HOST
from tests.support.fake_runners import MemoryTransport, open_harness
from tests.unit.test_runner_credentials import Peer, answer_of, terminal


def register(h, **kw) -> tuple[str, str]:
    """What `POST /v1/hosts` does."""
    secret = mint_secret()
    row = h.store.create_host(hash_secret(secret), **kw)
    return row["id"], secret


class HostPeer:
    """One host link: the server's real `serve_host` on one end, this script on the other."""

    def __init__(self, h, host_id: str, secret: str | None, *, hello: p.Frame | None = None,
                 roots: list[str] = (), answers_pings: bool = True, runners: list[str] = ()) -> None:
        self.h = h
        self.host_id = host_id
        self.secret = secret
        self.hello = hello if hello is not None else p.HostHello(
            host_id=host_id, pid=77, protocol_version=p.PROTOCOL_VERSION, workspace_roots=list(roots),
            runners=list(runners))
        self.answers_pings = answers_pings
        to_server, from_peer = trio.open_memory_channel[str](math.inf)
        to_peer, from_server = trio.open_memory_channel[str](math.inf)
        self.transport = MemoryTransport(to_peer, from_peer)
        self._out, self._in = to_server, from_server
        self.received: list[p.Frame] = []
        self.ack: p.HostHelloAck | None = None
        self.acked = trio.Event()
        self.served = trio.Event()
        self.runners: list[Peer] = []

    def send(self, frame: p.Frame) -> None:
        self._out.send_nowait(p.encode(frame))

    def start(self) -> HostPeer:
        self.h.nursery.start_soon(self._serve)
        self.h.nursery.start_soon(self._run)
        return self

    async def _serve(self) -> None:
        try:
            await serve_host(self.h.state, self.host_id, self.transport, self.secret)
        except* ConnectionError:
            pass
        finally:
            self.transport.abort()
            self.served.set()

    async def _run(self) -> None:
        if self.hello is not False:
            self.send(self.hello)
        try:
            async for raw in self._in:
                frame = p.decode(raw)
                self.received.append(frame)
                if isinstance(frame, p.HostHelloAck):
                    self.ack = frame
                    self.acked.set()
                elif isinstance(frame, p.Ping) and self.answers_pings:
                    self.send(p.Pong(ts=frame.ts))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def drop(self) -> None:
        """The host's process is gone: its link ends."""
        self._out.close()

    async def launch(self, runner_id: str, reply: str = "real answer") -> Peer:
        """What a host does: the credential on its link first, then the runner dials with its secret."""
        secret = mint_secret()
        self.send(p.RunnerCredential(runner_id=runner_id, secret_hash=hash_secret(secret)))
        self.send(p.RunnerLaunched(runner_id=runner_id, pid=900 + len(self.runners)))
        peer = Peer(self.h, runner_id, secret, reply=reply).start()
        await peer.ack.wait()
        self.runners.append(peer)
        return peer

    def of_kind(self, cls) -> list[p.Frame]:
        return [f for f in self.received if isinstance(f, cls)]


async def linked(h, host_id: str, secret: str, **kw) -> HostPeer:
    peer = HostPeer(h, host_id, secret, **kw).start()
    await peer.acked.wait()
    return peer


def kill(peer: Peer) -> None:
    """A runner process dies: its connection drops."""
    peer.transport.abort()


# --- the link -----------------------------------------------------------------------


async def test_wrong_missing_or_revoked_secret_is_4003_and_leaves_the_live_link_alone(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        host_id, secret = register(h)
        live = await linked(h, host_id, secret)
        for wrong in (None, "", "t", mint_secret()):
            intruder = HostPeer(h, host_id, wrong).start()
            await intruder.served.wait()
            assert intruder.transport.close_code == 4003 and intruder.ack is None
        assert h.registry.hosts[host_id].generation == live.ack.generation == 1
        assert not live.served.is_set()
        unknown = HostPeer(h, "host_" + "0" * 32, secret).start()
        await unknown.served.wait()
        assert unknown.transport.close_code == 4003
        h.store.revoke_host(host_id)
        again = HostPeer(h, host_id, secret).start()
        await again.served.wait()
        assert again.transport.close_code == 4003


async def test_hello_ack_bumps_the_generation_and_a_second_link_replaces_the_first(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        host_id, secret = register(h)
        first = await linked(h, host_id, secret, roots=["/srv"])
        assert first.ack.generation == 1 and first.ack.ping_interval == h.state.ping_interval
        assert h.store.get_host(host_id)["workspace_roots"] == ["/srv"]
        second = await linked(h, host_id, secret)
        await first.served.wait()
        assert first.transport.close_code == 4009
        assert second.ack.generation == 2 == h.store.get_host(host_id)["generation"]
        assert h.registry.hosts[host_id].generation == 2 and not second.served.is_set()


async def test_a_bad_first_frame_or_none_closes_the_link(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        host_id, secret = register(h)
        other = HostPeer(h, host_id, secret, hello=p.HostHello(host_id="host_other", pid=1,
                                                               protocol_version=p.PROTOCOL_VERSION)).start()
        await other.served.wait()
        assert other.transport.close_code == 4000
        runner_hello = HostPeer(h, host_id, secret, hello=p.Hello(runner_id="runner_x", pid=1,
                                                                  protocol_version=p.PROTOCOL_VERSION,
                                                                  harnesses=[])).start()
        await runner_hello.served.wait()
        assert runner_hello.transport.close_code == 4000
        start = trio.current_time()
        silent = HostPeer(h, host_id, secret, hello=False).start()
        await silent.served.wait()
        assert silent.transport.close_code == 4008
        assert trio.current_time() - start == h.state.hello_timeout
        assert h.store.get_host(host_id)["generation"] == 0  # nothing was accepted


async def test_a_host_may_not_send_server_frames(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        host_id, secret = register(h)
        peer = await linked(h, host_id, secret)
        peer.send(p.LaunchRunner(request_id="r1"))
        await peer.served.wait()
        assert peer.transport.close_code == 4000
        assert host_id not in h.registry.hosts


async def test_a_host_that_stops_answering_pings_is_offline(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0, ping_interval=1.0, ping_allowance=3.0) as h:
        host_id, secret = register(h)
        peer = await linked(h, host_id, secret)
        await trio.sleep(10)
        assert not peer.served.is_set()  # answering: stays
        peer.answers_pings = False
        silent_from = trio.current_time()
        await peer.served.wait()
        assert peer.transport.close_code == 4008
        assert 3.0 <= trio.current_time() - silent_from <= 5.0
        assert host_id not in h.registry.hosts
        assert h.registry.host_left_at[host_id] == trio.current_time()


async def test_frames_go_only_to_the_host_that_launched_the_runner(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        a_id, a_secret = register(h, name="a")
        b_id, b_secret = register(h, name="b")
        a, b = await linked(h, a_id, a_secret), await linked(h, b_id, b_secret)
        await a.launch("runner_a1")
        await h.settle()
        assert [f.runner_id for f in a.of_kind(p.RunnerOnline)] == ["runner_a1"]
        assert b.of_kind(p.RunnerOnline) == []
        assert h.registry.host_of("runner_a1") == a_id and h.registry.host_runners(a_id) == ["runner_a1"]
        h.state.host_events.kill_runner("runner_a1", "hung")
        await h.settle()
        assert [f.runner_id for f in a.of_kind(p.KillRunner)] == ["runner_a1"] and b.of_kind(p.KillRunner) == []
        # a host cannot speak for another host's runner
        b.send(p.RunnerExited(runner_id="runner_a1", code=0, signal=None, reason="exited with code 0"))
        await h.settle()
        assert "runner_a1" in h.registry.online


async def test_a_reconnecting_host_reclaims_only_its_own_runners(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        a_id, a_secret = register(h)
        b_id, b_secret = register(h)
        a = await linked(h, a_id, a_secret)
        await a.launch("runner_a1")
        h.registry.runner_host.clear()  # as after a server restart: only the store remembers
        await linked(h, b_id, b_secret, runners=["runner_a1"])
        assert h.registry.host_of("runner_a1") == LOCAL_HOST  # b's claim is not believed
        await linked(h, a_id, a_secret, runners=["runner_a1"])
        assert h.registry.host_of("runner_a1") == a_id
        # run_server also looks the host up in the store, for a runner back before its host
        h.registry.runner_host.clear()
        h.registry._host_lookup = h.store.runner_host
        assert h.registry.host_of("runner_a1") == a_id and h.registry.host_of("runner_unknown") == LOCAL_HOST


# --- placement and affinity ----------------------------------------------------------


async def test_a_pinned_session_runs_only_on_its_host_an_unpinned_one_on_the_least_loaded(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        a_id, a_secret = register(h)
        b_id, b_secret = register(h)
        a, b = await linked(h, a_id, a_secret), await linked(h, b_id, b_secret, roots=["/work/shared"])
        await a.launch("runner_a1", reply="from a")
        await b.launch("runner_b1", reply="from b")
        pinned = [h.new_session() for _ in range(3)]
        for sid in pinned:
            h.store.set_conversation_host(sid, a_id)
            assert await answer_of(h, sid, "hi") == "from a"
        free = h.new_session()
        assert await answer_of(h, free, "hi") == "from b"  # a has 3 sessions, b none
        # pinned to a, but in a workspace b declared: b may take it
        shared = h.new_session()
        h.store.set_conversation_host(shared, a_id, workspace="/work/shared/repo")
        assert await answer_of(h, shared, "hi") == "from b"
        # a workspace with no host: the in-process host or a host declaring a root for it
        elsewhere = h.new_session()
        h.store.update_conversation(elsewhere, workspace="/home/x/proj")
        turn = h.post(elsewhere, "hi")
        last = terminal(await h.until_terminal(elsewhere, turn["id"]), turn["id"])
        assert last["error"]["code"] == "runner_unavailable"


async def test_when_a_host_dies_its_unpinned_sessions_move_and_pinned_ones_wait(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0, runner_wait=5.0) as h:
        h.registry.host_grace = 10.0
        a_id, a_secret = register(h)
        b_id, b_secret = register(h)
        a, b = await linked(h, a_id, a_secret), await linked(h, b_id, b_secret)
        a1 = await a.launch("runner_a1", reply="from a")
        free = h.new_session()
        pinned = h.new_session()
        h.store.set_conversation_host(pinned, a_id)
        assert await answer_of(h, free, "one") == "from a"
        assert await answer_of(h, pinned, "one") == "from a"
        await b.launch("runner_b1", reply="from b")
        a.drop()
        kill(a1)
        await a.served.wait()
        await h.until(lambda: "runner_a1" not in h.registry.online)
        assert await answer_of(h, free, "two") == "from b"
        turn = h.post(pinned, "two")
        last = terminal(await h.until_terminal(pinned, turn["id"]), turn["id"])
        assert last["type"] == "response.failed"
        assert last["error"]["code"] == "host_unavailable" and a_id in last["error"]["message"]
        # it waited out the host's grace (10 s), longer than OMNIGENT_RUNNER_WAIT (5 s)
        assert trio.current_time() == h.registry.host_left_at[a_id] + 10.0
        assert h.store.get_conversation(pinned)["runner_id"] == "runner_a1"  # never moved to b


async def test_a_pinned_session_goes_on_when_its_host_comes_back_within_the_grace(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0, runner_wait=5.0) as h:
        a_id, a_secret = register(h)
        b_id, b_secret = register(h)
        a, b = await linked(h, a_id, a_secret), await linked(h, b_id, b_secret)
        a1 = await a.launch("runner_a1", reply="from a")
        await b.launch("runner_b1", reply="from b")
        pinned = h.new_session()
        h.store.set_conversation_host(pinned, a_id)
        assert await answer_of(h, pinned, "one") == "from a"
        a.drop()
        kill(a1)
        await a.served.wait()
        turn = h.post(pinned, "two")

        async def come_back() -> None:
            await trio.sleep(7)  # past the runner wait, inside the grace
            again = await linked(h, a_id, a_secret)
            await again.launch("runner_a2", reply="a again")

        h.nursery.start_soon(come_back)
        last = terminal(await h.until_terminal(pinned, turn["id"]), turn["id"])
        assert last["type"] == "response.completed"
        assert last["response"]["output"][0]["content"][0]["text"] == "a again"
        assert h.store.get_conversation(pinned)["runner_id"] == "runner_a2"


async def test_a_pinned_session_of_a_host_that_is_up_but_has_no_runner_is_runner_unavailable(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0, runner_wait=5.0) as h:
        a_id, a_secret = register(h)
        await linked(h, a_id, a_secret)
        pinned = h.new_session()
        h.store.set_conversation_host(pinned, a_id)
        start = trio.current_time()
        turn = h.post(pinned, "hi")
        last = terminal(await h.until_terminal(pinned, turn["id"]), turn["id"])
        assert last["error"]["code"] == "runner_unavailable"
        assert trio.current_time() - start == 5.0


async def test_revoking_a_host_closes_its_link_and_moves_its_sessions(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        a_id, a_secret = register(h)
        b_id, b_secret = register(h)
        a, b = await linked(h, a_id, a_secret), await linked(h, b_id, b_secret)
        a1 = await a.launch("runner_a1", reply="from a")
        sid = h.new_session()
        assert await answer_of(h, sid, "one") == "from a"
        await b.launch("runner_b1", reply="from b")
        revoke_host(h.state, a_id)
        await a.served.wait()
        await a1.served.wait()
        assert a.transport.close_code == 4003
        assert h.store.runner_credential("runner_a1")["revoked_at"] is not None
        assert await answer_of(h, sid, "two") == "from b"
        back = Peer(h, "runner_a1", a1.secret).start()  # its secret opens nothing now
        await back.served.wait()
        assert back.transport.close_code == 4003 and not b.served.is_set()


def test_a_store_of_the_previous_release_gains_hosts_and_session_hosts(tmp_path):
    import shutil
    import sqlite3
    from pathlib import Path

    from omnigent.store import Store

    old = Path(__file__).resolve().parents[1] / "resources" / "stores" / "chat-0.1.0.db"
    shutil.copy(old, tmp_path / "chat.db")
    store = Store(tmp_path / "chat.db")
    try:
        convs = store.list_conversations(limit=1000)
        assert len(convs) == 100
        assert all(store.conversation_host(c["id"]) is None for c in convs)
        row = store.create_host(hash_secret("s"), name="n", workspace_roots=["/w"], capacity=3)
        assert (row["name"], row["workspace_roots"], row["capacity"], row["generation"]) == ("n", ["/w"], 3, 0)
        assert store.accept_host_link(row["id"]) == 1 and store.accept_host_link(row["id"], capacity=5) == 2
        assert store.get_host(row["id"])["capacity"] == 5
        store.set_conversation_host(convs[0]["id"], row["id"], workspace="/w/x")
        assert store.conversation_host(convs[0]["id"]) == row["id"]
        assert store.get_conversation(convs[0]["id"])["workspace"] == "/w/x"
        assert [h["id"] for h in store.list_hosts()] == [row["id"]]
        assert store.revoke_host(row["id"]) and not store.revoke_host(row["id"])
        assert store.list_hosts() == [] and store.get_host(row["id"])["revoked_at"] is not None
    finally:
        store.close()
    con = sqlite3.connect(tmp_path / "chat.db")
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        con.close()


async def test_a_host_back_after_a_blip_hears_which_of_its_runners_are_online(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        a_id, a_secret = register(h)
        a = await linked(h, a_id, a_secret)
        secret = mint_secret()
        a.send(p.RunnerCredential(runner_id="runner_a1", secret_hash=hash_secret(secret)))
        await h.settle()
        a.drop()  # the link blips before the runner says hello: that RunnerOnline goes nowhere
        await a.served.wait()
        runner = Peer(h, "runner_a1", secret).start()
        await runner.ack.wait()
        again = await linked(h, a_id, a_secret, runners=["runner_a1"])
        await h.settle()
        assert [f.runner_id for f in again.of_kind(p.RunnerOnline)] == ["runner_a1"]
