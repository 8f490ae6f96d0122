"""Starting the simulation's OS processes: a fresh interpreter each, or forked from a
preloaded fork server.

Why a fork server: every coordinator and participant process of ``spherecal
simulate`` is ``python -m spherecal.daemon …``, and each one spends about 2 CPU-seconds
importing torch, gRPC and the project before it does anything (1.9 s measured here,
1.2 s of it torch). A 4-participant federation spends more CPU on those imports than
on training; the integration suite starts over a hundred such processes. With
``launcher = "forkserver"`` (the default) the harness starts one helper process
(:mod:`multiprocessing.forkserver`) that imports those modules once; every
coordinator and participant is then ``fork()``-ed from it — still its own OS process
with its own pid, memory, sockets, state directory and exit status, killed with
SIGKILL like any other — and starts in milliseconds. Nothing heavy runs in the fork
server before it forks (imports only: no torch thread pool, no gRPC channel), which
is what makes forking it safe.

``launcher = "exec"`` keeps the old way: ``subprocess.Popen`` of a fresh
interpreter per process. Both give the same results (the same code runs, from the
same configs, with the same environment); ``tests/unit/spherecal/test_launch.py``
checks that a forked child sees its own environment, working directory, streams and
exit status.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from multiprocessing import forkserver
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import IO, Protocol

__all__ = ["LAUNCHERS", "Child", "ExecChild", "ForkedChild", "launch"]

LAUNCHERS = ("forkserver", "exec")

#: Imported once by the fork server, so forked children start with them loaded.
PRELOAD = (
    "torch",
    # torch.optim imports its compiler front end the first time an optimizer is built
    # (``Optimizer.__init__`` is wrapped by ``torch._disable_dynamo``): 1.2 s of CPU in
    # every participant's first round, and the coordinator's first CCVR retraining,
    # measured here — once in the fork server instead (no threads started by it)
    "torch._dynamo",
    "grpc",
    "sklearn.datasets",  # digits: the dataset most simulations use
    "spherecal.spherefed.data",
    "spherecal.daemon",
    "spherecal.coordinator.main",
    "spherecal.participant.main",
)


class Child(Protocol):
    """What the harness needs of a child process (a subset of ``subprocess.Popen``)."""

    pid: int
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class ExecChild:
    """A fresh interpreter: ``python -m spherecal.daemon ARGS`` under ``subprocess.Popen``."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        stdout: IO[bytes] | None,
        stderr: IO[bytes] | None,
    ) -> None:
        self._popen = subprocess.Popen(
            [sys.executable, "-m", "spherecal.daemon", *args],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout is None else stdout,
            stderr=subprocess.PIPE if stderr is None else stderr,
            start_new_session=True,
        )
        self.pid: int = self._popen.pid
        self.stdout = self._popen.stdout
        self.stderr = self._popen.stderr

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._popen.wait(timeout=timeout)

    def kill(self) -> None:
        if self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._popen.send_signal(signal.SIGKILL)


def _skip_torch_library_finalizers() -> int:
    """Keep torch's operator-library finalizers (``torch.library._del_library``) from
    running at this process's exit; returns how many were skipped.

    Each ``torch.library.Library`` (torch and its compiler front end make about 170)
    has a ``weakref.finalize`` that unregisters its operators at interpreter exit. In a
    child forked from the fork server those tables are pages shared with the server,
    so unregistering copies them: 0.06 s of CPU per child exit, measured here, for
    nothing — the process ends right after and its dispatcher with it. The project's
    own exit handlers still run. ``finalize.atexit`` is the documented switch; the
    finalizers are found through the class's registry (CPython's ``_registry``; where
    it is missing nothing is skipped)."""
    library = sys.modules.get("torch.library")
    target = getattr(library, "_del_library", None)
    registry = getattr(weakref.finalize, "_registry", None)
    if target is None or not isinstance(registry, dict):
        return 0
    skipped = 0
    for finalizer, info in list(registry.items()):
        if getattr(info, "func", None) is target and finalizer.atexit:
            finalizer.atexit = False
            skipped += 1
    return skipped


def _forked_main(
    args: list[str],
    cwd: str,
    env: dict[str, str],
    stdout: socket.socket | str,
    stderr: socket.socket | str,
) -> None:
    """Run in the forked child: become what ``python -m spherecal.daemon ARGS`` would be
    (own session, working directory, environment, stdin from /dev/null, stdout and
    stderr to the harness's pipe or the log file), then run the CLI and exit with
    its status, running ``atexit`` handlers as a normal interpreter exit would."""
    os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, target in ((1, stdout), (2, stderr)):
        if isinstance(target, socket.socket):
            os.dup2(target.fileno(), fd)
            target.close()
        else:
            log = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(log, fd)
            os.close(log)
    # PYTHONUNBUFFERED as for a fresh interpreter: every line reaches the harness now.
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace"
    )
    sys.argv = [sys.executable, *args]
    code: int | str | None = 1
    try:
        # The daemons' own entry point (coordinator, participant): it never reaches the
        # simulation, so importing it here is no cycle.
        from spherecal.daemon import main as daemon_main

        code = daemon_main(args)
    except SystemExit as exc:
        code = exc.code
    finally:
        _skip_torch_library_finalizers()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    raise SystemExit(code)


class ForkedChild:
    """A process forked from the preloaded fork server (see the module docstring)."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        stdout: Path | None,
        stderr: Path | None,
    ) -> None:
        context = multiprocessing.get_context("forkserver")
        readers: list[IO[bytes] | None] = []  # our ends of the piped streams
        theirs: list[socket.socket | str] = []
        for target in (stdout, stderr):
            if target is None:
                mine, child_end = socket.socketpair()
                readers.append(mine.makefile("rb"))
                mine.close()  # the reader keeps the socket open until it is closed
                theirs.append(child_end)
            else:
                readers.append(None)
                theirs.append(str(target))
        process: BaseProcess = context.Process(
            target=_forked_main,
            args=(list(args), str(cwd), dict(env), theirs[0], theirs[1]),
            daemon=False,
        )
        process.start()
        for end in theirs:
            if isinstance(end, socket.socket):
                end.close()  # the child holds its own copy; EOF when it exits
        self._process = process
        assert process.pid is not None  # started
        self.pid: int = process.pid
        self.stdout, self.stderr = readers

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout or 0.0)
        return code

    def kill(self) -> None:
        if self._process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()


#: Thread pools sized when a native library loads (OpenBLAS, OpenMP, MKL) read these
#: once, in the fork server; a fresh interpreter gets them from the harness as 1
#: (``Simulation._env`` with ``threads = 1``). The fork server is started with the
#: same, so a forked child's BLAS runs as a fresh one's would; torch's own pool is
#: set by each process (``torch.set_num_threads``).
_POOL_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
_start_lock = threading.Lock()


def _ensure_preload() -> None:
    """Start the fork server once per harness process, importing :data:`PRELOAD`,
    with single-threaded native pools (see :data:`_POOL_ENV`)."""
    with _start_lock:
        multiprocessing.set_forkserver_preload(list(PRELOAD))
        saved = {name: os.environ.get(name) for name in _POOL_ENV}
        try:
            for name in _POOL_ENV:
                os.environ.setdefault(name, "1")
            forkserver.ensure_running()  # a no-op once it runs
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def launch(
    launcher: str,
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdout_log: IO[bytes] | None,
    stderr_log: IO[bytes] | None,
) -> Child:
    """Start ``spherecal ARGS`` as a child process. A stream given a log file goes
    there; a stream given ``None`` is a pipe the caller reads (``child.stdout`` /
    ``child.stderr``)."""
    if launcher == "exec":
        return ExecChild(args, cwd=cwd, env=env, stdout=stdout_log, stderr=stderr_log)
    if launcher == "forkserver":
        _ensure_preload()
        return ForkedChild(
            args,
            cwd=cwd,
            env=env,
            stdout=None if stdout_log is None else Path(stdout_log.name),
            stderr=None if stderr_log is None else Path(stderr_log.name),
        )
    raise ValueError(f"unknown launcher {launcher!r}; use one of {LAUNCHERS}")
