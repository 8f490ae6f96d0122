"""Run a participant process (what ``spherecal participant --config FILE`` calls).

Loads the participant's Ed25519 identity key (created only on first enrolment:
:mod:`spherecal.participant.enrolment`), the trust it puts in the coordinator's
directory (checked before anything slow: a site under TLS pins its peers,
:func:`spherecal.participant.trust.site_directory_trust`), its local data and the
persistent job ledger, then hands over to
:class:`~spherecal.participant.runner.ParticipantRunner` over a gRPC transport. Returns how
the process ends (:class:`ParticipantEnd`): its exit status — 0 when the federation
completed or degraded (it reached its end with less than was asked; the coordinator's
summary says what), 1 when it failed, 2 when the coordinator refused this participant or
this site refused the federation's plan, 3 when it gave up reconnecting — and, where the
status alone would mislead, the words of the closing line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from spherecal.crypto import heap, identity_public_bytes, native
from spherecal.participant.data import load_local_data
from spherecal.participant.enrolment import load_or_enrol
from spherecal.participant.grpc_transport import GrpcTransport
from spherecal.participant.runner import ParticipantRunner
from spherecal.participant.secure_session import SqliteJobLedger
from spherecal.participant.settings import ParticipantSettings
from spherecal.participant.trust import site_directory_trust
from spherecal.spherefed.state_lock import StateDirLock

__all__ = ["ParticipantEnd", "run_participant"]


@dataclass(frozen=True)
class ParticipantEnd:
    """How a participant process ends: its exit status, and ``ending``, the closing
    line's words where the status's usual ones would mislead (``""`` otherwise;
    ``ParticipantExit.ending``) — status 2 is both "refused by the coordinator" and
    "this site refused the federation's plan"."""

    code: int
    ending: str = ""


def _keep_freed_heap(say: Callable[[str], None]) -> None:
    """Keep freed heap memory in this process (``SPHERECAL_RETAIN_FREED_MB``, default
    64 MiB; :mod:`spherecal.crypto.heap`), so each masked chunk reuses the pages the
    previous one left instead of faulting in fresh ones (issue #24), and say so."""
    say(heap.apply_from_env().describe())


def run_participant(
    settings: ParticipantSettings, *, log: Callable[[str], None] | None = None
) -> ParticipantEnd:
    pid = settings.participant_id

    def emit(message: str) -> None:
        if message.startswith("DEBUG: "):
            return  # as the coordinator's default writer: the CLI's writer can show it
        print(f"[{pid} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    say = log or emit
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    # One process per state directory (release ledger, held jobs): a second process of
    # this site would answer the same jobs beside this one. Held until this one exits.
    with StateDirLock(settings.state_dir, role=f"participant {pid}"):
        return _run(settings, say)


def _run(settings: ParticipantSettings, say: Callable[[str], None]) -> ParticipantEnd:
    identity = load_or_enrol(settings, say)
    trust = site_directory_trust(settings, identity_public_bytes(identity), say)
    data = load_local_data(settings.data)
    _keep_freed_heap(say)  # once it is about to run jobs (a refusal above stays one line)
    say(native.startup_message())  # a slow path not chosen is a warning
    transport = GrpcTransport(settings)
    ledger = SqliteJobLedger(settings.state_dir / "jobs.db")
    try:
        runner = ParticipantRunner(settings, transport, data, identity, ledger, trust, log=say)
        code = runner.run()
        return ParticipantEnd(code, runner.ending)
    finally:
        transport.close()
        ledger.close()
