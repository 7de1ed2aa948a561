"""The instant a unit of work decides at (docs/DESIGN.md, "One clock per store")."""

from __future__ import annotations

from eventstore.api import Transaction


class Now:
    """`now_ms` as the caller gave it, or — when it gave none — the store's clock as the
    unit's transaction read it with its first statement. Bind it to each transaction
    the unit runs in (a retry runs in a new one); call it once the transaction has
    sent its first statement (a decision is made after the locks and reads)."""

    def __init__(self, given: int | None) -> None:
        self.given = given
        self._tx: Transaction | None = None

    def bind(self, tx: Transaction) -> Transaction:
        """Decide in `tx` from now on; returns it."""
        self._tx = tx
        return tx

    def __call__(self) -> int:
        if self.given is not None:
            return self.given
        assert self._tx is not None, "Now is bound to its unit's transaction first"
        return self._tx.clock_ms()
