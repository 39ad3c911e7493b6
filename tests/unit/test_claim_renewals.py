"""`Claims`: one renewer keeps every claim this process holds, whatever their number.

Under `MockClock(autojump_threshold=0)`, the store on the same virtual clock: a lease runs out
exactly when the test's time says so.
"""

from __future__ import annotations

import sqlite3

import pytest
import trio

from omnigent.server.claims import COALESCE, LEASE, RENEW_EVERY, ClaimLost, Claims
from omnigent.store import Store
from tests.support.fake_runners import another_process


@pytest.fixture
async def store(tmp_path):  # async: the store reads the virtual clock as it opens
    with Store(tmp_path / "chat.db", clock=trio.current_time) as store:
        yield store


def _claimed(store: Store, claims: Claims, count: int) -> list[str]:
    sessions = [store.create_conversation(agent_id=None)["id"] for _ in range(count)]
    for n, sid in enumerate(sessions):
        assert store.claim_conversation(sid, claims.owner, turn_id=f"turn_{n}", lease=LEASE)
    return sessions


def _count_renewals(store: Store) -> list[str]:
    statements: list[str] = []
    store.conn.set_trace_callback(
        lambda sql: statements.append(sql) if sql.startswith("UPDATE conversation_claims") else None)
    return statements


async def test_held_claims_outlive_their_lease_with_one_statement_a_round_and_the_renewer_then_ends(
        autojump_clock, store):
    claims = Claims(store)
    sessions = _claimed(store, claims, 3)
    renewals = _count_renewals(store)
    async with trio.open_nursery() as nursery:  # ends by itself: so the renewer ended too
        claims.renew_in(nursery)

        async def hold(n: int, sid: str) -> None:
            async with claims.renewed(sid, f"turn_{n}"):
                await trio.sleep(3 * LEASE + 1)  # three leases long, renewed all along
                assert not store.claim_conversation(sid, another_process(), turn_id=None, lease=LEASE)

        for n, sid in enumerate(sessions):
            nursery.start_soon(hold, n, sid)
    rounds = int((3 * LEASE + 1) // RENEW_EVERY)
    assert len(renewals) == rounds  # one statement for all three, every round
    assert all(store.claim_of(sid) is None for sid in sessions)  # released on the way out
    assert trio.current_time() == pytest.approx((rounds + 1) * RENEW_EVERY)  # its last sleep found none


async def test_claims_due_close_together_are_renewed_in_one_statement_and_a_short_turn_writes_none(
        autojump_clock, store):
    claims = Claims(store)
    sessions = _claimed(store, claims, 4)
    renewals = _count_renewals(store)
    async with trio.open_nursery() as nursery:
        claims.renew_in(nursery)

        async def hold(n: int, sid: str, after: float, seconds: float) -> None:
            await trio.sleep(after)
            async with claims.renewed(sid, f"turn_{n}"):
                await trio.sleep(seconds)

        nursery.start_soon(hold, 0, sessions[0], 0.0, RENEW_EVERY - 0.1)  # a short turn: never due
        nursery.start_soon(hold, 1, sessions[1], 0.5, 2 * RENEW_EVERY)  # due at 2.5
        nursery.start_soon(hold, 2, sessions[2], 0.5 + COALESCE, 2 * RENEW_EVERY)  # due at 3.5: with it
        nursery.start_soon(hold, 3, sessions[3], 0.6 + COALESCE, 2 * RENEW_EVERY)  # 3.6: a round of its own
        # (the checks fall between the renewals: at the same instant, either could run first)
        await trio.sleep(2.4)
        assert renewals == []  # sessions[0] left at 1.9 and was never due
        await trio.sleep(0.2)  # 2.6
        [first] = renewals
        assert sessions[1] in first and sessions[2] in first and sessions[0] not in first
        await trio.sleep(0.9)  # 3.5
        assert len(renewals) == 1
        await trio.sleep(0.2)  # 3.7: sessions[3] was due at 3.6
        assert len(renewals) == 2 and sessions[3] in renewals[1]  # with the others, due at 4.5: within COALESCE


async def test_a_claim_taken_over_cancels_its_own_body_only(autojump_clock, store):
    claims = Claims(store)
    lost_sid, kept_sid = _claimed(store, claims, 2)
    outcome: dict[str, object] = {}
    async with trio.open_nursery() as nursery:
        claims.renew_in(nursery)

        async def hold(sid: str, turn_id: str) -> None:
            try:
                async with claims.renewed(sid, turn_id):
                    await trio.sleep(4 * LEASE)
                outcome[sid] = "done"
            except ClaimLost:
                outcome[sid] = ("lost", trio.current_time())

        nursery.start_soon(hold, lost_sid, "turn_0")
        nursery.start_soon(hold, kept_sid, "turn_1")
        await trio.sleep(RENEW_EVERY / 2)
        # as if this process had stalled on one of them: the lease ran out, another took it
        store.conn.execute("UPDATE conversation_claims SET lease_until = 0 WHERE conversation_id = ?", [lost_sid])
        store.conn.commit()
        assert store.claim_conversation(lost_sid, another_process(), turn_id=None, lease=600)
    assert outcome[lost_sid] == ("lost", pytest.approx(RENEW_EVERY))  # found at the first round
    assert outcome[kept_sid] == "done"
    assert store.claim_of(lost_sid)["owner_token"] == "another-process"  # not released by us
    assert store.claim_of(kept_sid) is None


async def test_a_cancel_request_is_handed_over_once_at_the_next_round(autojump_clock, store):
    claims = Claims(store)
    [sid] = _claimed(store, claims, 1)
    _, turn = store.queue_message(sid, {"type": "message", "role": "user", "content": "hi"})
    asked: list[float] = []
    async with trio.open_nursery() as nursery:
        claims.renew_in(nursery)
        async with claims.renewed(sid, turn["id"], on_cancel_request=lambda: asked.append(trio.current_time())):
            await trio.sleep(RENEW_EVERY / 4)
            assert store.request_cancel(sid) == 1  # `omnigent sessions rm`, from another process
            await trio.sleep(3 * RENEW_EVERY)
    assert asked == [pytest.approx(RENEW_EVERY)]


async def test_a_failing_store_skips_a_round_and_the_claim_is_kept_at_the_next(autojump_clock, store, caplog):
    claims = Claims(store)
    [sid] = _claimed(store, claims, 1)
    real = store.renew_claims
    failures = [True]

    def renew_claims(*args, **kwargs):
        if failures and failures.pop():
            raise sqlite3.OperationalError("disk I/O error")
        return real(*args, **kwargs)

    store.renew_claims = renew_claims  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        claims.renew_in(nursery)
        async with claims.renewed(sid, "turn_0"):
            # past the lease it was taken with (6 s): the round at 2 s failed, the one at 4 s renewed it
            await trio.sleep(LEASE + 1)
            assert not store.claim_conversation(sid, another_process(), turn_id=None, lease=LEASE)
    assert "could not renew the claims on 1 conversation(s): disk I/O error" in caplog.text


async def test_renewed_without_a_renewer_nursery_says_so(store):
    claims = Claims(store)
    with pytest.raises(RuntimeError, match="renew_in"):
        async with claims.renewed("conv_x", "turn_x"):
            pass
