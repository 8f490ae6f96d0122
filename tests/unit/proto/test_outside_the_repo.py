"""Run from another directory, as an installed ``spherecal`` is: our ``proto`` package
shares its name with proto-plus's (installed with ``ray[default]``), whose
``__init__`` then wins; everything the services import must still resolve to ours
(``proto/services.py`` says why)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

IMPORTS = (
    "import participant.grpc_transport, participant.loop_transport, spherecal.status_cli; "
    "from proto.services import grpc_services; from proto import spherecal_pb2; "
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
