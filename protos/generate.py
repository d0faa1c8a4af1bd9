"""Regenerate the Python stubs for every .proto under protos/.

Usage: python protos/generate.py [--out DIR]

Each ``protos/<api>/<version>/<name>.proto`` becomes
``<out>/numa_device_plugin/api/<api>/<version>/<name>_pb2.py`` (+ ``_pb2.pyi``,
``_pb2_grpc.py``). The proto path is mapped onto the package path so the
generated gRPC module imports its messages by absolute package name. ``--out``
defaults to the repository root; tests point it at a temp folder and compare.
The output depends only on the .proto files and the pinned grpcio-tools version.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROTOS = Path(__file__).resolve().parent
PACKAGE = "numa_device_plugin/api"


def generate(out: Path) -> list[Path]:
    """Run protoc for every .proto file; return the generated files' paths.

    Raises RuntimeError when protoc reports an error.
    """
    from grpc_tools import protoc  # dev dependency, imported only here

    written: list[Path] = []
    for proto in sorted(PROTOS.rglob("*.proto")):
        rel = proto.parent.relative_to(PROTOS).as_posix()
        args = [
            "protoc",
            f"-I{PACKAGE}/{rel}={proto.parent}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {proto}")
        stem = proto.stem
        target = out / PACKAGE / rel
        written += [target / f"{stem}_pb2.py", target / f"{stem}_pb2.pyi"]
        written.append(target / f"{stem}_pb2_grpc.py")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTOS.parent)
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
