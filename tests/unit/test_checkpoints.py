"""The server's WAL checkpointer (server/checkpoints.py), on a MockClock over a real store file."""

from __future__ import annotations

import trio

from omnigent.server.checkpoints import _Checkpointer
from omnigent.store import Store


def _looking(checkpointer: _Checkpointer, looks: list[float]) -> None:
    real = checkpointer._wal_size

    def recorded() -> int:
        looks.append(trio.current_time())
        return real()

    checkpointer._wal_size = recorded  # type: ignore[method-assign]


async def test_it_looks_every_half_second_while_written_and_every_second_when_not(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    checkpointer = _Checkpointer.start(store)
    assert checkpointer is not None
    looks: list[float] = []
    _looking(checkpointer, looks)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checkpointer.run)
        await trio.sleep(3.25)  # a first look at the first tick, then idle: on the whole seconds, the pings' ticks
        assert looks == [0.5, 1.0, 2.0, 3.0]
        store.create_conversation(agent_id=None)  # writes at 3.25 and 3.75: seen at the next look, 4.0
        await trio.sleep(0.5)
        store.create_conversation(agent_id=None)
        await trio.sleep(1.5)
        # from 4.0 every half second until a look finds nothing new (4.5), then the whole seconds again
        assert looks == [0.5, 1.0, 2.0, 3.0, 4.0, 4.5, 5.0]
        nursery.cancel_scope.cancel()
    checkpointer.stop()
    store.close()


async def test_a_wal_past_its_threshold_is_checkpointed_and_the_store_gets_its_own_back(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    checkpointer = _Checkpointer.start(store)
    assert checkpointer is not None
    assert store.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # taken over
    checkpointer.WAL_PAGES = 1
    copied: list[int] = []
    real = checkpointer._checkpoint

    def counted() -> None:
        real()
        copied.append(checkpointer._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[2])

    checkpointer._checkpoint = counted  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checkpointer.run)
        store.create_conversation(agent_id=None)
        await trio.sleep(1.25)
        nursery.cancel_scope.cancel()
    assert copied and copied[0] > 0  # every frame of the WAL is in the database file
    checkpointer.stop()
    assert store.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == checkpointer.WAL_PAGES
    store.close()
