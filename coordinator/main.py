"""Run a coordinator process: storage, federation driver, gRPC server, summary.

``run_coordinator`` is what ``spherecal coordinator --config FILE`` calls. It binds
(port 0 picks a free port, reported on stderr and in ``port_file``), runs the
federation to its end, keeps answering until every live participant was told it is
done (``linger_s``), writes ``summary.json`` to ``out_dir`` and returns the summary.
Progress lines go to stderr, prefixed ``[coordinator]``; they never contain
statistics, updates or keys.
"""

from __future__ import annotations

import logging
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from spherecal.coordinator.driver.evaluation_stage import CentralEvaluator
from spherecal.coordinator.driver.federation import Federation
from spherecal.coordinator.driver.model import GlobalModel
from spherecal.coordinator.driver.outputs import write_json
from spherecal.coordinator.errors import FederationFailed
from spherecal.coordinator.server.grpc_server import build_server, ensure_port_free
from spherecal.coordinator.server.health import HealthReporter
from spherecal.coordinator.server.log_limit import RepeatFilter, rate_limited
from spherecal.coordinator.server.probes import MetricsServer, start_metrics
from spherecal.coordinator.server.service import CoordinatorService
from spherecal.coordinator.server.traffic import Traffic
from spherecal.coordinator.settings import CoordinatorSettings
from spherecal.coordinator.state.registry import Registry
from spherecal.coordinator.state.state_dir import guard_federation_start, write_marker
from spherecal.coordinator.state.store import Store
from spherecal.proto.address import split_host_port

__all__ = ["run_coordinator"]


def _stop_on_sigterm(federation: Federation) -> Any:
    """SIGTERM ends the federation cleanly (summary written, participants told);
    SIGKILL of course cannot, and the next start resumes from the last round."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: object) -> None:
        federation.stop("terminated by SIGTERM")

    return signal.signal(signal.SIGTERM, handler)


def _peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _default_say(message: str) -> None:
    print(f"[coordinator {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _configure_logging(formatter: logging.Formatter | None = None) -> None:
    """In a coordinator process with no logging set up: records to stderr, identical
    ones rate-limited (a flood of bad requests must not flood the log). ``formatter``
    is the CLI's (``spherecal.logs.LineFormatter``: ISO-8601 UTC, level, text or
    JSON)."""
    root = logging.getLogger()
    if root.handlers:
        return  # embedded (tests, notebooks): the host's logging decides
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


def run_coordinator(
    settings: CoordinatorSettings,
    *,
    say: Callable[[str], None] | None = None,
    threads: int | None = 1,
    new_federation: bool = False,
    log_formatter: logging.Formatter | None = None,
) -> dict[str, Any]:
    """Run one coordinator until the federation ends; return its summary.

    ``new_federation`` allows starting a new federation in a state directory holding
    checkpoints or a federation marker its database does not know (they are set aside,
    see :mod:`spherecal.coordinator.state.state_dir`); without it that start is refused."""
    emit = rate_limited(say or _default_say)
    _configure_logging(log_formatter)
    if threads is not None:
        torch.set_num_threads(threads)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    ensure_port_free(settings.server.listen)  # before touching the state directory
    store = Store(settings.state_dir / "state.db")
    summary: dict[str, Any] = {}
    server = None
    metrics: MetricsServer | None = None
    try:
        guard_federation_start(
            settings.state_dir,
            store.get_meta("federation_id"),
            new_federation=new_federation,
            say=emit,
        )
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
            settings, store, registry, say=emit, model=model, evaluator=evaluator
        )
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
        emit(
            f"listening on {host}:{port} "
            f"({'INSECURE, loopback only' if settings.server.insecure else 'mutual TLS'}); "
            f"state {settings.state_dir}"
        )
        if settings.server.port_file is not None:
            settings.server.port_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = settings.server.port_file.with_suffix(".tmp")
            tmp.write_text(f"{port}\n")
            tmp.replace(settings.server.port_file)
        previous = _stop_on_sigterm(federation)
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
            write_json(settings.out_dir / "summary.json", summary)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    finally:
        if metrics is not None:
            metrics.close()
        if server is not None:
            health.shutdown()
            server.stop(grace=2).wait()
        store.close()
    return summary
