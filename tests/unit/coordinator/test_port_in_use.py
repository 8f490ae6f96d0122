"""A second coordinator on a busy port: one line of refusal, exit 2, nothing written.

The port is held by a real gRPC server (as the first coordinator would hold it) and
the second coordinator is the real CLI in its own process, so the test sees exactly
what an operator sees on stderr — including any line gRPC's C core would print on its
own ("add_port.cc … Address already in use") if it were ever asked to bind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc


def test_busy_port_is_refused_in_one_line_before_grpc_binds(tmp_path: Path) -> None:
    holder = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = holder.add_insecure_port("127.0.0.1:0")
    holder.start()
    try:
        state = tmp_path / "state"
        config = tmp_path / "c.toml"
        config.write_text(
            f'[federation]\nparticipants = ["a", "b", "c"]\nstate_dir = "{state.as_posix()}"\n'
            f'[model]\nextractor = "mlp"\n'
            f'[server]\nlisten = "127.0.0.1:{port}"\ninsecure = true\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
        done = subprocess.run(
            [sys.executable, "-m", "spherecal.cli", "coordinator", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=env,
        )
    finally:
        holder.stop(grace=None)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert f"port {port} is already in use" in lines[0]
    assert "add_port" not in done.stderr and "Traceback" not in done.stderr
    assert not state.exists()  # refused before touching (or creating) the state dir
