"""GGUF files the workbench writes: a model's tensors with another file's metadata, and the
f16 copy of a quantised GGUF that the llama.cpp backend decodes by default for small models.

Why the copy: llama.cpp multiplies quantised weights (Q4_1, Q8_0, ...) by activations it
quantises to 8 bits as well. On the bundled 135M model that changed 9 of 16 greedy answers
against the same weights in fp32 ("What is the capital of France?" -> "L'Étoile, la
Marseillaise, ..."), and a distillation in the browser test accepted nothing. The same
weights dequantised to f16 (exact for Q4_1's 4-bit codes and f16 scales up to one f16
rounding) gave 15 of 16 answers identical to transformers at about 0.7x the quantised file's
speed (BENCHMARKS.md, "Generation engines"). Writing uses ggml-org's `gguf` package, which
transformers already needs to read GGUF files.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.errors import DataError
from workbench.models.publish import publish_once

FLOAT_FILE_TYPES = {0: "f32", 1: "f16", 32: "bf16"}  # general.file_type of unquantised files


def write_gguf(out: Path, reader, arch: str, tensors: Mapping[str, Any], *, out_type: str,
               name: str) -> None:
    """Write `out` atomically: `reader`'s metadata (but its name and file type) and
    `tensors` (GGUF name -> float32 array) in the reader's order, as `out_type` ("f32",
    "f16" or "q8_0"; norms and other vectors stay f32, as llama.cpp writes them)."""
    import gguf
    import numpy as np

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, arch)
        skip = {"general.architecture", "general.name", "general.file_type",
                "general.quantization_version"}
        for field in reader.fields.values():
            if field.name.startswith("GGUF.") or field.name in skip:
                continue
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
        w.add_string("general.name", name)
        w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                         "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[out_type])
        if out_type == "q8_0":
            w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for t in reader.tensors:  # the base's order
            data = np.ascontiguousarray(tensors[t.name], dtype=np.float32)
            if data.ndim == 1 or out_type == "f32":
                w.add_tensor(t.name, data)
            elif out_type == "f16":
                w.add_tensor(t.name, data.astype(np.float16))
            else:
                q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
                w.add_tensor(t.name, q, raw_shape=q.shape,
                             raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class _Dequantised(Mapping):
    """GGUF name -> float32 array, dequantised when read: `write_gguf` reads one tensor at a
    time and keeps only its output type, so a copy never holds the whole model in f32."""

    def __init__(self, reader):
        self.tensors = {t.name: t for t in reader.tensors}

    def __getitem__(self, name: str):
        import gguf

        t = self.tensors[name]
        return gguf.quants.dequantize(t.data, t.tensor_type).reshape(
            [int(d) for d in reversed(t.shape)])

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


def dequantised_tensors(reader) -> Mapping[str, Any]:
    """Every tensor of a GGUF file as a float32 array in GGUF layout (each made when read)."""
    return _Dequantised(reader)


F16_FILE = "model-f16.gguf"
_DONE = "workbench-f16.json"  # written last: a folder without it is unfinished


def f16_copy(gguf_path: Path, folder: Path) -> Path:
    """`gguf_path` with every quantised matrix dequantised to f16 (vectors f32), written once
    into `folder` (atomically, under the model cache's conversion lock) and reused."""
    def write(tmp: Path) -> None:
        import gguf

        reader = gguf.GGUFReader(str(gguf_path))
        arch_field = reader.get_field("general.architecture")
        if arch_field is None:
            raise DataError("a GGUF without general.architecture", path=str(gguf_path))
        arch = arch_field.contents()
        name = reader.get_field("general.name")
        tmp.mkdir(parents=True, exist_ok=True)
        write_gguf(tmp / F16_FILE, reader, arch, dequantised_tensors(reader), out_type="f16",
                   name=f"{name.contents() if name else gguf_path.stem} (f16)")
        (tmp / _DONE).write_text(json.dumps({"gguf": str(gguf_path)}))

    publish_once(folder, write, complete=lambda f: (f / _DONE).is_file() and
                 (f / F16_FILE).is_file())
    return folder / F16_FILE
