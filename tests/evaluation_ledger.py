"""Evaluation releases in a site's release ledger, as the evaluation limits' tests
make them: the ``k``-th one is a distinct executed model (a model moved by one ulp: a
new key, the same counts), of one split's records unless told otherwise."""

from __future__ import annotations

from pathlib import Path

from spherecal.participant.release_ledger import (
    EVALUATE,
    INPUT,
    LedgerRules,
    Release,
    ReleaseLedger,
)

TEST_SPLIT = b"t" * 32
"""A test split's fingerprint."""


def ledger_at(path: Path, **rules: object) -> ReleaseLedger:
    """Participant ``p0``'s ledger at ``path`` under ``rules`` (defaults otherwise)."""
    return ReleaseLedger(path, participant="p0", rules=LedgerRules(**rules))  # type: ignore[arg-type]


def evaluation(k: int, federation: str = "fed", data: bytes = TEST_SPLIT) -> Release:
    """The ``k``-th evaluation of the split ``data`` in ``federation``."""
    return Release(
        kind=EVALUATE,
        federation=federation,
        model=k.to_bytes(32, "big"),
        data=data,
        content=b"c" * 32,
    )


def release_evaluation(
    ledger: ReleaseLedger,
    k: int,
    federation: str = "fed",
    data: bytes = TEST_SPLIT,
    answer: str = INPUT,
) -> None:
    """Reserve and consume the ``k``-th evaluation under job ``<federation>-<k>``."""
    ledger.reserve(evaluation(k, federation, data), job=f"{federation}-{k}")
    ledger.consume(f"{federation}-{k}", answer=answer)
