"""Run a coordinator process: storage, federation driver, gRPC server, summary.

``run_coordinator`` is what ``spherecal coordinator --config FILE`` calls. It binds
(port 0 picks a free port, reported on stderr and in ``port_file``), runs the
federation to its end, keeps answering until every live participant was told it is
done (``linger_s``), writes ``summary.json`` to ``out_dir`` and returns the summary.
Progress lines go to stderr, prefixed ``[coordinator]``; they never contain
statistics, updates or keys.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch

from spherecal.coordinator.driver.evaluation_stage import CentralEvaluator
from spherecal.coordinator.driver.federation import Federation
from spherecal.coordinator.driver.futile_retry import attempts_warning
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.coordinator.driver.outputs import write_json
from spherecal.coordinator.driver.progress_log import DEBUG_PREFIX, leveled
from spherecal.coordinator.errors import FederationFailed, StorageFailed
from spherecal.coordinator.evaluation_schedule import evaluations_warning
from spherecal.coordinator.server.grpc_server import (
    CRL_STAMP_KEY,
    build_server,
    ensure_port_free,
)
from spherecal.coordinator.server.health import HealthReporter
from spherecal.coordinator.server.log_limit import RepeatFilter, rate_limited
from spherecal.coordinator.server.native_log import NativeStderr, handshaker_traced
from spherecal.coordinator.server.probes import MetricsServer, start_metrics
from spherecal.coordinator.server.service import CoordinatorService
from spherecal.coordinator.server.traffic import Traffic
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.lifecycle import (
    Finished,
    finished_federation,
    kept_meta,
    set_aside_finished,
    stored_result,
)
from spherecal.coordinator.state.registry import Registry
from spherecal.coordinator.state.state_dir import guard_federation_start, write_marker
from spherecal.coordinator.state.store import Store, durability_warning
from spherecal.coordinator.summary_schema import CoordinatorSummary, EndedResult, SummaryDocument
from spherecal.crypto import native
from spherecal.proto.address import split_host_port
from spherecal.spherefed.state_lock import StateDirLock

__all__ = ["run_coordinator"]


STOP_GRACE_S = 6.0
"""After SIGTERM or a storage fault, how long the driver has to end by itself
(summary, participants told) before the process exits regardless (issue #20: a
coordinator never hangs on a fault, and SIGTERM is always honoured)."""


class _Stopper:
    """Ends the process within seconds on SIGTERM or a storage fault.

    Both *suspend* the federation (``Board.suspend``): the driver fails its stage
    and ends, polling participants are told ``stopping`` and wait for the restart,
    which resumes after the last completed round. A watchdog then gives the driver
    :data:`STOP_GRACE_S`; past it — the driver stuck in a computation or a system
    call — the process writes a minimal summary (best effort) and exits 1. A second
    SIGTERM exits at once."""

    def __init__(
        self, federation: Federation, say: Callable[[str], None], summary_path: Path
    ) -> None:
        self.federation = federation
        self.say = say
        self.summary_path = summary_path
        self.grace_s = STOP_GRACE_S
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._watchdog: threading.Timer | None = None
        self.finished = threading.Event()
        """Set by the main thread once its summary is written (the watchdog stands down)."""
        self.interrupted = False
        """The stop was Ctrl-C's: after the summary the process exits 130."""

    def storage_failed(self, fault: StorageFailed) -> None:
        """The store's ``on_failure``: say it in one line, then stop (any thread)."""
        rounds = self.federation.completed_rounds
        # The fault may have come after a round's commit reached the disk (a later
        # write failed), so the restart can find one round more than this process
        # knew of: say "at least".
        self.say(
            f"FATAL: state storage failed: {fault}; stopping (after the fault is fixed, a "
            f"restart with the same state_dir resumes after the last round stored: round "
            f"{rounds}, or a later one whose commit reached the disk)"
        )
        self._stop(f"state storage failed: {fault}")

    def on_signal(self, signum: int, frame: object) -> None:
        """SIGTERM's and SIGINT's handler. It runs on the main thread between two
        bytecodes — possibly inside a lock the stop needs, or a write to stderr — so it
        only hands the work to a thread of its own."""
        threading.Thread(
            target=self._on_signal, args=(signum,), name="stop-signal", daemon=True
        ).start()

    def _on_signal(self, signum: int) -> None:
        """Ctrl-C stops as SIGTERM does (issue #20's clean stop: summary written,
        participants told to wait for the restart) rather than unwinding the driver
        mid-stage, which left ``summary.json`` at ``running`` and the sites polling a
        closed port; the process still exits 130 afterwards, as a shell expects."""
        interrupt = signum == signal.SIGINT
        name = "Ctrl-C (SIGINT)" if interrupt else "SIGTERM"
        with self._lock:
            again = self._reason is not None
            self.interrupted = self.interrupted or (interrupt and not again)
        if again:
            self.say(f"second {name}: exiting now")
            how = "interrupted by" if interrupt else "terminated by"
            self._exit_now(f"stopped: {how} a second {name}", code=130 if interrupt else 1)
        self._stop("interrupted by Ctrl-C (SIGINT)" if interrupt else "terminated by SIGTERM")

    def _stop(self, reason: str) -> None:
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
            self._watchdog = threading.Timer(self.grace_s, self._expired)
            self._watchdog.daemon = True
            self._watchdog.start()
        self.federation.board.suspend(reason)

    def _expired(self) -> None:
        if self.finished.is_set():
            return
        self.say(f"did not stop within {self.grace_s:.0f}s after: {self._reason}; exiting now")
        self._exit_now(f"stopped: {self._reason}")

    def _exit_now(self, reason: str, *, code: int = 1) -> NoReturn:
        """Best-effort summary (the disk may be full), then exit ``code`` (1, or 130 for
        a second Ctrl-C) without unwinding."""
        if not self.finished.is_set():
            with contextlib.suppress(Exception):
                write_json(
                    self.summary_path,
                    {
                        "federation_id": self.federation.federation_id,
                        "status": "stopped",  # not over: the same command resumes it
                        "status_reasons": [reason],
                        "completed_rounds": self.federation.completed_rounds,
                    },
                )
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)

    def cancel(self) -> None:
        self.finished.set()
        with self._lock:
            if self._watchdog is not None:
                self._watchdog.cancel()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _on_stop_signals(stopper: _Stopper) -> dict[int, Any]:
    """SIGTERM and Ctrl-C stop this process cleanly (summary written, participants
    told to wait for the restart); SIGKILL of course cannot, and the next start resumes
    from the last round either way. Returns the handlers to restore."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, stopper.on_signal) for sig in STOP_SIGNALS}


def _peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _default_say(message: str) -> None:
    if message.startswith(DEBUG_PREFIX):
        return  # routine bookkeeping (``progress_log``); the CLI's writer can show it
    print(f"[coordinator {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _configure_logging(
    formatter: logging.Formatter | None = None,
    *,
    grpc_core_info: bool = True,
    say: Callable[[str], None] | None = None,
) -> NativeStderr | None:
    """In a coordinator process with no logging set up: records to stderr, identical
    ones rate-limited (a flood of bad requests must not flood the log) — gRPC core's
    own lines on fd 2 too (:mod:`~spherecal.coordinator.server.native_log`), a refused
    TLS handshake as one of ``say``'s lines; returns that capture, to stop at the end.
    ``formatter`` is the CLI's (``spherecal.logs.LineFormatter``: ISO-8601 UTC, level,
    text or JSON); ``grpc_core_info=False``: gRPC core logs at INFO only for the
    handshakes, and its other INFO lines are dropped. With ``GRPC_TRACE=handshaker``
    in the environment a refused handshake's line names the client's address."""
    root = logging.getLogger()
    if root.handlers:
        return None  # embedded (tests, notebooks): the host's logging decides
    # first: the handler below takes the new sys.stderr
    native = NativeStderr(
        info=grpc_core_info, on_handshake=say, peer_trace=handshaker_traced()
    ).start()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        formatter
        or logging.Formatter(
            "[coordinator %(asctime)s] %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
        )
    )
    handler.addFilter(RepeatFilter())
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    return native


def run_coordinator(
    settings: CoordinatorSettings,
    *,
    say: Callable[[str], None] | None = None,
    threads: int | None = 1,
    new_federation: bool = False,
    log_formatter: logging.Formatter | None = None,
    grpc_core_info: bool = True,
) -> SummaryDocument | EndedResult:
    """Run one coordinator until the federation ends; return its summary.

    ``new_federation`` allows starting a new federation in a state directory holding
    checkpoints or a federation marker its database does not know (they are set aside,
    see :mod:`spherecal.coordinator.state.state_dir`), or a federation that ended (set
    aside whole, :mod:`spherecal.coordinator.state.lifecycle`); without it the first
    is refused and the second is reported from its stored result, nothing written.
    ``grpc_core_info=False`` says the CLI raised gRPC core's log level to INFO only so
    that refused TLS handshakes reach the log (:func:`_configure_logging`)."""
    emit = rate_limited(say or _default_say)
    native = _configure_logging(
        log_formatter, grpc_core_info=grpc_core_info, say=say or _default_say
    )
    try:
        return _run(settings, emit, threads=threads, new_federation=new_federation)
    except StorageFailed as exc:  # before the federation ran: it cannot start (exit 2)
        raise OSError(f"state storage failed: {exc}") from None
    finally:
        if native is not None:
            native.stop()


def _run(
    settings: CoordinatorSettings,
    emit: Callable[[str], None],
    *,
    threads: int | None,
    new_federation: bool,
) -> SummaryDocument | EndedResult:
    if threads is not None:
        torch.set_num_threads(threads)
    # A federation that ended is read-only (issue #23): report it and write nothing,
    # or with --new-federation set it aside whole and start another.
    finished = finished_federation(settings.state_dir)
    if finished is not None and not new_federation:
        emit(
            f"federation {finished.federation_id} in {settings.state_dir} already ended "
            f"{finished.status}: reporting its stored result, changing nothing (a new "
            "federation in this state directory needs --new-federation)"
        )
        return stored_result(finished, settings.out_dir)
    ensure_port_free(settings.server.listen)  # before touching the state directory
    # One process per state directory, held until this one exits (a second coordinator
    # with another address would drive the same federation beside this one).
    with StateDirLock(settings.state_dir, role="coordinator"):
        return _run_locked(settings, emit, finished, threads=threads, new_federation=new_federation)


CARRIED_OVER = (CRL_STAMP_KEY,)
"""``meta`` keys a new federation in a state directory takes over from the finished
one set aside there (``--new-federation``): the newest revocation list applied
(``coordinator.server.revocation``) is a floor for the directory, not for one
federation — without it, an older list the CA signed, put back over ``[tls] crl``
before the new federation's start, was applied again and un-revoked every
certificate revoked since."""


def same_training_warning(settings: CoordinatorSettings, folder: Path) -> str | None:
    """The line logged when a new federation trains exactly as the one set aside in
    ``folder`` did (the same participants, seed, model and training: its settings'
    fingerprint): its first round asks each site for the update it already released
    — the same model, seed and data give it bit for bit — and the sites refuse it
    (``RULE_RELEASE_REPEATED``, in any federation since 2026-11-28), so that round is
    lost and the run ends ``degraded``. None when the training differs."""
    kept = kept_meta(folder, ("fingerprint",)).get("fingerprint")
    if kept is None or kept != settings.fingerprint():
        return None
    return (
        "--new-federation: this federation's participants, seed, model and training are "
        "those of the one set aside, so its first round asks every site whose data is "
        "unchanged for the update it already released; the sites refuse it "
        "(RULE_RELEASE_REPEATED) and that round is lost: set another [federation] seed "
        "to train anew"
    )


def _carry_over(store: Store, folder: Path, emit: Callable[[str], None]) -> None:
    for key, value in kept_meta(folder, CARRIED_OVER).items():
        if store.get_meta(key) is None:
            store.set_meta(key, value)
            emit(f"carried over from the federation set aside: {key}")


def _run_locked(
    settings: CoordinatorSettings,
    emit: Callable[[str], None],
    finished: Finished | None,
    *,
    threads: int | None,
    new_federation: bool,
) -> SummaryDocument | EndedResult:
    set_aside: str | None = None
    if finished is not None:
        set_aside = str(set_aside_finished(finished, settings.state_dir, settings.out_dir, emit))
    stopper: _Stopper | None = None

    def storage_failed(fault: StorageFailed) -> None:
        if stopper is not None:
            stopper.storage_failed(fault)
        else:  # before the federation exists: the constructor's caller raises it
            emit(f"FATAL: state storage failed: {fault}")

    store = Store(
        settings.state_dir / "state.db", on_failure=storage_failed, durability=settings.durability
    )
    summary: CoordinatorSummary | None = None
    server = None
    metrics: MetricsServer | None = None
    try:
        guard_federation_start(
            settings.state_dir,
            store.get_meta("federation_id"),
            new_federation=new_federation,
            say=emit,
        )
        if set_aside is not None:
            store.event("warning", f"new federation; the finished one was set aside in {set_aside}")
            _carry_over(store, Path(set_aside), emit)
            repeated = same_training_warning(settings, Path(set_aside))
            if repeated is not None:
                emit(f"WARNING: {repeated}")
                store.event("warning", repeated)
        durable = durability_warning(settings.durability)
        warnings = evaluations_warning(settings) + attempts_warning(settings)
        for weakened in ([durable] if durable else []) + warnings:
            emit(f"WARNING: {weakened}")
            store.event("warning", weakened)
        registry = Registry(
            settings.participants,
            store,
            require_certificates=not settings.server.insecure,
            heartbeat_timeout_s=settings.timeouts.heartbeat_timeout_s,
            clock_skew_s=settings.timeouts.clock_skew_s,
        )
        model = GlobalModel(settings.model.spec(settings.seed))
        evaluator = CentralEvaluator.from_settings(settings, model)
        federation = Federation(
            settings, store, registry, say=leveled(emit), model=model, evaluator=evaluator
        )
        stopper = _Stopper(federation, emit, settings.out_dir / "summary.json")
        try:
            federation.prepare()
        except FederationFailed as exc:
            raise ValueError(str(exc)) from None
        write_marker(settings.state_dir, federation.federation_id)
        traffic = Traffic()
        service = CoordinatorService(settings, registry, federation, store, traffic)
        health = HealthReporter()
        server, port = build_server(settings, service, health=health)
        server.start()
        metrics = start_metrics(service)
        if metrics is not None:
            mhost, _ = split_host_port(settings.metrics.listen or "")
            emit(f"metrics and probes on http://{mhost}:{metrics.port}/metrics, /healthz, /readyz")
        rss_after_setup = _peak_rss_mb()
        host, _ = split_host_port(settings.server.listen)
        # which run this database is, for the audit page (``spherecal audit``)
        store.set_meta("listen", f"{host}:{port}")
        store.set_meta("name", settings.name)
        emit(
            f"listening on {host}:{port} "
            f"({'INSECURE, loopback only' if settings.server.insecure else 'mutual TLS'}); "
            f"state {settings.state_dir}"
        )
        emit(native.startup_message())  # a slow path not chosen is a warning
        if settings.server.port_file is not None:
            settings.server.port_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = settings.server.port_file.with_suffix(".tmp")
            tmp.write_text(f"{port}\n")
            tmp.replace(settings.server.port_file)
        previous = _on_stop_signals(stopper)
        try:
            federation.run()
            health.serving(False)  # ended: only lingering to tell participants
            federation.linger()
        finally:
            summary = federation.summary()
            summary["bytes"] = traffic.snapshot()
            summary["resources"] = {
                "rss_after_setup_mb": rss_after_setup,
                "peak_rss_mb": _peak_rss_mb(),
                "secagg_peak_vector_bytes": federation.peak_secagg_bytes,
            }
            summary["listen"] = f"{host}:{port}"
            try:
                write_json(settings.out_dir / "summary.json", summary)
            except OSError as exc:  # best effort: the fault may be this very disk
                emit(f"could not write {settings.out_dir / 'summary.json'}: {exc}")
            stopper.cancel()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        if metrics is not None:
            metrics.close()
        if server is not None:
            health.shutdown()
            server.stop(grace=2).wait()
        store.close()
        if summary is not None:  # a federation ran: what durability cost it (performance.md)
            emit(
                f"state database: {store.commits} commits, {store.synced_commits} synced to "
                f"disk (durability {store.durability})"
            )
    if summary is None:  # unreachable: the inner finally ran, or an error propagated
        raise RuntimeError("the federation ended without a summary")
    if stopper is not None and stopper.interrupted:
        raise KeyboardInterrupt  # stopped cleanly above; the CLI's exit status is 130's
    return summary
