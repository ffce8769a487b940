"""Read a GGUF file's header without its arrays: `gguf.GGUFReader` parses every tensor and
the whole vocabulary (3 s for the bundled model), where a few numbers are wanted."""

from __future__ import annotations

import os
from pathlib import Path


def header_values(gguf: Path, suffixes: tuple[str, ...]) -> dict[str, object]:
    """The scalar and string metadata values whose keys end with one of `suffixes`, read
    without the arrays (missing keys, or a file that is not GGUF, give none)."""
    import struct

    found: dict[str, object] = {}
    try:
        with open(gguf, "rb") as fh:
            head = _header(fh)
            if head is None:
                return found
            for key, value, _ in _entries(fh, min(head[1], MAX_KEYS)):
                if value is not None and key.endswith(suffixes):
                    found[key] = value
    except (OSError, struct.error, ValueError):
        return found
    return found


def tokenizer_fingerprint(gguf: Path) -> str | None:
    """A digest of what a GGUF's tokenizer is made of: the raw bytes of every `tokenizer.*`
    value, of `general.architecture` (which picks transformers' converter) and of
    `general.name` (transformers reads a "mistral" or "umt5" there as another model type and
    tokenizer class), read without building the arrays (a tenth of a second for a 49k
    vocabulary, where parsing it takes seconds). Two files with the same digest give the same
    Hugging Face tokenizer. None for a file that is not GGUF, whose header cannot be read, or
    whose header has more keys than are read (`MAX_KEYS`)."""
    import hashlib
    import struct

    digest = hashlib.sha256()
    try:
        with open(gguf, "rb") as fh:
            head = _header(fh)
            if head is None or head[1] > MAX_KEYS:
                return None
            digest.update(struct.pack("<I", head[0]))
            for key, _, start in _entries(fh, head[1]):
                if key.startswith("tokenizer.") or key in ("general.architecture",
                                                           "general.name"):
                    end = fh.tell()
                    fh.seek(start)
                    digest.update(fh.read(end - start))
    except (OSError, struct.error, ValueError):
        return None
    return digest.hexdigest()


def context_length(gguf: Path) -> int | None:
    """`<arch>.context_length` from the GGUF header, read without the vocabulary arrays."""
    value = next(iter(header_values(gguf, (".context_length",)).values()), None)
    return value if isinstance(value, int) else None


def file_type(gguf: Path) -> int | None:
    """`general.file_type` (llama.cpp's `LLAMA_FTYPE_*`: 0 f32, 1 f16, 32 bf16, else a
    quantisation), or None when the header does not say."""
    value = header_values(gguf, ("general.file_type",)).get("general.file_type")
    return value if isinstance(value, int) else None


MAX_KEYS = 4096  # most metadata keys read from a header (llama.cpp's own files have ~40)


def _header(fh) -> tuple[int, int] | None:
    """(version, number of metadata keys) from the start of a GGUF file; None if not GGUF."""
    import struct

    if fh.read(4) != b"GGUF":
        return None
    version, _, n_kv = struct.unpack("<IQQ", fh.read(20))
    return None if version < 2 else (version, n_kv)


def _entries(fh, n: int):
    """The next `n` metadata entries as (key, value, offset where the entry starts); arrays
    are skipped (value None) and the file is left at the entry's end when one is yielded."""
    import struct

    for _ in range(n):
        start = fh.tell()
        (klen,) = struct.unpack("<Q", fh.read(8))
        key = fh.read(klen).decode("utf-8", "replace")
        (vtype,) = struct.unpack("<I", fh.read(4))
        yield key, _skip_value(fh, vtype), start


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
        elif etype == 8:  # strings, skipped by their lengths (a vocabulary: ~50k of them)
            for _ in range(count):
                (n,) = struct.unpack("<Q", fh.read(8))
                fh.seek(n, os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip_value(fh, etype)
        return None
    raise ValueError(f"unknown GGUF value type {vtype}")
