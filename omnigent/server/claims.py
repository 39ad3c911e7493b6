"""One turn at a time per conversation, across every process sharing the store.

A turn service holds a conversation's claim (a row in the store, see
`Store.claim_conversation`) for as long as one of its turns runs there. A
turn posted meanwhile by another process waits behind it, polling; its user
message and its history are read only once it holds the claim, so it sees the
answer it waited for. The holder renews a lease every `RENEW_EVERY` s (the
claims of a process due together in one statement: `Claims`); a claim whose
holder died (pid gone, or reused: the start time differs) or whose lease ran
out is taken over at the next poll, well within 5 s.

The renewal is also how another process reaches a running turn: `omnigent
sessions rm` on the local store cannot call this process's dispatcher, so
it stores a cancel request on the turn (`Store.request_cancel`) and the
holder, at its next renewal, hands it to `on_cancel_request`, which cancels
the turn as an interrupt would.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from ..store import Store
from ..store.owners import ClaimOwner

log = logging.getLogger("omnigent.server.claims")

LEASE = 6.0          # s: three renewals' worth, so a loaded but live holder keeps it
RENEW_EVERY = 2.0    # s
POLL_EVERY = 0.5     # s: a waiting turn re-checks this often
COALESCE = 1.0       # s: a round renews too the claims due this much after the first


class Claims:
    """This process's side of the claims: taking them, and keeping every held one's lease running.

    One renewer task serves all the claims held (`renewed`). Each claim is due `RENEW_EVERY` s
    after it entered `renewed` or was last renewed; when the first is due, the renewer renews it
    and every other due within `COALESCE` s, in one statement, and asks once which of their
    turns another process wants cancelled. So renewals cost the store at most one statement a `COALESCE`
    however many turns run (a loaded server runs more of them, and slower: each had a renewal
    per 2 s), a turn shorter than `RENEW_EVERY` writes none, and a turn opens no task of its own
    for it. The renewer runs in the nursery given to `renew_in`, only while claims are held.
    """

    def __init__(self, store: Store, owner: ClaimOwner | None = None) -> None:
        self.store = store
        self.owner = owner or ClaimOwner.this_process()
        self._ended: set[str] = set()  # released with their turn's end, inside `renewed`
        self._held: dict[str, _Held] = {}  # session -> its claim's turn, inside `renewed`
        self._nursery: trio.Nursery | None = None
        self._renewing = False  # the renewer task runs (it ends when nothing is held)

    def renew_in(self, nursery: trio.Nursery) -> None:
        """Where the renewer task runs: a nursery that outlives every `renewed` block."""
        self._nursery = nursery

    def held_elsewhere(self, session_id: str) -> bool:
        """Another live process's turn runs on this conversation now: do not touch its binding."""
        return self.store.claimed_elsewhere(session_id, self.owner)

    async def acquire(self, session_id: str, turn_id: str, on_wait: Callable[[], None] | None = None) -> None:
        """Wait until this turn service holds the conversation's claim (cancellable: nothing held yet).

        `on_wait` is called once, if it has to wait (it must not block)."""
        if self.holds(session_id, turn_id):
            return  # taken with the turn's message (`queue_message`): a read, nothing written
        waited = False
        while not self.store.claim_conversation(session_id, self.owner, turn_id=turn_id, lease=LEASE):
            if not waited:
                log.info("turn %s waits for another process's turn on %s", turn_id, session_id)
                waited = True
                if on_wait is not None:
                    on_wait()
            await trio.sleep(POLL_EVERY)

    def holds(self, session_id: str, turn_id: str) -> bool:
        """This service holds the conversation's claim for `turn_id`, as `queue_message` takes it (a read)."""
        return self.store.holds_claim(session_id, self.owner, turn_id=turn_id, for_at_least=LEASE - RENEW_EVERY)

    def queue_message(self, session_id: str, item: dict, *,
                      approval_timeout: float | None = None) -> tuple[dict, dict, bool]:
        """`Store.queue_message_claiming`, with the claim for the new turn taken in its transaction
        where the conversation is idle (the turn is this service's to run: `submit` follows).
        Returns (the item, the turn, whether it took the claim: as `holds` would read it)."""
        return self.store.queue_message_claiming(session_id, item, approval_timeout=approval_timeout,
                                                 claim=self.owner, lease=LEASE)

    @asynccontextmanager
    async def renewed(self, session_id: str, turn_id: str,
                      on_cancel_request: Callable[[], None] | None = None) -> AsyncIterator[None]:
        """Keep an acquired claim's lease running inside; release the claim after.

        Raises `ClaimLost`, the body cancelled, if a renewal finds another process took it over.
        `on_cancel_request` is called once, at a renewal, if another process asked for this turn
        to be cancelled (it must not block: it starts the cancel elsewhere)."""
        if self._nursery is None:
            raise RuntimeError("Claims.renewed needs the nursery of its renewer: call renew_in first")
        self._ended.discard(session_id)
        held = self._held[session_id] = _Held(turn_id, on_cancel_request)
        if not self._renewing:
            self._renewing = True
            self._nursery.start_soon(self._renew_held)
        clean = False
        try:
            with held.scope:
                yield
            if held.lost:
                raise ClaimLost(session_id)
            clean = True
        finally:
            if self._held.get(session_id) is held:
                del self._held[session_id]
            # A completed turn released it with its end (`release_with_end`): nothing to read
            # back then, unless something raised (that transaction may have rolled back). Only
            # this turn's claim is released: once that end committed, the next message may have
            # taken the claim for its own turn (`queue_message`), which runs without acquiring it.
            released = clean and session_id in self._ended
            self._ended.discard(session_id)
            try:
                if not released and self.store.holds_claim(session_id, self.owner, turn_id=turn_id):
                    self.store.release_claim(session_id, self.owner, turn_id=turn_id)
            except sqlite3.Error as exc:  # e.g. a full disk: the lease runs out by itself
                log.error("could not release the claim on %s: %s", session_id, exc)

    def release_with_end(self, session_id: str) -> None:
        """Release the claim inside the transaction that ends the conversation's turn (its writes
        join it): the turn's end and the claim's go together, one write transaction fewer. Called
        by the turn holding it, with nothing of that turn left to write; `renewed` then neither
        reads the claim back nor releases it."""
        self.store.release_claim(session_id, self.owner)
        self._ended.add(session_id)

    async def _renew_held(self) -> None:
        # Sleeps until the first claim is due and renews, with it, every claim due within
        # COALESCE: none is renewed later than it would be by a task of its own, and rounds
        # come at most every COALESCE s. A claim registered meanwhile is due last (its due
        # time is now + RENEW_EVERY, every other is at most that), so the sleep stays right.
        # No checkpoint between the last check of `_held` and the flag's reset: a claim
        # registered after it finds no renewer and starts one.
        try:
            while self._held:
                await trio.sleep_until(min(claim.due for claim in self._held.values()))
                self._renew_round(trio.current_time())
        finally:
            self._renewing = False

    def _renew_round(self, now: float) -> None:
        if all(claim.due > now for claim in self._held.values()):
            return  # the claim that was due has left meanwhile: none is renewed early for nothing
        held = {sid: claim for sid, claim in self._held.items() if claim.due <= now + COALESCE}
        for claim in held.values():
            claim.due = now + RENEW_EVERY  # a failed round is tried again with the next
        try:
            kept = self.store.renew_claims(held, self.owner, lease=LEASE)
            asked = self.store.cancel_requested(
                [claim.turn_id for claim in held.values() if claim.on_cancel_request is not None])
        except sqlite3.Error as exc:  # a failing disk: try again at the next renewal
            log.error("could not renew the claims on %d conversation(s): %s", len(held), exc)
            return
        for session_id, claim in held.items():
            if session_id not in kept:
                # our lease ran out (this process stalled for LEASE s) and another process took
                # over: its turn has read this turn's message and may have answered it already,
                # so this turn must not go on (it would answer twice, from an old history)
                log.warning("turn %s lost its claim on %s to another process", claim.turn_id, session_id)
                claim.lost = True
                claim.scope.cancel()
                del self._held[session_id]
            elif claim.turn_id in asked and claim.on_cancel_request is not None:
                log.info("turn %s: another process asked to cancel it (sessions rm)", claim.turn_id)
                on_cancel_request, claim.on_cancel_request = claim.on_cancel_request, None
                on_cancel_request()


class _Held:
    """A claim inside `renewed`: its turn, the scope its body runs in, when its lease is next
    renewed, and what a renewal found."""

    __slots__ = ("turn_id", "on_cancel_request", "scope", "due", "lost")

    def __init__(self, turn_id: str, on_cancel_request: Callable[[], None] | None) -> None:
        self.turn_id = turn_id
        self.on_cancel_request = on_cancel_request
        self.scope = trio.CancelScope()
        self.due = trio.current_time() + RENEW_EVERY  # as a renewer task of its own would
        self.lost = False


class ClaimLost(Exception):
    """This process stalled past its lease and another process took the conversation over."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"another process took over conversation {session_id} while this turn was stalled")
