"""``spherecal simulate --engine ray``: virtual participants hosted in Ray actors.

The coordinator is the same real OS process as with ``--engine processes``; the
participants are :class:`~spherecal.engines.virtual.VirtualParticipant` threads,
many to a Ray actor (a *worker*), each with its own identity key, channel, ledgers,
state directory and data slice, talking real gRPC to the coordinator. Flower's
simulation engine makes the same trade (Beutel et al. 2020, "Flower: A Friendly
Federated Learning Research Framework", §5): one interpreter and one torch import
per worker instead of per participant, and Ray to place workers on one machine or
spread them over a cluster.

* A local Ray instance is started (no dashboard) unless ``address`` names an
  existing cluster (``ray start --head`` on one machine, ``--ray-address`` here).
  A local instance gets enough logical CPUs for every worker.
* ``workers`` actors, each reserving ``worker_cpus`` logical CPUs; participants are
  dealt to them in contiguous blocks of the roster.
* ``--drop`` faults work as with processes: the named participant cuts its own
  connection at exactly that point (see :mod:`spherecal.engines.virtual`).
* Across machines the coordinator must be reachable: ``coordinator_host`` is the
  address participants dial (and the coordinator listens on); anything but
  loopback needs ``--tls`` (the coordinator refuses plaintext off loopback). The
  certificates and identity keys are shipped to the workers with their
  participants; the code must be installed at the same path on every node.

Needs the optional ``ray`` extra (``pip install -e ".[ray]"``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import ray  # spherecal.engines chose the authentication mode before this import

from spherecal.certs import DEFAULT_HOSTS
from spherecal.config import load_participant_config
from spherecal.engines.virtual import HostReport, ParticipantHost, VirtualParticipant
from spherecal.results_schema import SimulationResults
from spherecal.simulate import (
    Progress,
    Simulation,
    SimulationError,
    SimulationSettings,
    run_simulation,
)
from spherecal.simulate.results import dropped_entry

__all__ = [
    "RayEngineSettings",
    "RaySimulation",
    "connect",
    "disconnect",
    "map_on_ray",
    "run_ray_simulation",
]

T = TypeVar("T")

_ROOT = str(Path(__file__).resolve().parent.parent.parent)


@dataclass(frozen=True)
class RayEngineSettings:
    workers: int | None = None
    """Ray actors hosting participants; None: one per local CPU (at most one per
    participant)."""
    worker_cpus: float = 1.0
    """Logical CPUs each worker reserves (Ray scheduling; fractions allowed)."""
    address: str | None = None
    """An existing Ray cluster (``ray start --head`` prints it); None: local instance."""
    coordinator_host: str = "127.0.0.1"
    """Where participants dial the coordinator (it listens there too)."""
    start_timeout_s: float = 180.0
    """How long workers may take to be placed and started."""

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError("--workers must be >= 1")
        if not (math.isfinite(self.worker_cpus) and self.worker_cpus > 0):
            raise ValueError("--worker-cpus must be > 0")

    @property
    def compute_slots(self) -> int:
        """How many of a worker's participants may compute at once: its CPUs, at
        least one (the rest wait for the coordinator, not for the interpreter)."""
        return max(1, math.ceil(self.worker_cpus))

    def worker_count(self, participants: int) -> int:
        wanted = self.workers if self.workers is not None else (os.cpu_count() or 1)
        return max(1, min(wanted, participants))


def connect(address: str | None, *, cpus: int = 1, threads: int = 1) -> bool:
    """Join the cluster at ``address``, or start a local instance (no dashboard) with
    at least ``cpus`` logical CPUs; returns whether this call started Ray (the caller
    then shuts it down). Already connected: nothing to do."""
    if ray.is_initialized():
        return False
    env = {
        "PYTHONPATH": _ROOT + (os.pathsep + os.environ["PYTHONPATH"])
        if os.environ.get("PYTHONPATH")
        else _ROOT,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
    }
    common: dict[str, Any] = {
        "runtime_env": {"env_vars": env},
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    if address:
        try:
            ray.init(address=address, **common)
        except ConnectionError as exc:
            raise ConnectionError(
                f"cannot join the Ray cluster at {address}: {exc}. A cluster with token "
                "authentication (Ray's default) needs its token here, in ~/.ray/auth_token "
                "or RAY_AUTH_TOKEN, and RAY_AUTH_MODE=token"
            ) from None
    else:
        # Ray waits 30 s for its GCS server to publish its port and 30 s for its local
        # raylet to register; on a loaded machine (a CI box running other tests) either
        # can run out — seen once in a clean-clone `make test` — so the GCS wait is
        # raised unless the user set it, and a timed-out start is tried again.
        os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
        for attempt in range(3):
            try:
                ray.init(num_cpus=max(os.cpu_count() or 1, cpus), include_dashboard=False, **common)
                break
            except Exception as exc:  # Ray raises a bare Exception here
                if "timed out" not in str(exc).lower() or attempt == 2:
                    raise
                ray.shutdown()
    return True


def disconnect() -> None:
    """Shut down the Ray connection :func:`connect` opened."""
    ray.shutdown()


def map_on_ray(
    fn: Callable[..., T],
    calls: Sequence[tuple[Any, ...]],
    on_done: Callable[[int, T], None],
    *,
    cpus_per_call: float = 1.0,
    max_pending: int = 64,
) -> None:
    """Run ``fn(*calls[i])`` as Ray tasks (``fn`` must be importable by the workers)
    and call ``on_done(i, result)`` on this process as each finishes, so the caller
    keeps its results (e.g. a cache on its own disk) whichever node computed them.
    At most ``max_pending`` tasks are submitted at a time."""
    remote = ray.remote(fn).options(num_cpus=cpus_per_call, max_retries=0)
    queue = list(enumerate(calls))
    pending: dict[Any, int] = {}
    while queue or pending:
        while queue and len(pending) < max_pending:
            index, arguments = queue.pop(0)
            pending[remote.remote(*arguments)] = index
        finished, _ = ray.wait(list(pending), num_returns=1)
        for ref in finished:
            on_done(pending.pop(ref), ray.get(ref))


class _HostActor:
    """The Ray actor: a :class:`ParticipantHost` in a worker process."""

    def __init__(self, log_path: str, threads: int, compute_slots: int) -> None:
        self.host = ParticipantHost(
            log_path=Path(log_path), threads=threads, compute_slots=compute_slots
        )

    def node(self) -> str:
        return self.host.report.node

    def start(self, participants: list[VirtualParticipant]) -> int:
        self.host.start(participants)
        return len(participants)

    def wait(self, timeout_s: float) -> dict[str, Any]:
        return asdict(self.host.wait(timeout_s))

    def close(self) -> None:
        self.host.close()


class RaySimulation(Simulation):
    """:class:`~spherecal.simulate.Simulation` with participants on Ray workers."""

    def __init__(
        self,
        settings: SimulationSettings,
        engine: RayEngineSettings,
        progress: Progress | None = None,
    ) -> None:
        self.engine = engine
        self._actors: list[Any] = []
        self._started_ray = False
        self._nodes: list[str] = []
        super().__init__(settings, progress)
        self._t0_unix = time.time() - (time.monotonic() - self._t0)

    # ------------------------------------------------------------------ certs
    def _ca_hosts(self) -> tuple[str, ...]:
        """The coordinator's certificate names its host too: hosts dial it there."""
        return tuple(dict.fromkeys((*DEFAULT_HOSTS, self.engine.coordinator_host)))

    # ------------------------------------------------------------------ ray
    def _connect(self, workers: int) -> None:
        try:
            self._started_ray = connect(
                self.engine.address,
                cpus=math.ceil(workers * self.engine.worker_cpus),
                threads=self.settings.threads,
            )
        except ConnectionError as exc:
            raise SimulationError(str(exc)) from None

    def _virtual(self, k: int, port: int) -> VirtualParticipant:
        path = self.participant_config(k, port)
        settings = load_participant_config(path)
        settings = replace(settings, coordinator=f"{self.engine.coordinator_host}:{port}")
        files: dict[str, bytes] = {}
        if self.settings.tls:
            tls = settings.tls
            for name, file in (
                ("ca", tls.ca),
                ("cert", tls.cert),
                ("key", tls.key),
                ("identity", settings.identity_key),
                ("peers", tls.peer_keys),
            ):
                if file is not None:
                    files[name] = file.read_bytes()
        return VirtualParticipant(settings, files)

    def _launch_workers(self) -> None:
        """Connect to Ray and create the worker actors (asynchronously: they start
        while the coordinator does)."""
        if self._actors:
            return
        workers = self.engine.worker_count(len(self.settings.participant_ids))
        self._connect(workers)
        actor_class = ray.remote(_HostActor).options(
            num_cpus=self.engine.worker_cpus, max_concurrency=4
        )
        self._actors = [
            actor_class.remote(
                str(self.out / "logs" / f"worker-{w}.log"),
                self.settings.threads,
                self.engine.compute_slots,
            )
            for w in range(workers)
        ]

    def start_coordinator(
        self, listen: str = "127.0.0.1:0", timeout: float = 120.0, *, halt: str | None = None
    ) -> int:
        self._launch_workers()
        return super().start_coordinator(listen, timeout, halt=halt)

    def start_participants(self, only: Any = None) -> None:
        """Start every participant (``only`` is not supported: a worker hosts a
        fixed block) on ``workers`` Ray actors."""
        if only is not None:
            raise SimulationError("the ray engine starts the whole roster at once")
        if self.port is None:
            raise SimulationError("start the coordinator first")
        self._launch_workers()
        ids = self.settings.participant_ids
        workers = len(self._actors)
        try:
            self._nodes = ray.get(
                [a.node.remote() for a in self._actors], timeout=self.engine.start_timeout_s
            )
        except ray.exceptions.GetTimeoutError:
            raise SimulationError(
                f"Ray could not start {workers} workers of {self.engine.worker_cpus} CPUs "
                f"within {self.engine.start_timeout_s:.0f}s (too few CPUs in the cluster?)"
            ) from None
        port = self.port
        blocks = _contiguous(len(ids), workers)
        starts = [
            actor.start.remote([self._virtual(k, port) for k in block])
            for actor, block in zip(self._actors, blocks, strict=True)
        ]
        try:
            ray.get(starts, timeout=self.engine.start_timeout_s)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            raise SimulationError(
                f"a Ray worker could not host its participants: {type(cause).__name__}: {cause}"
            ) from None
        self.progress(
            f"[simulate] ray: {len(ids)} virtual participants on {workers} workers "
            f"({self.engine.worker_cpus:g} CPU each; nodes {sorted(set(self._nodes))})"
        )

    def wait_participants(self, timeout: float = 30.0) -> dict[str, int | None]:
        codes: dict[str, int | None] = {pid: None for pid in self.settings.participant_ids}
        if not self._actors:
            return codes
        try:
            reports = ray.get([a.wait.remote(timeout) for a in self._actors], timeout=timeout + 60)
        except ray.exceptions.GetTimeoutError:
            raise SimulationError("the Ray workers did not report back") from None
        for raw in reports:
            report = HostReport(**raw)
            codes.update(report.exit_codes)
            for record in report.dropped:
                entry = dropped_entry(record, float(record["at_unix"]) - self._t0_unix)
                with self._lock:
                    self.dropped.append(entry)
            for error in report.errors:
                self.progress(f"[simulate] worker on {report.node}: {error}")
        return codes

    def results(self, exit_codes: dict[str, int | None], wall_s: float) -> SimulationResults:
        out = super().results(exit_codes, wall_s)
        out["engine"] = {
            "name": "ray",
            "workers": len(self._actors),
            "worker_cpus": self.engine.worker_cpus,
            "address": self.engine.address,
            "nodes": sorted(set(self._nodes)),
        }
        return out

    def close(self) -> None:
        for actor in self._actors:
            with contextlib.suppress(Exception):  # best effort at shutdown
                ray.kill(actor)
        self._actors = []
        super().close()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


def _contiguous(n: int, parts: int) -> list[list[int]]:
    """``0..n-1`` in ``parts`` contiguous blocks whose sizes differ by at most one."""
    base, extra = divmod(n, parts)
    out, lo = [], 0
    for w in range(parts):
        size = base + (1 if w < extra else 0)
        out.append(list(range(lo, lo + size)))
        lo += size
    return out


def run_ray_simulation(
    settings: SimulationSettings,
    engine: RayEngineSettings | None = None,
    progress: Progress | None = None,
) -> SimulationResults:
    """:func:`~spherecal.simulate.run_simulation` with the ray engine."""
    chosen = engine or RayEngineSettings()
    return run_simulation(
        settings,
        progress,
        factory=lambda s, p: RaySimulation(s, chosen, p),
        listen=f"{chosen.coordinator_host}:0",
    )
