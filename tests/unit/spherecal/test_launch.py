"""The simulation's process launchers (``spherecal.simulate.launch``): a child forked
from the preloaded fork server behaves as the fresh interpreter it replaces — its
own environment, working directory, streams and exit status."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from spherecal.simulate import Simulation, SimulationSettings
from spherecal.simulate import launch as launch_module
from spherecal.simulate.launch import launch
from spherecal.spherefed.reference import ReferenceConfig

LAUNCHERS = ("forkserver", "exec")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_help_on_a_pipe_with_the_childs_own_environment(launcher: str, tmp_path: Path) -> None:
    # argparse wraps its help to $COLUMNS: the child must see the environment it was
    # given, not the one the fork server started with.
    widths = {}
    for columns in ("40", "200"):
        child = launch(
            launcher,
            ["--help"],
            cwd=tmp_path,
            env=_env(COLUMNS=columns),
            stdout_log=None,
            stderr_log=None,
        )
        assert child.stdout is not None and child.stderr is not None
        out = child.stdout.read().decode()
        err = child.stderr.read().decode()
        assert child.wait(timeout=60) == 0, err
        assert out.startswith("usage: "), out[:200]
        widths[columns] = max(len(line) for line in out.splitlines())
    # (argparse cannot break the usage line's "{coordinator,participant}" group: 42 wide)
    assert widths["40"] <= 45 < 60 < widths["200"], widths


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_bad_config_exit_status_and_stderr_to_the_log_in_the_childs_directory(
    launcher: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "coordinator.toml").write_text("this is = = not toml\n")
    log_path = tmp_path / "coordinator.log"
    with open(log_path, "ab") as log:
        child = launch(
            launcher,
            ["coordinator", "--config", "coordinator.toml"],  # relative: resolved in cwd
            cwd=work,
            env=_env(),
            stdout_log=log,
            stderr_log=log,
        )
        code = child.wait(timeout=120)
    text = log_path.read_text()
    assert code == 2, text
    assert "spherecal coordinator: error:" in text
    assert "No such file" not in text  # it found the file: the working directory is the child's
    assert child.poll() == 2


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_running_child_times_out_then_dies_of_sigkill(launcher: str, tmp_path: Path) -> None:
    # A participant whose coordinator is not there retries with back-off until killed.
    settings = SimulationSettings(
        reference=ReferenceConfig(participants=2, model="mlp", rounds=1), out=tmp_path
    )
    config = Simulation(settings).participant_config(0, port=_unused_port())
    log_path = tmp_path / "p0.log"
    with open(log_path, "ab") as log:
        child = launch(
            launcher,
            ["participant", "--config", str(config)],
            cwd=tmp_path,
            env=_env(),
            stdout_log=log,
            stderr_log=log,
        )
        deadline = time.monotonic() + 120
        while "unreachable" not in log_path.read_text() and "retry" not in log_path.read_text():
            assert child.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.2)
        assert child.poll() is None
        child.kill()
        assert child.wait(timeout=60) == -signal.SIGKILL
        child.kill()  # already dead: a no-op


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unknown_launcher_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown launcher 'spawn'"):
        launch("spawn", ["--help"], cwd=tmp_path, env={}, stdout_log=None, stderr_log=None)


def test_the_fork_server_is_single_threaded_with_single_threaded_native_pools(
    tmp_path: Path,
) -> None:
    """Forking is safe only from a process with one thread: no BLAS/OpenMP worker may
    exist in the fork server when it forks. It starts with the pools a fresh
    interpreter of ``threads = 1`` gets, and the harness's environment is untouched."""
    from multiprocessing import forkserver

    before = {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    child = launch(
        "forkserver", ["--help"], cwd=tmp_path, env=_env(), stdout_log=None, stderr_log=None
    )
    assert child.stdout is not None
    child.stdout.read()
    assert child.wait(timeout=60) == 0  # served: the preload imports are done
    server_pid = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    assert server_pid is not None
    environ = Path(f"/proc/{server_pid}/environ").read_bytes().split(b"\0")
    wanted = (before["OPENBLAS_NUM_THREADS"] or "1").encode()
    assert b"OPENBLAS_NUM_THREADS=" + wanted in environ
    assert len(os.listdir(f"/proc/{server_pid}/task")) == 1
    assert {k: os.environ.get(k) for k in before} == before


def test_a_forked_childs_exit_skips_torchs_operator_finalizers_only() -> None:
    """A forked child's exit switches off the finalizers that unregister torch's
    operator libraries (0.06 s of CPU per child for a process about to end), and no
    other finalizer: the project's own exit handlers still run."""
    import weakref

    import torch.library

    registry = weakref.finalize._registry  # type: ignore[attr-defined]
    before = {f: f.atexit for f in registry}
    library = torch.library.Library("spherecal_launch_test", "FRAGMENT")
    ours = weakref.finalize(library, lambda: None)  # another finalizer on the same object
    try:
        theirs = [f for f, info in registry.items() if info.func is torch.library._del_library]
        assert theirs and all(f.atexit for f in theirs)
        skipped = launch_module._skip_torch_library_finalizers()
        assert skipped == len(theirs)
        assert not any(f.atexit for f in theirs)
        assert ours.atexit  # only torch's library finalizers
    finally:
        for f, flag in before.items():
            f.atexit = flag
        ours.detach()
