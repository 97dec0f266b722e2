"""The memmapped package format that TensorFlow's `MemmappedEnv` reads (SPEC.md):

    [region 0][pad][region 1][pad]...[GraphDef region][MemmappedFileSystemDirectory][u64 LE]

- each region starts at a multiple of 64 bytes (zero padding before it): Eigen needs its
  tensors aligned, and ImmutableConst maps a region without copying;
- the directory lists `element {name, offset, length}` with names `memmapped_package://...`;
  the GraphDef is the region `memmapped_package://.`;
- the last 8 bytes are the directory's offset, little-endian.

Consts of a plain-old-data dtype (quint8/qint8 included) of at least `min_bytes` become
`ImmutableConst` nodes naming their region. The reader checks everything it relies on
(offsets, alignment, bounds, sizes) and raises MemmappedFormatError, never crashes.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import DataError

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

PREFIX = "memmapped_package://"
GRAPH_REGION = PREFIX + "."
ALIGNMENT = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_.]")


class MemmappedFormatError(DataError):
    """A file is not a valid memmapped package (exit 2: the input is wrong)."""


@dataclass(frozen=True)
class Region:
    name: str
    offset: int
    length: int


@dataclass
class Package:
    """A parsed package: its regions (file order) and its GraphDef of ImmutableConst nodes."""

    data: bytes = field(repr=False)
    regions: list[Region]
    graph_def: GraphDef

    def region(self, name: str) -> bytes:
        found = next((r for r in self.regions if r.name == name), None)
        if found is None:
            raise MemmappedFormatError(f"memmapped package has no region {name!r}")
        return self.data[found.offset:found.offset + found.length]

    def converted_nodes(self) -> list[dict[str, Any]]:
        """The ImmutableConst nodes: name, region, dtype, shape, bytes."""
        import tensorflow as tf

        sizes = {r.name: r.length for r in self.regions}
        return [{"node": n.name, "region": n.attr["memory_region_name"].s.decode(),
                 "dtype": tf.as_dtype(n.attr["dtype"].type).name,
                 "shape": [d.size for d in n.attr["shape"].shape.dim],
                 "bytes": sizes.get(n.attr["memory_region_name"].s.decode(), 0)}
                for n in self.graph_def.node if n.op == "ImmutableConst"]


def region_name(node_name: str, used: set[str]) -> str:
    """`memmapped_package://<sanitized name>`: characters outside [A-Za-z0-9_.] become
    '_', and a name already taken gets '_' appended until it is unique."""
    name = _UNSAFE.sub("_", node_name)
    while name in used:
        name += "_"
    used.add(name)
    return PREFIX + name


def _pod(dtype_enum: int) -> bool:
    """Plain old data: bytes that can be mapped as they are (no strings, handles)."""
    import tensorflow as tf

    try:
        dtype = tf.as_dtype(dtype_enum)
    except TypeError:
        return False
    return dtype not in (tf.string, tf.resource, tf.variant) and dtype.is_numpy_compatible


def tensor_bytes(tensor_proto: Any) -> bytes:
    """A TensorProto's values as raw little-endian bytes (as TF's Tensor holds them)."""
    import numpy as np
    import tensorflow as tf

    array = np.ascontiguousarray(tf.make_ndarray(tensor_proto))
    if array.dtype.byteorder == ">":
        array = array.byteswap().view(array.dtype.newbyteorder("<"))
    return array.tobytes()


def convert(graph_def: GraphDef, min_bytes: int) -> tuple[GraphDef, list[tuple[str, bytes]]]:
    """The GraphDef with every big POD Const turned into an ImmutableConst, and the
    (region name, bytes) of each, in node order."""
    import tensorflow as tf

    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    used: set[str] = set()
    regions: list[tuple[str, bytes]] = []
    for node in out.node:
        if node.op != "Const" or not _pod(node.attr["dtype"].type):
            continue
        value = node.attr["value"].tensor
        data = tensor_bytes(value)
        if not data or len(data) < min_bytes:
            continue
        name = region_name(node.name, used)
        regions.append((name, data))
        dtype, shape = node.attr["dtype"].type, value.tensor_shape
        node.op = "ImmutableConst"
        node.attr.clear()
        node.attr["dtype"].type = dtype
        node.attr["shape"].shape.CopyFrom(shape)
        node.attr["memory_region_name"].s = name.encode()
    return out, regions


def _pad(length: int) -> int:
    return -length % ALIGNMENT


def write_package(graph_def: GraphDef, min_bytes: int) -> tuple[bytes, GraphDef]:
    """The package bytes and the GraphDef of ImmutableConst nodes stored in it."""
    from orchestrator.model.tf_adapter import memmapped_directory_proto

    converted, regions = convert(graph_def, min_bytes)
    regions.append((GRAPH_REGION, converted.SerializeToString(deterministic=True)))
    directory = memmapped_directory_proto()
    chunks: list[bytes] = []
    offset = 0
    for name, data in regions:
        padding = _pad(offset)
        chunks.append(b"\0" * padding)
        offset += padding
        element = directory.element.add()
        element.name, element.offset, element.length = name, offset, len(data)
        chunks.append(data)
        offset += len(data)
    chunks.append(directory.SerializeToString(deterministic=True))
    chunks.append(struct.pack("<Q", offset))
    return b"".join(chunks), converted


def read_package(data: bytes) -> Package:
    """Parse and check a package: directory offset, every region's alignment and bounds,
    no overlaps, the graph region, and that each ImmutableConst's region holds exactly
    its tensor's bytes."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.framework import graph_pb2

    from orchestrator.model.tf_adapter import memmapped_directory_proto

    if len(data) < 8:
        raise MemmappedFormatError(f"not a memmapped package: {len(data)} bytes is too short "
                                   "to hold the directory offset (8 bytes)")
    (dir_offset,) = struct.unpack("<Q", data[-8:])
    if dir_offset > len(data) - 8:
        raise MemmappedFormatError(f"corrupt memmapped package: the directory offset "
                                   f"{dir_offset} (last 8 bytes) points past the end of the "
                                   f"{len(data)}-byte file")
    directory = memmapped_directory_proto()
    try:
        directory.ParseFromString(data[dir_offset:-8])
    except DecodeError as exc:
        raise MemmappedFormatError(f"corrupt memmapped package: no directory at offset "
                                   f"{dir_offset} ({exc})") from exc
    regions = [Region(e.name, int(e.offset), int(e.length)) for e in directory.element]
    if not regions:
        raise MemmappedFormatError(f"corrupt memmapped package: the directory at offset "
                                   f"{dir_offset} lists no regions")
    end = 0
    for region in sorted(regions, key=lambda r: r.offset):
        if not region.name.startswith(PREFIX):
            raise MemmappedFormatError(f"corrupt memmapped package: region name "
                                       f"{region.name!r} lacks the {PREFIX} prefix")
        if region.offset % ALIGNMENT:
            raise MemmappedFormatError(f"region {region.name} starts at {region.offset}, "
                                       f"not a multiple of {ALIGNMENT}")
        if region.offset < end or region.offset + region.length > dir_offset:
            raise MemmappedFormatError(f"corrupt memmapped package: region {region.name} "
                                       f"[{region.offset}, {region.offset + region.length}) "
                                       f"overlaps another or the directory at {dir_offset}")
        end = region.offset + region.length
    if len({r.name for r in regions}) != len(regions):
        raise MemmappedFormatError("corrupt memmapped package: duplicate region names")
    package = Package(data=data, regions=regions, graph_def=graph_pb2.GraphDef())
    try:
        package.graph_def.ParseFromString(package.region(GRAPH_REGION))
    except DecodeError as exc:
        raise MemmappedFormatError(f"corrupt memmapped package: region {GRAPH_REGION} is not "
                                   f"a GraphDef ({exc})") from exc
    for node in package.graph_def.node:
        if node.op == "ImmutableConst":
            _check_region(package, node)
    return package


def _expected_bytes(node: Any) -> int:
    import numpy as np
    import tensorflow as tf

    dims = [d.size for d in node.attr["shape"].shape.dim]
    return int(np.prod(dims, dtype=np.int64)) * tf.as_dtype(node.attr["dtype"].type).size


def _check_region(package: Package, node: Any) -> None:
    name = node.attr["memory_region_name"].s.decode()
    length = len(package.region(name))
    if length != _expected_bytes(node):
        raise MemmappedFormatError(f"region {name} holds {length} bytes; node {node.name}'s "
                                   f"tensor needs {_expected_bytes(node)}")


def rebuild(package: Package) -> GraphDef:
    """A plain GraphDef: every ImmutableConst back into a Const holding its region's bytes
    (bit-identical values)."""
    import tensorflow as tf

    out = tf.compat.v1.GraphDef()
    out.CopyFrom(package.graph_def)
    for node in out.node:
        if node.op != "ImmutableConst":
            continue
        dtype, shape = node.attr["dtype"].type, node.attr["shape"].shape
        content = package.region(node.attr["memory_region_name"].s.decode())
        node.op = "Const"
        node.attr.clear()
        node.attr["dtype"].type = dtype
        tensor = node.attr["value"].tensor
        tensor.dtype = dtype
        tensor.tensor_shape.CopyFrom(shape)
        tensor.tensor_content = content
    return out


def write_runnable(package: Package, folder: Path) -> GraphDef:
    """The directly runnable variant: one weight file per region in `folder`, and the
    package's GraphDef with each ImmutableConst naming its file's absolute path, which the
    default Env maps (read-only, shared, not copied) when the node first runs."""
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(package.graph_def)
    for node in out.node:
        if node.op != "ImmutableConst":
            continue
        name = node.attr["memory_region_name"].s.decode()
        path = (folder / (name.removeprefix(PREFIX) + ".bin")).resolve()
        path.write_bytes(package.region(name))
        node.attr["memory_region_name"].s = str(path).encode()
    return out
