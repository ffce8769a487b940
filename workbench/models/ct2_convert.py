"""Converting a Hugging Face folder into a cached CTranslate2 folder.

`convert_ct2` converts with `ctranslate2.converters.TransformersConverter` into
`workbench_home()/models/ct2-<name>-<quantization>-<key>` (or `cache_dir`), keyed by the source
files (names, sizes, mtimes), the quantization, the adapter's hash and the CTranslate2 major
version, and publishes it once (`publish.publish_once`) finished with a `COMPLETE` marker; a
folder without the marker is never loaded, it is rebuilt. A LoRA adapter is merged into a
temporary copy of the base model (peft `merge_and_unload`) and that copy is converted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from workbench.errors import BackendError, WorkbenchError
from workbench.io import sha256_file
from workbench.models.local import check_adapter_dir
from workbench.models.publish import publish_once
from workbench.models.resolve import workbench_home

log = logging.getLogger(__name__)

COMPLETE = "COMPLETE"  # written last: a conversion folder without it is never loaded
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                 "float16", "bfloat16", "float32")

# Conversions done by this process, per cache folder name (tests check reuse with it).
conversions: dict[str, int] = {}


def source_fingerprint(folder: Path) -> str:
    """A hash of the folder's files (relative name, size, mtime): changes when any file does,
    without reading gigabytes of weights on every load."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        st = p.stat()
        h.update(f"{rel.as_posix()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def adapter_fingerprint(adapter: Path) -> str:
    """sha256 of the adapter's weights and config (the merge depends on both)."""
    h = hashlib.sha256()
    h.update(sha256_file(adapter / "adapter_model.safetensors").encode())
    h.update((adapter / "adapter_config.json").read_bytes())
    return h.hexdigest()


def ct2_cache_dir(folder: Path, quantization: str, *, adapter: Path | None = None,
                  cache_dir: str | os.PathLike | None = None) -> Path:
    import ctranslate2

    parts = [source_fingerprint(folder), quantization,
             adapter_fingerprint(adapter) if adapter else "",
             ctranslate2.__version__.split(".")[0]]
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir else workbench_home() / "models"
    name = folder.name[:48] + ("+lora" if adapter else "")
    return root / f"ct2-{name}-{quantization}-{key}"


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE).is_file() and (folder / "model.bin").is_file()


def convert_ct2(folder: str | os.PathLike, quantization: str = "int8", *,
                adapter: str | os.PathLike | None = None,
                cache_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Convert a Hugging Face folder (with an optional LoRA adapter merged in) into a
    CTranslate2 folder once; return the cached folder.

    Published like `convert_gguf`'s (`publish.publish_once`): written into a temp folder,
    finished with `COMPLETE`, fsynced and renamed in under a per-folder lock. A folder
    under the final name without `COMPLETE` (a partial or broken conversion) is rebuilt."""
    folder = Path(folder)
    adapter_dir = check_adapter_dir(adapter) if adapter else None
    if quantization not in QUANTIZATIONS:
        raise WorkbenchError(f"quantization {quantization!r}: use one of "
                             f"{', '.join(QUANTIZATIONS)}")
    target = ct2_cache_dir(folder, quantization, adapter=adapter_dir, cache_dir=cache_dir)

    def write(tmp: Path) -> None:
        if target.exists() and not force:
            log.warning("%s: unfinished conversion (no %s); converting again", target, COMPLETE)
        t0 = time.perf_counter()
        log.info("converting %s to CTranslate2 %s (once)", folder, quantization)
        meta = _write_ct2(folder, tmp, quantization, adapter_dir)
        meta.update(seconds=round(time.perf_counter() - t0, 2))
        (tmp / COMPLETE).write_text(json.dumps(meta, indent=2))

    if publish_once(target, write, complete=is_complete, force=force):
        conversions[target.name] = conversions.get(target.name, 0) + 1
    return target


def _write_ct2(folder: Path, out: Path, quantization: str,
               adapter: Path | None) -> dict[str, Any]:
    import ctranslate2
    from transformers import AutoConfig, AutoTokenizer

    with tempfile.TemporaryDirectory(prefix=f".{out.name}.merge-", dir=out.parent) as merged:
        src = folder
        if adapter is not None:
            _merge_adapter(folder, adapter, Path(merged))
            src = Path(merged)
        try:
            ctranslate2.converters.TransformersConverter(
                str(src), low_cpu_mem_usage=True).convert(str(out), quantization=quantization,
                                                          force=True)
        except (NotImplementedError, ValueError, KeyError) as e:
            raise BackendError(f"{folder}: CTranslate2 cannot convert this model ({e})") from e
        tok = AutoTokenizer.from_pretrained(src)
        tok.save_pretrained(out)
        config = AutoConfig.from_pretrained(src)
        eos = _config_eos(src, config)
    if tok.eos_token_id is not None:
        eos.add(tok.eos_token_id)
    return {"source": str(folder), "adapter": str(adapter) if adapter else None,
            "adapter_sha256": adapter_fingerprint(adapter) if adapter else None,
            "quantization": quantization, "ctranslate2": ctranslate2.__version__,
            "max_position_embeddings": getattr(config, "max_position_embeddings", None),
            "eos_token_ids": sorted(eos)}


def _config_eos(folder: Path, config) -> set[int]:
    ids: Any = None
    if (folder / "generation_config.json").is_file():
        from transformers import GenerationConfig

        ids = GenerationConfig.from_pretrained(folder).eos_token_id
    if ids is None:
        ids = getattr(config, "eos_token_id", None)
    ids = ids if isinstance(ids, list) else [ids]
    return {int(i) for i in ids if i is not None}


def _merge_adapter(folder: Path, adapter: Path, out: Path) -> None:
    """The base model with the LoRA adapter merged in, saved as a plain HF folder."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(folder).save_pretrained(out)
    if (folder / "generation_config.json").is_file():
        shutil.copy2(folder / "generation_config.json", out / "generation_config.json")
