"""The OS processes of a simulated federation: spawn, watch, kill, restart.

One coordinator process and N participant processes (``python -m spherecal.daemon
coordinator|participant``) talk real gRPC over 127.0.0.1 — with mutual TLS and a
throwaway CA under ``--tls``, otherwise plaintext, which both sides allow only on
loopback. A participant that reaches its ``--drop`` point announces it on stdout
(:data:`spherecal.participant.faults.HALT_MARKER`); the pump thread here kills it with SIGKILL
at once, so the kill lands exactly there.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO

from spherecal.certs import DEFAULT_HOSTS, init_ca, issue_participant, request_participant
from spherecal.coordinator.summary_schema import SummaryDocument
from spherecal.crypto import identity_public_bytes
from spherecal.participant.faults import HALT_MARKER
from spherecal.participant.trust import pin_line
from spherecal.proto.identity import load_identity_key
from spherecal.results_schema import Dropped, SimulationResults
from spherecal.simulate.configs import (
    DataShape,
    coordinator_document,
    participant_document,
    write_toml,
)
from spherecal.simulate.launch import Child, launch
from spherecal.simulate.results import build_results
from spherecal.simulate.settings import Progress, SimulationError, SimulationSettings
from spherecal.spherefed.data import load_dataset

__all__ = ["Simulation"]


class _Proc:
    """A child process with its log file and output pump threads."""

    def __init__(self, name: str, popen: Child, log: IO[bytes]) -> None:
        self.name = name
        self.popen = popen
        self.log = log
        self.threads: list[threading.Thread] = []

    def kill(self) -> None:
        self.popen.kill()
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
        self.dropped: list[Dropped] = []
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self.port: int | None = None
        self._coordinator_starts = 0
        ref = settings.reference
        splits = load_dataset(ref.dataset, root=ref.data_root, seed=ref.seed, samples=ref.samples)
        c, h, w = splits.train.image_shape
        self.shape: DataShape = (splits.num_classes, c, (h, w))
        #: no site holds more of a split than the dataset has: the federation's bound
        self.max_examples = max(len(splits.train), len(splits.test))
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
        root = str(Path(__file__).resolve().parents[2])  # the repository root
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if self.settings.corrupt_shares or self.settings.adversaries:  # test-only faults
            env["SPHERECAL_TEST_FAULTS"] = "1"
        return env

    def _ca_hosts(self) -> tuple[str, ...]:
        """The names the coordinator's certificate is valid for."""
        return DEFAULT_HOSTS

    def _make_certs(self) -> None:
        """A CA, each site's keys made as a site makes them (``certs request``) and
        certified from its request, and the pin file every site uses."""
        certs = self.out / "certs"
        if not (certs / "ca.key").exists():
            init_ca(certs, hosts=self._ca_hosts())
        for pid in self.settings.participant_ids:
            if not (certs / f"{pid}.pem").exists():
                csr, _, _ = request_participant(certs, pid)
                issue_participant(certs, pid, csr=csr)
        # every site pins the roster's identity keys ([tls] peer_keys), as the
        # deployment guide's sites do after exchanging `spherecal certs pin` lines
        lines = [
            pin_line(pid, identity_public_bytes(load_identity_key(certs / f"{pid}.identity.key")))
            for pid in self.settings.participant_ids
        ]
        (certs / "peers.txt").write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------------ configs
    def coordinator_config(self, listen: str) -> Path:
        """Write ``DIR/coordinator.toml`` (listening on ``listen``); return its path."""
        document = coordinator_document(
            self.settings, self.shape, self.out, listen, max_examples=self.max_examples
        )
        return write_toml(self.out / "coordinator.toml", document)

    def participant_config(self, k: int, port: int) -> Path:
        """Write ``DIR/participants/pK.toml`` for participant ``k``; return its path.
        A participant restarted after one of its ``--drop`` points fired runs without
        that point (a process dies at its point once; its restart goes on from there
        and may die at its next one)."""
        pid = self.settings.participant_ids[k]
        with self._lock:
            fired = [
                (d["stage"], d["job"])
                for d in self.dropped
                if d["participant"] == pid and d["stage"] != "external"
            ]
        left = [d for d in self.settings.drops if d.participant == pid]
        for stage, purpose in fired:
            for drop in left:
                when = drop.point.when
                if drop.point.stage == stage and (
                    when is None or when == purpose or (when[0] == "r" and purpose == "update")
                ):
                    left.remove(drop)
                    break
        settings = self.settings
        if fired:
            settings = replace(
                settings,
                drops=tuple(d for d in settings.drops if d.participant != pid or d in left),
            )
        document = participant_document(settings, k, port, self.out)
        return write_toml(self.out / "participants" / f"{pid}.toml", document)

    # ------------------------------------------------------------------ processes
    def _spawn(
        self,
        name: str,
        args: list[str],
        *,
        pipe_stdout: bool,
        extra_env: Mapping[str, str] | None = None,
    ) -> _Proc:
        log = open(self.out / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - _Proc closes it
        env = self._env()
        env.update(extra_env or {})
        child = launch(
            self.settings.launcher,
            args,
            cwd=self.out,
            env=env,
            stdout_log=None if pipe_stdout else log,
            stderr_log=None if name == "coordinator" else log,
        )
        return _Proc(name, child, log)

    def start_coordinator(
        self, listen: str = "127.0.0.1:0", timeout: float = 120.0, *, halt: str | None = None
    ) -> int:
        """Start (or restart) the coordinator; returns the port it listens on.
        ``halt`` (test-only, ``POINT@WHEN``): the coordinator stops dead at that point
        of a secure job and prints ``SPHERECAL-HALT`` (``coordinator.driver.halts``)."""
        port_file = self.out / "coordinator" / "port"
        port_file.unlink(missing_ok=True)
        config = self.coordinator_config(listen)
        self._coordinator_starts += 1
        proc = self._spawn(
            "coordinator",
            ["coordinator", "--config", str(config)],
            pipe_stdout=False,
            extra_env=(
                {"SPHERECAL_TEST_FAULTS": "1", "SPHERECAL_COORDINATOR_HALT": halt}
                if halt is not None
                else None
            ),
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
                pump.join(timeout=5)  # its last lines, written by the pump
                log = self.out / "logs" / "coordinator.log"
                raise SimulationError(
                    f"the coordinator exited with {proc.popen.poll()} before listening; "
                    f"see {log}; its last lines: {_last_lines(log)}"
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
                record: Dropped = {
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

    def kill_participant(self, pid: str, why: str = "SIGKILL by the harness") -> None:
        """SIGKILL participant ``pid`` now (chaos tests, soak); ``start_participants(
        only=[pid])`` restarts it with the same config, identity key and state."""
        proc = self.participants.get(pid)
        if proc is None:
            raise SimulationError(f"no participant process {pid!r}")
        proc.kill()
        proc.close()
        with self._lock:
            self.dropped.append(
                {
                    "participant": pid,
                    "stage": "external",
                    "job": "-",
                    "task_or_job_id": "",
                    "how": why,
                    "at_s": round(time.monotonic() - self._t0, 3),
                }
            )

    def kill_coordinator(self) -> None:
        if self.coordinator is not None:
            self.coordinator.kill()
            self.coordinator.close()
            self.coordinator = None

    def wait_coordinator(self, timeout: float) -> int:
        """The coordinator's exit status, once it exited and its last lines are in
        ``logs/coordinator.log``: the pump copies its stderr there and may still be
        writing the last lines when the process is gone (a test that read the log
        right after the exit missed the CLI's closing line, now and then)."""
        if self.coordinator is None:
            raise SimulationError("no coordinator is running")
        try:
            code = self.coordinator.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SimulationError(
                f"the federation did not finish within {timeout:.0f}s; see {self.out / 'logs'}"
            ) from None
        for pump in self.coordinator.threads:  # at the stream's end once the process is
            pump.join(timeout=5)
        return code

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

    def summary(self) -> SummaryDocument:
        path = self.out / "coordinator" / "out" / "summary.json"
        if not path.exists():
            raise SimulationError(
                f"the coordinator wrote no summary; see {self.out / 'logs' / 'coordinator.log'}"
            )
        data: SummaryDocument = json.loads(path.read_text())
        return data

    # ------------------------------------------------------------------ results
    def results(self, exit_codes: dict[str, int | None], wall_s: float) -> SimulationResults:
        """The ``results.json`` document of this run (see :mod:`.results`)."""
        return build_results(
            self.settings,
            self.summary(),
            dropped=self.dropped,
            exit_codes=exit_codes,
            wall_s=wall_s,
            coordinator_starts=self._coordinator_starts,
            logs=self.out / "logs",
        )


def _last_lines(path: Path, count: int = 3) -> str:
    """The last ``count`` non-empty lines of a log, joined (why a process ended,
    kept in an error that outlives a temporary directory)."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError as exc:
        return f"(unreadable: {exc})"
    return " | ".join(lines[-count:]) or "(empty)"
