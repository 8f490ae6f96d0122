"""Regenerate the committed protobuf / gRPC modules and their typed stubs from
``spherecal.proto``.

Run ``python -m spherecal.proto._generate`` after editing the ``.proto``. A test calls
:func:`generate` into a temporary directory and fails when the committed files differ,
so the contract and the code can never drift apart silently. Needs ``grpcio-tools`` and
``mypy-protobuf`` (dev dependencies, pinned), imported only here.

The ``.proto`` is compiled as ``spherecal/proto/spherecal.proto`` (the repository's
``spherecal/proto`` is the import path of ``proto/``), so the generated gRPC module
imports its messages as ``spherecal.proto.spherecal_pb2``: inside the namespace, never
as a top-level ``proto`` (which proto-plus also claims). protoc writes the messages'
stub (``*_pb2.pyi``) and mypy-protobuf the gRPC module's (``*_pb2_grpc.pyi``: typed
stubs and servicer), so gRPC calls are type-checked.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

# The repository root: this file is proto/_generate.py, imported as spherecal.proto._generate.
ROOT = Path(__file__).resolve().parent.parent
PROTO_FILE = "spherecal/proto/spherecal.proto"
GENERATED = (
    "spherecal_pb2.py",
    "spherecal_pb2.pyi",
    "spherecal_pb2_grpc.py",
    "spherecal_pb2_grpc.pyi",
)


def _plugin(name: str) -> str:
    """The path of a protoc plugin installed beside this interpreter (mypy-protobuf's)."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: install the dev extra (mypy-protobuf)")
    return found


def generate(out_root: Path) -> list[Path]:
    """Write the generated modules under ``out_root/spherecal/proto/``; return their paths."""
    from grpc_tools import protoc  # dev dependency

    out_dir = out_root / "spherecal" / "proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        str(ROOT / PROTO_FILE),
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")
    return [out_dir / name for name in GENERATED]


def main() -> int:
    for path in generate(ROOT):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
