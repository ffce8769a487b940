"""Read a GGUF file's header without its arrays: `gguf.GGUFReader` parses every tensor and
the whole vocabulary (3 s for the bundled model), where one number is wanted."""

from __future__ import annotations

import os
from pathlib import Path


def context_length(gguf: Path) -> int | None:
    """`<arch>.context_length` from the GGUF header, read without the vocabulary arrays."""
    import struct

    try:
        with open(gguf, "rb") as fh:
            if fh.read(4) != b"GGUF":
                return None
            version, _, n_kv = struct.unpack("<IQQ", fh.read(20))
            if version < 2:
                return None
            for _ in range(min(n_kv, 4096)):
                (klen,) = struct.unpack("<Q", fh.read(8))
                key = fh.read(klen).decode("utf-8", "replace")
                (vtype,) = struct.unpack("<I", fh.read(4))
                value = _skip_value(fh, vtype)
                if key.endswith(".context_length") and isinstance(value, int):
                    return value
    except (OSError, struct.error, ValueError):
        return None
    return None


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}


def _skip_value(fh, vtype: int):
    """Read (scalars, strings) or skip (arrays) one GGUF metadata value."""
    import struct

    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        (v,) = struct.unpack(fmt, fh.read(struct.calcsize(fmt)))
        return v
    if vtype == 8:  # string
        (n,) = struct.unpack("<Q", fh.read(8))
        return fh.read(n).decode("utf-8", "replace")
    if vtype == 9:  # array: element type, count, elements
        etype, count = struct.unpack("<IQ", fh.read(12))
        if etype in _SCALARS:
            fh.seek(struct.calcsize(_SCALARS[etype]) * count, os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip_value(fh, etype)
        return None
    raise ValueError(f"unknown GGUF value type {vtype}")
