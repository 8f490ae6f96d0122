"""Run from another directory, as an installed ``spherecal`` is: the gRPC clients
import, and only through the ``spherecal`` namespace — proto-plus (installed with
``ray[default]``) owns the top-level ``proto``, and importing ours must not touch it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

IMPORTS = (
    "import sys; "
    "import spherecal.participant.grpc_transport, spherecal.participant.loop_transport; "
    "import spherecal.status; "
    "from spherecal.proto.services import grpc_services; "
    "from spherecal.proto import spherecal_pb2; "
    "assert 'proto' not in sys.modules and 'crypto' not in sys.modules, 'top-level name'; "
    "assert hasattr(grpc_services(), 'CoordinatorStub'); "
    "assert spherecal_pb2.Instruction.DESCRIPTOR.full_name.endswith('Instruction'); "
    "print('ok')"
)


def test_the_grpc_clients_import_from_outside_the_repository(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
