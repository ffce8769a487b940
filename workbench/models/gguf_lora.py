"""A PEFT LoRA adapter written as a GGUF LoRA adapter, the form llama.cpp loads beside its
base model at run time (`--lora`), so a freshly trained adapter generates there unmerged.

The layout is llama.cpp's own (`convert_lora_to_gguf.py`): `general.type = adapter`,
`adapter.type = lora`, `adapter.lora.alpha`, and for each adapted weight `<name>.lora_a`
(rank x in) and `<name>.lora_b` (out x rank) under the base tensor's GGUF name. llama.cpp
scales each pair by alpha / rank; PEFT by lora_alpha / r (lora_alpha / sqrt(r) with rsLoRA,
per module with `alpha_pattern` / `rank_pattern`), so alpha is written as PEFT's scaling x
rank and any module whose scaling differs has it folded into its B. The query and key
projections' B rows are permuted as llama.cpp's converter permutes those weights (rotary
halves interleaved per head).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.models.gguf_header import header_values
from workbench.models.publish import publish_once

DONE = "workbench-lora.json"  # written last: a cache folder without it is unfinished


def permute_rotary(w, n_head: int):
    """llama.cpp's layout of a query/key projection's rows (rotary halves interleaved per
    head); `w` is (out, ...) with out = n_head x head_dim."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _module_of(key: str) -> tuple[str, str] | None:
    """("model.layers.0.self_attn.q_proj", "A" | "B") of a PEFT tensor name."""
    for part in ("lora_A", "lora_B"):
        marker = f".{part}."
        if marker in key:
            module = key.split(marker)[0]
            for prefix in ("base_model.model.", "base_model."):
                if module.startswith(prefix):
                    module = module[len(prefix):]
                    break
            return module, part[-1]
    return None


def lora_tensors(adapter: Path, *, arch: str, n_blocks: int, n_head: int,
                 n_head_kv: int) -> tuple[dict[str, Any], float]:
    """(GGUF tensors name -> float32 array, alpha) of a PEFT LoRA adapter folder."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    cfg = json.loads((adapter / "adapter_config.json").read_text())
    if cfg.get("use_dora"):
        raise WorkbenchError(f"{adapter}: a DoRA adapter has no llama.cpp form; merge it "
                             "(`workbench train export-gguf`)")
    if cfg.get("bias", "none") != "none" or cfg.get("modules_to_save"):
        raise WorkbenchError(f"{adapter}: the adapter trains biases or whole modules "
                             "(modules_to_save), which a GGUF LoRA adapter cannot hold; "
                             "merge it (`workbench train export-gguf`)")
    state = load_file(str(adapter / "adapter_model.safetensors"))
    r, alpha = int(cfg["r"]), float(cfg.get("lora_alpha") or cfg["r"])
    rslora = bool(cfg.get("use_rslora"))

    def scaling(module: str) -> float:
        rank, a = r, alpha
        for pat, v in (cfg.get("rank_pattern") or {}).items():
            if module.endswith(pat):
                rank = int(v)
        for pat, v in (cfg.get("alpha_pattern") or {}).items():
            if module.endswith(pat):
                a = float(v)
        return a / (rank ** 0.5 if rslora else rank)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], n_blocks)
    pairs: dict[str, dict[str, Any]] = {}
    for key, w in state.items():
        parsed = _module_of(key)
        if parsed is None:
            raise WorkbenchError(f"{adapter}: tensor {key} is not a LoRA A or B matrix (only "
                                 "LoRA pairs can be written as a GGUF adapter)")
        module, part = parsed
        pairs.setdefault(module, {})[part] = w.astype(np.float32)
    tensors: dict[str, Any] = {}
    base_scale = alpha / (r ** 0.5 if rslora else r)
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise WorkbenchError(f"{adapter}: {module} has only lora_{''.join(ab)}")
        new = names.get_name(module + ".weight", try_suffixes=(".weight",))
        if new is None:
            raise WorkbenchError(f"{adapter}: {module} has no GGUF name ({arch} layout)")
        a, b = ab["A"], ab["B"]
        factor = scaling(module) / base_scale * a.shape[0] / r
        if abs(factor - 1.0) > 1e-9:  # this module's scaling differs from alpha / rank
            b = b * np.float32(factor)
        if module.endswith("q_proj"):
            b = permute_rotary(b, n_head)
        elif module.endswith("k_proj"):
            b = permute_rotary(b, n_head_kv)
        tensors[f"{new}.lora_a"] = np.ascontiguousarray(a)
        tensors[f"{new}.lora_b"] = np.ascontiguousarray(b)
    if not tensors:
        raise WorkbenchError(f"{adapter}: the adapter holds no LoRA tensors")
    return tensors, base_scale * r


def write_lora_gguf(adapter: str | Path, base_gguf: str | Path, out: str | Path) -> dict:
    """Write `adapter` (a PEFT LoRA folder) as a GGUF LoRA adapter for `base_gguf` at `out`
    (atomically). Returns what was written."""
    import gguf

    adapter, base_gguf, out = Path(adapter), Path(base_gguf), Path(out)
    # the header's numbers only: gguf.GGUFReader would parse the whole vocabulary (seconds)
    head = header_values(base_gguf, ("general.architecture", ".block_count",
                                     ".attention.head_count", ".attention.head_count_kv"))
    arch = head.get("general.architecture")
    if arch != "llama":
        raise WorkbenchError(f"{base_gguf.name}: architecture {arch!r}; GGUF LoRA adapters "
                             "are written for llama-layout models only")
    n_head, n_blocks = head.get(f"{arch}.attention.head_count"), head.get(f"{arch}.block_count")
    n_head_kv = head.get(f"{arch}.attention.head_count_kv") or n_head
    if not (isinstance(n_head, int) and isinstance(n_blocks, int)
            and isinstance(n_head_kv, int)):
        raise WorkbenchError(f"{base_gguf.name}: the header gives no single head count and "
                             "block count (a GGUF LoRA adapter needs both)")
    tensors, alpha = lora_tensors(adapter, arch=arch, n_blocks=n_blocks, n_head=n_head,
                                  n_head_kv=n_head_kv)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_string("general.type", "adapter")
        w.add_string("general.name", f"LoRA {adapter.name}")
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", float(alpha))
        for name, t in tensors.items():
            w.add_tensor(name, t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {"adapter": str(adapter), "base": str(base_gguf), "gguf": str(out),
            "tensors": len(tensors), "alpha": alpha, "bytes": out.stat().st_size}


def adapter_fingerprint(adapter: Path) -> str:
    h = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        with open(adapter / name, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def cached_lora_gguf(adapter: str | Path, base_gguf: Path, cache_dir: Path) -> Path:
    """The GGUF form of `adapter` for `base_gguf`, converted once into `cache_dir` (keyed by
    the adapter's bytes and the base file)."""
    adapter = Path(adapter)
    st = base_gguf.stat()
    base_tag = hashlib.sha256(f"{base_gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}"
                              .encode()).hexdigest()[:12]
    target = cache_dir / f"lora-{adapter_fingerprint(adapter)[:16]}-{base_tag}"

    def write(tmp: Path) -> None:
        report = write_lora_gguf(adapter, base_gguf, tmp / "adapter.gguf")
        (tmp / DONE).write_text(json.dumps(report))

    publish_once(target, write, complete=lambda f: (f / DONE).is_file())
    return target / "adapter.gguf"
