"""A bounds check of a GGUF file's layout, run before ``gguf.GGUFReader`` walks it.

The reader trusts every count in the file. An array that declares 2**60 fixed-size items
reads, past the end of the file, as empty items forever: a hang while its list of parts
grows without bound. Other bad counts surface as bare IndexErrors. This walk reads only
the header (key/value metadata and tensor descriptions) and refuses any length, count or
tensor extent that the file cannot hold, naming the key or the tensor. It is cheap:
fixed-size arrays are skipped by arithmetic and only string arrays (the vocabulary) are
stepped through, a small fraction of the reader's own time.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from crucible.errors import ModelLoadError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # what gguf.GGUFReader reads
MAX_DIMS = 4  # GGML_MAX_DIMS
STRING, ARRAY = 8, 9  # GGUFValueType codes
# GGUFValueType code -> bytes per item for the fixed-size types
FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
DEFAULT_ALIGNMENT = 32
MAX_NESTING = 8  # arrays of arrays (the reader allows them; no Llama model has any)


class _Cursor:
    """Reads little- or big-endian integers from ``buf``, each read checked against its end."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos, self.order = buf, path, 0, "<"

    def fail(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path}: not a readable GGUF file: {what}")

    def skip(self, n: int, what: str) -> int:
        start = self.pos
        if n > len(self.buf) - start:
            raise self.fail(f"{what} needs {n:,} bytes at offset {start:,}, but the file "
                            f"ends at {len(self.buf):,} (truncated or corrupt)")
        self.pos += n
        return start

    def uint(self, size: int, what: str) -> int:
        start = self.skip(size, what)
        return struct.unpack_from(self.order + ("I" if size == 4 else "Q"), self.buf, start)[0]

    def string(self, what: str) -> bytes:
        n = self.uint(8, f"the length of {what}")
        start = self.skip(n, what)
        return bytes(self.buf[start:start + n])


def _value(c: _Cursor, vtype: int, key: str, depth: int = 0) -> int | None:
    """Step over one value of type ``vtype``; return it when it is a UINT32 (the alignment)."""
    if vtype in FIXED_SIZES:
        start = c.skip(FIXED_SIZES[vtype], f"the value of {key!r}")
        return struct.unpack_from(c.order + "I", c.buf, start)[0] if vtype == 4 else None
    if vtype == STRING:
        c.string(f"the value of {key!r}")
        return None
    if vtype != ARRAY:
        raise c.fail(f"metadata {key!r} has unknown value type {vtype}")
    if depth >= MAX_NESTING:  # else a file of nested array headers is a RecursionError
        raise c.fail(f"metadata {key!r} nests arrays more than {MAX_NESTING} deep")
    itype = c.uint(4, f"the item type of {key!r}")
    count = c.uint(8, f"the item count of {key!r}")
    if itype in FIXED_SIZES:
        c.skip(count * FIXED_SIZES[itype], f"the {count:,} items of {key!r}")
    elif itype in (STRING, ARRAY):
        least = 8 if itype == STRING else 12  # a length, or an item type and a count
        if count * least > len(c.buf) - c.pos:
            raise c.fail(f"{key!r} declares {count:,} items, more than the file can hold")
        if itype == STRING:
            _strings(c, count, key)
        for _ in range(count if itype == ARRAY else 0):
            _value(c, ARRAY, key, depth + 1)
    else:
        raise c.fail(f"metadata {key!r} has items of unknown type {itype}")
    return None


def _strings(c: _Cursor, count: int, key: str) -> None:
    """Step over ``count`` strings: the vocabulary's 49,152 tokens and as many merges, so
    the loop is kept tight and the message is built only on failure."""
    unpack, buf, end, pos = struct.Struct(c.order + "Q").unpack_from, c.buf, len(c.buf), c.pos
    for i in range(count):
        if pos + 8 > end or pos + 8 + unpack(buf, pos)[0] > end:
            c.pos = pos
            c.string(f"item {i} of {key!r}")  # raises, naming the item
        pos += 8 + unpack(buf, pos)[0]
    c.pos = pos


def check_gguf_layout(path: Path) -> None:
    """Raise ModelLoadError, naming the part, if the header of ``path`` does not fit in it."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            raise ModelLoadError(f"{path}: not a readable GGUF file: it is empty (0 bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            c = _Cursor(buf, path)
            c.skip(4, "the GGUF magic")
            magic = bytes(buf[0:4])
            if magic != MAGIC:
                raise c.fail(f"magic {magic!r} is not {MAGIC!r}")
            version = c.uint(4, "the version")
            if version & 0xFFFF == 0:  # written on a machine of the other byte order
                c.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
            if version not in VERSIONS:
                raise c.fail(f"version {version} is not supported (only 2 and 3)")
            n_tensors = c.uint(8, "the tensor count")
            n_kv = c.uint(8, "the metadata count")
            alignment = DEFAULT_ALIGNMENT
            for i in range(n_kv):
                key = c.string(f"metadata key {i}").decode("utf-8", "replace")
                got = _value(c, c.uint(4, f"the type of {key!r}"), key)
                if key == "general.alignment" and got is not None:
                    alignment = got
            if alignment == 0 or alignment & (alignment - 1):
                raise c.fail(f"general.alignment = {alignment} is not a power of two")
            extents = []
            for i in range(n_tensors):
                name = c.string(f"the name of tensor {i}").decode("utf-8", "replace")
                n_dims = c.uint(4, f"the rank of tensor {name!r}")
                if n_dims > MAX_DIMS:
                    raise c.fail(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
                dims = [c.uint(8, f"the shape of tensor {name!r}") for _ in range(n_dims)]
                kind = c.uint(4, f"the type of tensor {name!r}")
                offset = c.uint(8, f"the data offset of tensor {name!r}")
                extents.append((name, dims, kind, offset))
            data_start = -(-c.pos // alignment) * alignment
            for name, dims, kind, offset in extents:
                try:
                    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
                except (ValueError, KeyError):
                    raise c.fail(f"tensor {name!r} has unknown type {kind}") from None
                n = 1
                for d in dims:
                    n *= d
                if n % block:
                    raise c.fail(f"tensor {name!r} of shape {dims} is not whole blocks of "
                                 f"{block} values")
                end = data_start + offset + n // block * size
                if end > len(buf):
                    raise c.fail(f"tensor {name!r} of shape {dims} ends at byte {end:,}, "
                                 f"past the end of the file at {len(buf):,} (truncated?)")
