"""Who may connect as a runner id, deterministically (MockClock, memory channels).

The real server pieces (store, registry, turn service, `serve_runner`,
`_consume_host`) run in `open_harness` with a host of no runners; the
runners here are scripted peers on memory channels, so a test can make a
connection answer pings or fall silent at an exact virtual time.
"""

from __future__ import annotations

import math

import pytest
import trio

import protocol as p
from omnigent.link.runner_secrets import hash_secret, mint_secret
from omnigent.server.registry import AlreadyOnline, RunnerConn
from omnigent.server.runner_link import serve_runner
from tests.support.fake_runners import MemoryTransport, assistant_item, open_harness


class Peer:
    """One runner connection: the server's real `serve_runner` on one end, this script on the other."""

    def __init__(self, harness, runner_id: str, secret: str | None, *, answers_pings: bool = True,
                 reply: str = "real answer") -> None:
        self.harness = harness
        self.runner_id = runner_id
        self.secret = secret
        self.answers_pings = answers_pings
        self.reply = reply
        to_server, from_peer = trio.open_memory_channel[str](math.inf)
        to_peer, from_server = trio.open_memory_channel[str](math.inf)
        self.transport = MemoryTransport(to_peer, from_peer)
        self._out, self._in = to_server, from_server
        self.received: list[p.Frame] = []
        self.pinged: list[float] = []  # the virtual time of each Ping
        self.acked = False
        self.ack = trio.Event()
        self.served = trio.Event()     # serve_runner returned

    @property
    def turns(self) -> list[p.TurnStart]:
        return [f for f in self.received if isinstance(f, p.TurnStart)]

    def send(self, frame: p.Frame) -> None:
        self._out.send_nowait(p.encode(frame))

    def start(self) -> Peer:
        self.harness.nursery.start_soon(self._serve)
        self.harness.nursery.start_soon(self._run)
        return self

    async def _serve(self) -> None:
        try:
            await serve_runner(self.harness.state, self.runner_id, self.transport, self.secret)
        except* ConnectionError:
            pass
        finally:
            self.transport.abort()
            self.served.set()

    async def _run(self) -> None:
        self.send(p.Hello(runner_id=self.runner_id, pid=4242, protocol_version=p.PROTOCOL_VERSION,
                          harnesses=["fake"]))
        try:
            async for raw in self._in:
                frame = p.decode(raw)
                self.received.append(frame)
                if isinstance(frame, p.HelloAck):
                    self.acked = True
                    self.ack.set()
                elif isinstance(frame, p.Ping):
                    self.pinged.append(trio.current_time())
                    if self.answers_pings:
                        self.send(p.Pong(ts=frame.ts))
                elif isinstance(frame, p.TurnStart):
                    self.send(p.TurnCompleted(frame.turn_id, "resp_x", [assistant_item(self.reply)]))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def silence(self) -> None:
        self.answers_pings = False


def credential(harness, runner_id: str) -> str:
    """What a host does before a launch: mint the secret, post its hash over the link."""
    secret = mint_secret()
    harness.host_end.post(p.RunnerCredential(runner_id=runner_id, secret_hash=hash_secret(secret)))
    return secret


def explicit(harness, runner_id: str) -> str:
    """What `POST /v1/runners` does."""
    secret = mint_secret()
    assert harness.store.add_runner_credential(runner_id, hash_secret(secret), kind="explicit")
    return secret


async def online(harness, peer: Peer) -> None:
    await peer.ack.wait()
    assert harness.registry.online.get(peer.runner_id) is not None


async def answer_of(harness, session_id: str, text: str) -> str:
    turn = harness.post(session_id, text)
    last = terminal(await harness.until_terminal(session_id, turn["id"]), turn["id"])
    assert last["type"] == "response.completed", last
    return last["response"]["output"][0]["content"][0]["text"]


def terminal(seen, turn_id: str) -> dict:
    return next(s.event for s in seen if s.type in p.TERMINAL_EVENTS and s.event.get("turn_id") == turn_id)


async def test_a_client_dialling_a_live_id_without_its_secret_gets_4003_and_changes_nothing(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        real = Peer(h, "runner_real", credential(h, "runner_real")).start()
        await online(h, real)
        sid = h.new_session()
        for wrong in (None, "t", mint_secret()):  # none, the client token, a guess
            attacker = Peer(h, "runner_real", wrong).start()
            # a forged answer sent at once, whatever the server says
            attacker.send(p.TurnCompleted("turn_forged", "resp_forged", [assistant_item("forged")]))
            await attacker.served.wait()
            assert attacker.transport.close_code == 4003
            assert not attacker.acked and attacker.turns == []
            assert h.registry.online["runner_real"].pid == 4242 and not real.served.is_set()
        assert await answer_of(h, sid, "hi") == "real answer"
        assert [t.session_id for t in real.turns] == [sid]
        texts = [i["content"][0]["text"] for i in h.store.list_items(sid)]
        assert texts == ["hi", "real answer"]


async def test_a_reconnect_while_the_old_connection_answers_gets_4009(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        secret = credential(h, "runner_a")
        first = Peer(h, "runner_a", secret).start()
        await online(h, first)
        conn = h.registry.online["runner_a"]
        start = trio.current_time()
        second = Peer(h, "runner_a", secret).start()
        await second.served.wait()
        assert second.transport.close_code == 4009 and not second.acked
        assert trio.current_time() - start < 1.0  # the old one answered the probe at once
        assert h.registry.online["runner_a"] is conn and not first.served.is_set()


async def test_a_reconnect_replaces_a_connection_silent_for_one_second(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        secret = credential(h, "runner_a")
        first = Peer(h, "runner_a", secret).start()
        await online(h, first)
        sid = h.new_session()
        assert await answer_of(h, sid, "one") == "real answer"
        first.silence()
        start = trio.current_time()
        second = Peer(h, "runner_a", secret, reply="after the blip").start()
        await online(h, second)
        assert trio.current_time() - start == pytest.approx(1.0)
        assert h.registry.online["runner_a"] is not None
        await first.served.wait()  # the silent connection was dropped
        assert h.registry.online.get("runner_a") is not None  # ... and did not take the id with it
        assert await answer_of(h, sid, "two") == "after the blip"
        assert h.store.get_conversation(sid)["runner_id"] == "runner_a"  # no rebinding, no loss
        kinds = [s.type for s in h.watches[sid].seen]
        assert "session.runner.lost" not in kinds


async def test_a_runner_that_dials_before_its_credential_is_read_is_accepted(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        secret = mint_secret()
        early = Peer(h, "runner_early", secret).start()
        await trio.sleep(0.5)  # the host's frame is late
        assert not early.acked
        h.host_end.post(p.RunnerCredential(runner_id="runner_early", secret_hash=hash_secret(secret)))
        await online(h, early)
        # no credential ever: refused after the bounded wait
        start = trio.current_time()
        stray = Peer(h, "runner_stray", mint_secret()).start()
        await stray.served.wait()
        assert stray.transport.close_code == 4003
        assert trio.current_time() - start == pytest.approx(h.state.credential_wait)


async def test_a_revoked_secret_opens_nothing(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        secret = credential(h, "runner_gone")
        await h.settle()
        h.host_end.post(p.RunnerExited(runner_id="runner_gone", code=0, signal=None, reason="exited"))
        await h.settle()
        late = Peer(h, "runner_gone", secret).start()
        await late.served.wait()
        assert late.transport.close_code == 4003


async def test_an_online_explicit_runner_serves_only_sessions_bound_to_it(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0, runner_wait=5.0) as h:
        mine = Peer(h, "runner_mine", explicit(h, "runner_mine"), reply="explicit").start()
        await online(h, mine)
        assert h.registry.online["runner_mine"].explicit and h.registry.placeable() == []
        # only an explicit runner online: an unbound session waits, then fails; it is never placed there
        lonely = h.new_session()
        turn = h.post(lonely, "anyone?")
        failed = terminal(await h.until_terminal(lonely, turn["id"]), turn["id"])
        assert failed["error"]["code"] == "runner_unavailable"
        # a host runner comes: every unbound session goes there, the explicit one still gets none
        host = Peer(h, "runner_host", credential(h, "runner_host"), reply="placed").start()
        await online(h, host)
        for i in range(3):
            assert await answer_of(h, h.new_session(), f"q{i}") == "placed"
        assert mine.turns == []
        # bound by hand (PATCH runner_id), it serves that session
        bound = h.new_session()
        h.store.set_runner(bound, "runner_mine")
        assert await answer_of(h, bound, "for you") == "explicit"
        assert [t.session_id for t in mine.turns] == [bound]
        # when the host runner goes, its sessions are not rebound to the explicit runner
        moved = h.store.conversations_for_runner("runner_host")
        host.transport.abort()
        await host.served.wait()
        await trio.sleep(1)
        assert all(h.store.get_conversation(s)["runner_id"] != "runner_mine" for s in moved)


async def test_register_never_overwrites_an_online_id():
    from omnigent.server.registry import RunnerRegistry

    registry = RunnerRegistry()
    send, _ = trio.open_memory_channel[p.Frame](1)
    first = RunnerConn("runner_a", 1, [], send)
    registry.register(first)
    with pytest.raises(AlreadyOnline):
        registry.register(RunnerConn("runner_a", 2, [], send.clone()))
    assert registry.online["runner_a"] is first


def test_a_store_of_the_previous_release_gains_the_credentials_table(tmp_path):
    import shutil
    from pathlib import Path

    from omnigent.store import Store

    old = Path(__file__).resolve().parents[1] / "resources" / "stores" / "chat-0.1.0.db"
    shutil.copy(old, tmp_path / "chat.db")
    store = Store(tmp_path / "chat.db")
    try:
        assert len(store.list_conversations(limit=1000)) == 100
        assert store.add_runner_credential("runner_a", hash_secret("s"), kind="host")
        assert not store.add_runner_credential("runner_a", hash_secret("other"), kind="explicit")
        row = store.runner_credential("runner_a")
        assert (row["kind"], row["secret_hash"], row["revoked_at"]) == ("host", hash_secret("s"), None)
        store.revoke_runner_credential("runner_a")
        assert store.runner_credential("runner_a")["revoked_at"] is not None
        assert store.prune_runner_credentials(older_than=-1) == 1
        assert store.runner_credential("runner_a") is None
        with pytest.raises(ValueError):
            store.add_runner_credential("runner_b", "h", kind="admin")
    finally:
        store.close()


def test_the_credential_frame_carries_a_hash_and_decodes_strictly():
    frame = p.RunnerCredential(runner_id="runner_a", secret_hash=hash_secret("s"))
    assert p.decode(p.encode(frame)) == frame
    with pytest.raises(p.ProtocolError):
        p.decode('{"kind": "host.runner_credential", "runner_id": "runner_a", "secret": "s"}')
