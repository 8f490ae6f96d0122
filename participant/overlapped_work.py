"""Local work that runs while a secure job's keys are exchanged (issue #24).

Why: a secure statistics job starts with two rounds that do not depend on the data —
the participant advertises its keys as soon as the task arrives, then waits for the
job's share step (every participant's advertisement) and answers it. Done one after
the other with the feature pass, those rounds sat in front of it: on the 2-core box
the sites' feature passes started 0.15–0.3 s later than in the same stage without
secure aggregation, while the processor idled through the rounds' waits.

What may overlap, and why that reveals nothing: the messages of the two rounds still
leave when they would (the advertisement when the task arrives, the shares when the
share step does) — they never wait for the local work. What a concurrent local work
could change is only how fast they are computed (the processor is shared), and
whether the local work is still running says no more than the moment the masked
input leaves, which follows the local work by nature. So the overlap is taken only
where that moment is not hidden: with ``[policy] min_local_work_s = 0`` (the
default). A site that hides it (``min_local_work_s > 0``) keeps the strict order —
keys, shares, then the local work (``spherecal.participant.secure_jobs``).

:class:`Overlapped` runs one computation on a thread of its own and hands back its
result (or raises its exception) in the caller's thread. Used as a context manager
it is always waited for on the way out — also when the job was refused, the
coordinator moved on or the exchange raised — so no later task ever shares the
trainer with a feature pass still running (the result is then simply dropped:
nothing of it leaves).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Overlapped"]

T = TypeVar("T")


class Overlapped(Generic[T]):
    """``fn()`` started now on a daemon thread; :meth:`result` waits for it."""

    def __init__(self, fn: Callable[[], T], *, name: str) -> None:
        self._fn = fn
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc
        finally:
            self._done.set()

    def __enter__(self) -> Overlapped[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.wait()  # never leave the computation running behind the caller

    def result(self) -> T:
        """The computation's value, once it finished; its exception, re-raised here."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
