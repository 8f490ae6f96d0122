"""``spherecal simulate``: a whole federation as real OS processes on loopback.

One coordinator process and N participant processes (``python -m spherecal.cli
coordinator|participant``) talk real gRPC over 127.0.0.1 — with mutual TLS and a
throwaway CA under ``--tls``, otherwise plaintext, which both sides allow only on
loopback. Each participant takes its slice of the dataset exactly as the reference
runner partitions it (``participant.data``), so with the same settings and seed the
federation reproduces ``spherecal reference``.

``--drop SPEC`` kills participants with SIGKILL at a named point. Grammar::

    SPEC  := ITEM ("," ITEM)*
    ITEM  := PARTICIPANT ":" STAGE ["@" WHEN]
    STAGE := train | advertise | share | masked | unmask
    WHEN  := rN (round N, 1-based) | update | ffc | ccvr

e.g. ``p3:share`` (p3 dies right before sending its shares, in the first job that
gets there), ``p5:train@r2`` (dies during round 2's training), ``p4:masked@ccvr``
(dies half-way through its masked CCVR upload). See ``participant.faults`` for what
each stage means. The participant announces the point on stdout and waits; the
harness kills it with SIGKILL, so the kill lands exactly there.

Layout of ``--out DIR``::

    results.json               the result (schema in docs/deployment.md)
    coordinator.toml           the generated configs (rerunnable by hand)
    participants/pK.toml
    coordinator/state/state.db SQLite: rounds, jobs, audit log, events
    coordinator/out/           summary.json, model_{none,ffc,ccvr}.pt, model_spec.json
    logs/                      one log per process
    certs/                     (with --tls) CA, server and client certificates
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from coordinator.settings import SecAggSettings
from participant.data import load_local_data
from participant.faults import HALT_MARKER, HaltPoint, parse_halt
from participant.settings import DataSettings
from spherefed.data import load_dataset
from spherefed.network import ModelSpec, build_model
from spherefed.runner import ReferenceConfig
from spherefed.stats import CCVRStatistics, FFCStatistics, ccvr_statistics, ffc_statistics

from .certs import init_ca, issue_participant
from .config import DATASET_SHAPES, dump_toml

__all__ = [
    "Drop",
    "Simulation",
    "SimulationError",
    "SimulationSettings",
    "clear_statistics",
    "parse_drops",
    "run_simulation",
]

Progress = Callable[[str], None]


class SimulationError(RuntimeError):
    """The simulated federation could not be run or did not produce results."""


@dataclass(frozen=True)
class Drop:
    participant: str
    point: HaltPoint

    def __str__(self) -> str:
        return f"{self.participant}:{self.point}"


def parse_drops(spec: str | None, participants: Sequence[str]) -> tuple[Drop, ...]:
    """Parse ``--drop`` (grammar in the module docstring)."""
    if not spec:
        return ()
    out: list[Drop] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        pid, sep, rest = item.partition(":")
        if not sep or not rest:
            raise ValueError(f"--drop item {item!r} must be PARTICIPANT:STAGE[@WHEN]")
        if pid not in participants:
            raise ValueError(f"--drop names {pid!r}, which is not one of {list(participants)}")
        out.append(Drop(pid, parse_halt(rest)))
    seen = [d.participant for d in out]
    if len(set(seen)) != len(seen):
        raise ValueError("--drop names a participant twice (a process dies only once)")
    return tuple(out)


@dataclass(frozen=True)
class SimulationSettings:
    reference: ReferenceConfig
    out: Path
    calibration: tuple[str, ...] = ("ffc", "ccvr")
    secure_updates: bool = True
    secure_statistics: bool = True
    drops: tuple[Drop, ...] = ()
    threshold: int | None = None
    ffc_from_ccvr: bool = True
    threads: int = 1
    tls: bool = False
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 4.0
    stage_s: float = 120.0
    round_s: float = 900.0
    timeout_s: float = 3600.0
    chunk_entries: int = 1 << 18
    federated_every: int = 0
    feature_dim: int | None = None
    save_statistics: bool = False
    update_bound: float = SecAggSettings().update_bound
    statistics_bound: float = SecAggSettings().statistics_bound
    extra_participant: dict[str, Any] = field(default_factory=dict)
    epsilon: float | None = None
    """Target ε per calibration release (``--epsilon``): switches DP noise on."""
    delta: float = 1e-5
    dp_mechanism: str = "skellam"
    dp_budget: float | None = None
    """Total ε budget of every participant's local ledger (``--dp-budget``)."""
    participant_privacy: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-participant overrides of its ``[privacy]`` table (tests: a tiny budget)."""

    @property
    def privacy(self) -> bool:
        return self.epsilon is not None

    @property
    def participant_ids(self) -> tuple[str, ...]:
        return tuple(f"p{k}" for k in range(self.reference.participants))

    @property
    def statistics_jobs(self) -> tuple[str, ...]:
        jobs = []
        if "ffc" in self.calibration and not ("ccvr" in self.calibration and self.ffc_from_ccvr):
            jobs.append("ffc")
        if "ccvr" in self.calibration:
            jobs.append("ccvr")
        return tuple(jobs)

    def validate(self) -> None:
        ref = self.reference
        unknown = set(self.calibration) - {"ffc", "ccvr"}
        if unknown:
            raise ValueError(f"--calibration accepts ffc and ccvr, got {sorted(unknown)}")
        per_round = max(1, round(ref.sample_fraction * ref.participants))
        if self.secure_updates and per_round < 2:
            raise ValueError(
                "secure updates need at least 2 participants per round "
                f"(participants × sample fraction = {per_round})"
            )
        if self.secure_statistics and ref.participants < 2:
            raise ValueError("secure statistics need at least 2 participants")
        if self.epsilon is not None:
            if not self.epsilon > 0:
                raise ValueError("--epsilon must be > 0")
            if not 0 < self.delta < 1:
                raise ValueError("--delta must be in (0, 1)")
            if self.dp_mechanism not in ("skellam", "dgauss"):
                raise ValueError("--dp-mechanism must be skellam or dgauss")
            if not self.secure_statistics:
                raise ValueError(
                    "--epsilon needs secure statistics: the DP noise is added in the ring "
                    "before masking"
                )
        for drop in self.drops:
            point = drop.point
            secagg_stage = point.stage != "train"
            if point.when in ("ffc", "ccvr"):
                if point.when not in self.statistics_jobs:
                    raise ValueError(
                        f"--drop {drop}: there is no {point.when} statistics job (jobs: "
                        f"{list(self.statistics_jobs)}; FFC derives from CCVR unless "
                        "--separate-ffc)"
                    )
                if secagg_stage and not self.secure_statistics:
                    raise ValueError(f"--drop {drop}: statistics are not securely aggregated")
            elif point.when is not None and point.when.startswith("r"):
                if int(point.when[1:]) > ref.rounds:
                    raise ValueError(f"--drop {drop}: there are only {ref.rounds} rounds")
                if secagg_stage and not self.secure_updates:
                    raise ValueError(f"--drop {drop}: updates are not securely aggregated")
            elif secagg_stage and not (self.secure_updates or self.secure_statistics):
                raise ValueError(f"--drop {drop}: secure aggregation is off (--no-secure)")


class _Proc:
    """A child process with its log file and output pump threads."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: IO[bytes]) -> None:
        self.name = name
        self.popen = popen
        self.log = log
        self.threads: list[threading.Thread] = []

    def kill(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)

    def close(self) -> None:
        for thread in self.threads:
            thread.join(timeout=5)
        self.log.close()


class Simulation:
    """The processes of one simulated federation.

    ``run_simulation`` uses it start to finish; tests use the steps separately (e.g.
    to kill and restart the coordinator). Always ``close()`` it (it is a context
    manager): every child process is killed there.
    """

    def __init__(self, settings: SimulationSettings, progress: Progress | None = None) -> None:
        settings.validate()
        self.settings = settings
        self.progress = progress or (lambda _m: None)
        self.out = settings.out
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        (self.out / "participants").mkdir(exist_ok=True)
        self.coordinator: _Proc | None = None
        self.participants: dict[str, _Proc] = {}
        self.dropped: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self.port: int | None = None
        self._coordinator_starts = 0
        ref = settings.reference
        splits = load_dataset(ref.dataset, root=ref.data_root, seed=ref.seed)
        c, h, w = splits.train.image_shape
        self.shape = (splits.num_classes, c, (h, w))
        if settings.tls:
            self._make_certs()

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Simulation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        procs = list(self.participants.values())
        if self.coordinator is not None:
            procs.append(self.coordinator)
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.close()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        threads = str(self.settings.threads)
        env.update(
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS=threads,
            MKL_NUM_THREADS=threads,
            OPENBLAS_NUM_THREADS=threads,
        )
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def _make_certs(self) -> None:
        certs = self.out / "certs"
        if not (certs / "ca.key").exists():
            init_ca(certs)
        for pid in self.settings.participant_ids:
            if not (certs / f"{pid}.pem").exists():
                issue_participant(certs, pid)

    # ------------------------------------------------------------------ configs
    def coordinator_config(self, listen: str) -> Path:
        s, ref = self.settings, self.settings.reference
        classes, channels, size = self.shape
        certs = self.out / "certs"
        document: dict[str, dict[str, Any]] = {
            "federation": {
                "name": "simulate",
                "participants": list(s.participant_ids),
                "seed": ref.seed,
                "state_dir": "coordinator/state",
                "out_dir": "coordinator/out",
                "threads": s.threads,
            },
            "model": {
                "dataset": ref.dataset if ref.dataset in DATASET_SHAPES else None,
                "extractor": ref.model,
                "head": ref.head,
                "norm": ref.norm,
                "classifier": ref.classifier,
                "num_classes": classes,
                "in_channels": channels,
                "image_size": list(size),
                "feature_dim": s.feature_dim,
            },
            "training": {
                "rounds": ref.rounds,
                "local_epochs": ref.local_epochs,
                "batch_size": ref.batch_size,
                "lr": ref.lr,
                "momentum": ref.momentum,
                "weight_decay": ref.weight_decay,
                "loss": ref.loss,
                "algorithm": ref.algorithm,
                "prox_mu": ref.prox_mu,
                "fedopt_lr": ref.fedopt_lr,
                "sample_fraction": ref.sample_fraction,
                "min_participants": 2 if s.secure_updates else 1,
            },
            "calibration": {
                "methods": list(s.calibration),
                "ffc_ridge": ref.ffc_ridge,
                "ffc_from_ccvr": s.ffc_from_ccvr,
                "save_statistics": s.save_statistics,
                "ccvr_virtual_per_class": ref.ccvr.virtual_per_class,
                "ccvr_tukey": ref.ccvr.tukey,
                "ccvr_lr": ref.ccvr.lr,
                "ccvr_epochs": ref.ccvr.epochs,
                "ccvr_batch_size": ref.ccvr.batch_size,
                "ccvr_seed": ref.ccvr.seed,
            },
            "secure_aggregation": {
                "updates": s.secure_updates,
                "statistics": s.secure_statistics,
                "threshold": s.threshold,
                "chunk_entries": s.chunk_entries,
                "update_bound": s.update_bound,
                "statistics_bound": s.statistics_bound,
            },
            "server": {
                "listen": listen,
                "insecure": not s.tls,
                "port_file": "coordinator/port",
            },
            "tls": {
                "cert": str(certs / "server.pem") if s.tls else None,
                "key": str(certs / "server.key") if s.tls else None,
                "client_ca": str(certs / "ca.pem") if s.tls else None,
            },
            "timeouts": {
                "join_s": 300.0,
                "round_s": s.round_s,
                "stage_s": s.stage_s,
                "evaluation_s": s.stage_s,
                "heartbeat_interval_s": s.heartbeat_interval_s,
                "heartbeat_timeout_s": s.heartbeat_timeout_s,
                "linger_s": 20.0,
                "long_poll_s": 2.0,
            },
            "evaluation": {
                "test_dataset": ref.dataset,
                "test_data_root": ref.data_root,
                "federated_every": s.federated_every,
            },
            "privacy": {
                "enabled": True,
                "mechanism": s.dp_mechanism,
                "epsilon": s.epsilon,
                "delta": s.delta,
            }
            if s.privacy
            else {},
        }
        path = self.out / "coordinator.toml"
        path.write_text(dump_toml(document))
        return path

    def participant_config(self, k: int, port: int) -> Path:
        s, ref = self.settings, self.settings.reference
        pid = s.participant_ids[k]
        halts = [str(d.point) for d in s.drops if d.participant == pid]
        certs = self.out / "certs"
        participant: dict[str, Any] = {
            "id": pid,
            "coordinator": f"127.0.0.1:{port}",
            "insecure": not s.tls,
            "state_dir": f"../state/{pid}",
            "threads": s.threads,
            "allow_plaintext": not (s.secure_updates and s.secure_statistics),
            "long_poll_ms": 2000,
            "reconnect_max_s": 2.0,
            "give_up_s": 300.0,
            "halt_before": halts or None,
        }
        participant.update(s.extra_participant)
        if s.tls:
            participant["identity_key"] = str(certs / f"{pid}.identity.key")
        document: dict[str, dict[str, Any]] = {
            "participant": participant,
            "tls": {
                "ca": str(certs / "ca.pem") if s.tls else None,
                "cert": str(certs / f"{pid}.pem") if s.tls else None,
                "key": str(certs / f"{pid}.key") if s.tls else None,
            },
            "privacy": (
                {
                    "enabled": True,
                    "epsilon": s.epsilon,
                    "total_epsilon": s.dp_budget,
                    "delta": s.delta,
                    **s.participant_privacy.get(pid, {}),
                }
                if s.privacy
                else {}
            ),
            "data": {
                "dataset": ref.dataset,
                "root": ref.data_root,
                "slice_index": k,
                "slice_of": ref.participants,
                "partition": ref.partition,
                "alpha": ref.alpha,
                "shards_per_client": ref.shards_per_client,
                "seed": ref.seed,
                "validation_fraction": ref.validation_fraction,
            },
        }
        path = self.out / "participants" / f"{pid}.toml"
        path.write_text(dump_toml(document))
        return path

    # ------------------------------------------------------------------ processes
    def _spawn(self, name: str, args: list[str], *, pipe_stdout: bool) -> _Proc:
        log = open(self.out / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - _Proc closes it
        popen = subprocess.Popen(
            [sys.executable, "-m", "spherecal.cli", *args],
            cwd=self.out,
            env=self._env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipe_stdout else log,
            stderr=subprocess.PIPE if name == "coordinator" else log,
            start_new_session=True,
        )
        return _Proc(name, popen, log)

    def start_coordinator(self, listen: str = "127.0.0.1:0", timeout: float = 120.0) -> int:
        """Start (or restart) the coordinator; returns the port it listens on."""
        port_file = self.out / "coordinator" / "port"
        port_file.unlink(missing_ok=True)
        config = self.coordinator_config(listen)
        self._coordinator_starts += 1
        proc = self._spawn(
            "coordinator", ["coordinator", "--config", str(config)], pipe_stdout=False
        )
        assert proc.popen.stderr is not None
        pump = threading.Thread(
            target=self._pump_coordinator, args=(proc.popen.stderr, proc.log), daemon=True
        )
        pump.start()
        proc.threads.append(pump)
        self.coordinator = proc
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if proc.popen.poll() is not None:
                raise SimulationError(
                    f"the coordinator exited with {proc.popen.returncode} before listening; "
                    f"see {self.out / 'logs' / 'coordinator.log'}"
                )
            if time.monotonic() > deadline:
                raise SimulationError("the coordinator did not start listening in time")
            time.sleep(0.05)
        self.port = int(port_file.read_text().strip())
        return self.port

    def _pump_coordinator(self, stream: IO[bytes], log: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            log.write(raw)
            log.flush()
            self.progress(raw.decode("utf-8", "replace").rstrip())

    def start_participants(self, only: Sequence[str] | None = None) -> None:
        """Start every participant (or those in ``only``) as its own process."""
        if self.port is None:
            raise SimulationError("start the coordinator first")
        for k, pid in enumerate(self.settings.participant_ids):
            if only is not None and pid not in only:
                continue
            config = self.participant_config(k, self.port)
            proc = self._spawn(pid, ["participant", "--config", str(config)], pipe_stdout=True)
            assert proc.popen.stdout is not None
            pump = threading.Thread(
                target=self._pump_participant, args=(pid, proc, proc.popen.stdout), daemon=True
            )
            pump.start()
            proc.threads.append(pump)
            self.participants[pid] = proc

    def _pump_participant(self, pid: str, proc: _Proc, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            if line.startswith(HALT_MARKER):
                parts = line.split(maxsplit=3)
                stage = parts[1] if len(parts) > 1 else "?"
                purpose = parts[2] if len(parts) > 2 else "?"
                what = parts[3] if len(parts) > 3 else ""
                proc.kill()
                record = {
                    "participant": pid,
                    "stage": stage,
                    "job": purpose,
                    "task_or_job_id": what,
                    "how": "SIGKILL by the harness",
                    "at_s": round(time.monotonic() - self._t0, 3),
                }
                with self._lock:
                    self.dropped.append(record)
                self.progress(f"[simulate] killed {pid} (SIGKILL) at stage {stage} of {purpose}")
            else:
                proc.log.write(raw)
                proc.log.flush()

    def kill_coordinator(self) -> None:
        if self.coordinator is not None:
            self.coordinator.kill()
            self.coordinator.close()
            self.coordinator = None

    def wait_coordinator(self, timeout: float) -> int:
        if self.coordinator is None:
            raise SimulationError("no coordinator is running")
        try:
            return self.coordinator.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SimulationError(
                f"the federation did not finish within {timeout:.0f}s; see {self.out / 'logs'}"
            ) from None

    def wait_participants(self, timeout: float = 30.0) -> dict[str, int | None]:
        deadline = time.monotonic() + timeout
        codes: dict[str, int | None] = {}
        for pid, proc in self.participants.items():
            try:
                codes[pid] = proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[pid] = None
        return codes

    def summary(self) -> dict[str, Any]:
        path = self.out / "coordinator" / "out" / "summary.json"
        if not path.exists():
            raise SimulationError(
                f"the coordinator wrote no summary; see {self.out / 'logs' / 'coordinator.log'}"
            )
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    # ------------------------------------------------------------------ results
    def results(self, exit_codes: dict[str, int | None], wall_s: float) -> dict[str, Any]:
        s, summary = self.settings, self.summary()
        fired = {d["participant"] for d in self.dropped}
        return {
            "schema": "spherecal.results/1",
            "status": summary.get("status"),
            "errors": summary.get("errors", []),
            "settings": {
                **s.reference.to_json(),
                "calibration": list(s.calibration),
                "secure_updates": s.secure_updates,
                "secure_statistics": s.secure_statistics,
                "threshold": s.threshold,
                "ffc_from_ccvr": s.ffc_from_ccvr,
                "drop": [str(d) for d in s.drops],
                "tls": s.tls,
                "threads": s.threads,
                "epsilon": s.epsilon,
                "delta": s.delta if s.privacy else None,
                "dp_mechanism": s.dp_mechanism if s.privacy else None,
                "dp_budget": s.dp_budget,
            },
            "accuracy": summary.get("accuracy"),
            "central_accuracy": summary.get("central_accuracy"),
            "federated_evaluation": summary.get("federated_evaluation"),
            "per_round": summary.get("per_round", []),
            "jobs": summary.get("jobs", []),
            "statistics": summary.get("statistics", {}),
            "ccvr": summary.get("ccvr"),
            "timings": {**summary.get("timings", {}), "wall_s": wall_s},
            "bytes": summary.get("bytes", {}),
            "dropped": sorted(self.dropped, key=lambda d: d["at_s"]),
            "drops_not_triggered": [str(d) for d in s.drops if d.participant not in fired],
            "exit_codes": exit_codes,
            "coordinator_starts": self._coordinator_starts,
            "resumed_after_round": summary.get("resumed_after_round"),
            "audit_log": summary.get("audit_log"),
            "models": summary.get("models", {}),
            "saved_statistics": summary.get("saved_statistics", {}),
            "model": summary.get("model"),
            "privacy": summary.get("privacy", {"enabled": False}),
            "logs": str(self.out / "logs"),
        }


def run_simulation(
    settings: SimulationSettings,
    progress: Progress | None = None,
    *,
    factory: Callable[[SimulationSettings, Progress], Simulation] = Simulation,
    listen: str = "127.0.0.1:0",
) -> dict[str, Any]:
    """Run the whole simulated federation; writes and returns ``results.json``.

    ``factory`` picks the engine (``spherecal.engines.ray`` passes its own
    :class:`Simulation`); ``listen`` is the coordinator's address."""
    say = progress or (lambda _m: None)
    if settings.out.exists():
        for stale in ("coordinator", "participants", "state", "logs"):
            shutil.rmtree(settings.out / stale, ignore_errors=True)
    t0 = time.monotonic()
    ref = settings.reference
    with factory(settings, say) as sim:
        port = sim.start_coordinator(listen)
        say(
            f"[simulate] coordinator on {listen.rpartition(':')[0]}:{port}; starting "
            f"{ref.participants} participants ({ref.dataset}, {ref.partition}"
            + (f" alpha={ref.alpha}" if ref.partition == "dirichlet" else "")
            + f", {ref.rounds} rounds, secure {'on' if settings.secure_updates else 'off'}/"
            + f"{'on' if settings.secure_statistics else 'off'})"
        )
        sim.start_participants()
        sim.wait_coordinator(settings.timeout_s)
        codes = sim.wait_participants()
        results = sim.results(codes, time.monotonic() - t0)
    path = settings.out / "results.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    say(f"[simulate] wrote {path}")
    return results


def clear_statistics(
    settings: SimulationSettings, participants: Sequence[str], kind: str
) -> FFCStatistics | CCVRStatistics:
    """Recompute *in the clear* the statistics ``participants`` contribute under the
    saved final model, summed in roster order.

    Simulation only — the harness can read every participant's slice, a real
    coordinator cannot. It exists to check a securely aggregated result against the
    plaintext truth (tests, ``bench/service.py``).
    """
    out = settings.out / "coordinator" / "out"
    meta = json.loads((out / "model_spec.json").read_text())
    spec = ModelSpec(
        extractor=meta["extractor"],
        head=meta["head"],
        norm=meta["norm"],
        classifier=meta["classifier"],
        classifier_seed=meta["classifier_seed"],
        init_seed=meta["init_seed"],
        num_classes=meta["num_classes"],
        in_channels=meta["in_channels"],
        image_size=tuple(meta["image_size"]),
        feature_dim=settings.feature_dim,
    )
    model = build_model(spec)
    model.load_state_dict(torch.load(out / "model_none.pt", weights_only=True))
    model.eval()
    ref = settings.reference
    ids = settings.participant_ids
    total: FFCStatistics | CCVRStatistics | None = None
    for pid in sorted(participants, key=ids.index):
        data = load_local_data(
            DataSettings(
                dataset=ref.dataset,
                root=ref.data_root,
                slice_index=ids.index(pid),
                slice_of=ref.participants,
                partition=ref.partition,
                alpha=ref.alpha,
                shards_per_client=ref.shards_per_client,
                seed=ref.seed,
                validation_fraction=ref.validation_fraction,
            )
        )
        with torch.no_grad():
            chunks = [
                model.features(data.train_x[lo : lo + 512]) for lo in range(0, data.train_size, 512)
            ]
        z = torch.cat(chunks).double().numpy()
        y = data.train_y.numpy()
        stats: FFCStatistics | CCVRStatistics = (
            ffc_statistics(z, y, spec.num_classes)
            if kind == "ffc"
            else ccvr_statistics(z, y, spec.num_classes)
        )
        total = stats if total is None else total + stats  # type: ignore[operator]
    if total is None:
        raise ValueError("no participants")
    return total
