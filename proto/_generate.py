"""Regenerate the committed protobuf / gRPC modules from ``spherecal.proto``.

Run ``python -m proto._generate`` after editing the ``.proto``. A test calls
:func:`generate` into a temporary directory and fails when the committed files differ,
so the contract and the code can never drift apart silently. Needs ``grpcio-tools``
(a dev dependency), imported only here.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
ROOT = PROTO_DIR.parent
PROTO_FILE = "proto/spherecal.proto"
GENERATED = ("spherecal_pb2.py", "spherecal_pb2.pyi", "spherecal_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Write the generated modules under ``out_root/proto/`` and return their paths."""
    from grpc_tools import protoc  # dev dependency

    (out_root / "proto").mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        str(ROOT / PROTO_FILE),
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")
    return [out_root / "proto" / name for name in GENERATED]


def main() -> int:
    for path in generate(ROOT):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
