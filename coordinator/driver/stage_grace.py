"""How long a secure job's masked and later stages wait for a participant that went away.

Why (issue #20): in the consistency and unmask stages every pending participant's
masked input is already in the sum, and a site keeps what it needs to answer the
rest of the job across its own restart (``participant.held_jobs``). Closing the stage
the moment its connection dropped would count a site that is restarting as a dropout
— and when the threshold needed it, fail the job and lose every site's release. So
such a participant is waited for up to ``rejoin_s`` (``[timeouts] rejoin_grace_s``)
from when it was first seen gone; the job's stage deadline still bounds the wait
(``SecureJob.advance``), and one that comes back without the job's state withdraws
at once (it says so), which ends the wait.

The masked stage waits too: a site stores its masked input before the first byte
of its upload leaves (``participant.held_jobs``), so one killed during its upload
comes back and sends the identical bytes again; its cut stream was never summed
(``crypto.staging``).

And so do the advertise and share stages, and the masked stage for a site that had
not begun its upload: a site holds its job — its job keys, the advertisement and
shares it sent — from the moment the keys are made, before the advertisement leaves
(issue #20). One killed there comes back with the same keys, is handed its task
again (``SecureJob.rejoined``), redoes its local work and masks that input for the
same job. Without the wait, enough sites killed before their upload would drop the
job below its threshold: it would fail, and the sites whose masked input had left
would rightly refuse a retry (one release per round), losing the round. A site that
comes back without the job withdraws at once, which ends the wait.
"""

from __future__ import annotations

from collections.abc import Collection

from spherecal.crypto import Stage

__all__ = ["GRACE_STAGES", "RejoinGrace"]

GRACE_STAGES = frozenset(
    {Stage.ADVERTISE, Stage.SHARE, Stage.MASKED, Stage.CONSISTENCY, Stage.UNMASK}
)


class RejoinGrace:
    """Per job: who is gone since when, in the current stage (not thread-safe: the
    job's lock guards it)."""

    def __init__(self, rejoin_s: float) -> None:
        self.rejoin_s = rejoin_s
        self._absent: dict[str, float] = {}
        self._gone: set[str] = set()
        """Waited for and not seen back yet (:meth:`came_back`)."""

    def came_back(self, alive: Collection[str]) -> tuple[str, ...]:
        """The participants waited for that are connected again (each once per
        absence). Why: one whose connection was cut while its task was on the way
        comes back with the *same* session — its process never restarted — and
        would wait for a task the coordinator counts as delivered; the job hands
        it the task again (``SecureJob.comebacks``)."""
        back = tuple(sorted(p for p in self._gone if p in alive))
        self._gone.difference_update(back)
        return back

    def waiting(
        self,
        stage: Stage,
        pending: Collection[str],
        alive: Collection[str],
        withdrawn: Collection[str],
        t: float,
        label: str,
    ) -> tuple[frozenset[str], tuple[str, ...]]:
        """(the gone participants the stage still waits for, a line for each one
        first seen gone)."""
        if self.rejoin_s <= 0 or stage not in GRACE_STAGES:
            return frozenset(), ()
        held: set[str] = set()
        news: list[str] = []
        for p in sorted(pending):
            if p in alive or p in withdrawn:
                continue
            self._gone.add(p)
            since = self._absent.get(p)
            if since is None:
                since = self._absent[p] = t
                where = {
                    Stage.ADVERTISE: "before its keys were in",
                    Stage.SHARE: "before its shares were in",
                    Stage.MASKED: "before its masked input was whole",
                }.get(stage, "after its masked input was summed")
                news.append(
                    f"{label}: {p} disconnected in stage {stage.value} {where}; "
                    f"waiting up to {self.rejoin_s:g} s for it to come back"
                )
            if t < since + self.rejoin_s:
                held.add(p)
        return frozenset(held), tuple(news)

    def stage_closed(self) -> None:
        self._absent.clear()
        self._gone.clear()
