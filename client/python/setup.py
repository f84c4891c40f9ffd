"""Builds the offloadd SDK. The message and stub modules (offloadd/v1/*_pb2*.py) are generated
from the repository's proto/ directory when they are missing or older than it, so
`pip install client/python` works from a clone; in a build tree CMake has generated them already
(target offloadd_python_proto) and a wheel built there ships them."""

import pathlib

from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent
PROTO_DIR = HERE.parent.parent / "proto"
PROTOS = ["offloadd/v1/job.proto", "offloadd/v1/job_service.proto", "offloadd/v1/node_service.proto"]


def generate_stubs() -> None:
    out = HERE / "offloadd" / "v1"
    newest_proto = max((PROTO_DIR / p).stat().st_mtime for p in PROTOS) if PROTO_DIR.is_dir() else 0
    stub = out / "job_pb2.py"
    if stub.exists() and stub.stat().st_mtime >= newest_proto:
        return
    if not PROTO_DIR.is_dir():
        raise SystemExit(f"offloadd SDK: {out} has no generated stubs and {PROTO_DIR} (the repository's "
                         "proto/) is not there to generate them from; build from a clone of the repository")
    from grpc_tools import protoc  # build requirement (pyproject.toml)
    import grpc_tools

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = ["grpc_tools.protoc", f"--proto_path={PROTO_DIR}", f"--proto_path={include}",
            f"--python_out={HERE}", f"--pyi_out={HERE}", f"--grpc_python_out={HERE}", *PROTOS]
    if protoc.main(args) != 0:
        raise SystemExit("offloadd SDK: grpc_tools.protoc failed on " + ", ".join(PROTOS))
    (out / "__init__.py").touch()


# Before setup(): the package finder must see offloadd.v1 once it exists.
generate_stubs()
setup()
