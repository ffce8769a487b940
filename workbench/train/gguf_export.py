"""An adapter merged into its base model and written as one GGUF file for llama.cpp and Ollama,
then loaded back through the workbench's own GGUF path and checked answer by answer.

The writer is ggml-org's `gguf` package (the Python half of llama.cpp, on PyPI; transformers
already needs it to read GGUF). llama.cpp's HF-to-GGUF converter (`convert_hf_to_gguf.py`) is
not on PyPI, so the tokenizer and hyper-parameters are not rebuilt here: they are copied from
the base model's own GGUF (the bundled model, or any `.gguf` spec), and only the weights are
new: the merged tensors, named by the `gguf` package's tensor map and laid out as llama.cpp's
converter lays them out (the query and key projections permuted for its rotary embedding).
A base that is not a GGUF file is refused with the way out (`workbench train merge`, then
llama.cpp's converter on the merged folder). Architectures: llama (SmolLM2, Llama, and the
many models that share its layout).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.io import check_replaceable
from workbench.models import load_model
from workbench.models.base import GenerationParams
from workbench.models.gguf_file import write_gguf
from workbench.models.gguf_header import header_values
from workbench.models.gguf_lora import permute_rotary, write_lora_gguf
from workbench.models.local import check_adapter_dir, gguf_cache_dir, model_folder
from workbench.models.resolve import resolve_chat_model
from workbench.train.merge import adapter_base

TYPES = ("f16", "f32", "q8_0")
CHECK_PROMPTS = ["Hello! How are you today?", "List three prime numbers.",
                 "What should I check first when something stops working?",
                 "Summarise what an impedance match does in one sentence."]


def gguf_tensors(state: dict[str, Any], *, n_blocks: int, n_head: int, n_head_kv: int,
                 tied: bool) -> dict[str, Any]:
    """HF llama tensors (name -> float32 numpy array) as GGUF tensors, in llama.cpp's names
    and layout. `tied`: the output projection is the token embedding (not written)."""
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_blocks)
    out = {}
    for name, w in state.items():
        if name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight"):
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise WorkbenchError(f"{name}: no GGUF name for this tensor (not a llama layout)")
        if name.endswith("q_proj.weight"):
            w = permute_rotary(w, n_head)
        elif name.endswith("k_proj.weight"):
            w = permute_rotary(w, n_head_kv)
        out[new] = w
    return out


def _field(reader, key: str):
    f = reader.get_field(key)
    return f.contents() if f is not None else None


def export_gguf(adapter: str | Path, out: str | Path, *, base: str | None = None,
                out_type: str = "f16", check: bool = True, prompts: list[str] | None = None,
                max_tokens: int = 32, log=print) -> dict[str, Any]:
    """Merge `adapter` into its base model (`base`, default: the adapter's manifest says
    which) and write `out` (.gguf). With `check`, the file is loaded back through the
    workbench's GGUF path and its greedy answers to `prompts` are compared with the merged
    model's. Returns a report (sizes, the check's agreement and answers)."""
    if out_type not in TYPES:
        raise WorkbenchError(f"--type {out_type!r}: expected one of {', '.join(TYPES)}")
    out = Path(out)
    if out.suffix != ".gguf":
        raise WorkbenchError(f"{out}: the output file must end in .gguf")
    check_replaceable(out)  # a folder, device or FIFO there is refused before any work
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    adapter = check_adapter_dir(adapter)
    base, source, arch = _gguf_base(adapter, base)
    import gguf

    reader = gguf.GGUFReader(str(source.gguf_path))  # its tokenizer and metadata are copied
    folder = model_folder(source)  # the base's weights as the workbench loads them
    cfg = AutoConfig.from_pretrained(folder)
    log(f"merging {adapter} into {base}")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload(safe_merge=True).eval()
    state = {k: v.detach().float().numpy() for k, v in merged.state_dict().items()}
    base_names = {t.name for t in reader.tensors}
    tensors = gguf_tensors(state, n_blocks=cfg.num_hidden_layers,
                           n_head=cfg.num_attention_heads,
                           n_head_kv=cfg.num_key_value_heads or cfg.num_attention_heads,
                           tied="output.weight" not in base_names)
    if set(tensors) != base_names:
        raise WorkbenchError(f"the merged tensors do not match {source.gguf_file}'s: missing "
                             f"{sorted(base_names - set(tensors))[:3]}, extra "
                             f"{sorted(set(tensors) - base_names)[:3]}")
    write_gguf(out, reader, arch, tensors, out_type=out_type,
                name=f"{_field(reader, 'general.name') or base} + {_adapter_name(adapter)}")
    report: dict[str, Any] = {"adapter": str(adapter), "base": base, "gguf": str(out),
                              "type": out_type, "bytes": out.stat().st_size,
                              "tensors": len(tensors)}
    log(f"wrote {out} ({report['bytes'] / 1e6:.0f} MB, {out_type})")
    if check:
        tok = AutoTokenizer.from_pretrained(folder)
        report.update(_check(merged, tok, out, prompts or CHECK_PROMPTS, max_tokens, log))
    return report


def export_lora_gguf(adapter: str | Path, out: str | Path, *, base: str | None = None
                     ) -> dict[str, Any]:
    """Write `adapter` unmerged as a GGUF LoRA adapter for its base model's GGUF (`base`,
    default: the adapter's manifest says which): what llama.cpp applies with `--lora`."""
    out = Path(out)
    if out.suffix != ".gguf":
        raise WorkbenchError(f"{out}: the output file must end in .gguf")
    check_replaceable(out)  # before anything heavy is imported or read

    adapter = check_adapter_dir(adapter)
    base, source, _ = _gguf_base(adapter, base)
    report = write_lora_gguf(adapter, source.path / source.gguf_file, out)
    return {**report, "base": base}


def _gguf_base(adapter: Path, base: str | None):
    """(the base model spec, its resolved source, the GGUF file's architecture, read from its
    header without the vocabulary); a base that is not a llama-layout GGUF file is refused."""
    base = base or adapter_base(adapter) or "default"
    source = resolve_chat_model(base)
    if source.kind not in ("bundled-gguf", "gguf"):
        raise WorkbenchError(
            f"{base}: the base model is not a GGUF file, so there is no tokenizer and "
            "metadata to copy; merge with `workbench train merge ADAPTER -o DIR` and convert DIR "
            "with llama.cpp's convert_hf_to_gguf.py")
    arch = header_values(source.gguf_path, ("general.architecture",)).get(
        "general.architecture")
    if arch != "llama":
        raise WorkbenchError(f"{source.gguf_file}: architecture {arch!r}; GGUF export "
                             "writes llama-layout models only")
    return base, source, arch


def _check(merged, tok, out: Path, prompts: list[str], max_tokens: int, log) -> dict:
    """Greedy answers of the merged model (saved as a model folder) and of the GGUF file
    loaded back by the workbench's own GGUF path, through the same backend; and, since one
    rounded weight can send a greedy answer down another path after a few tokens, the share
    of the merged answers' tokens that the GGUF model also ranks first when fed the same text
    (teacher-forced top-1 agreement)."""
    import shutil

    params = GenerationParams(max_tokens=max_tokens, temperature=0.0)
    convs = [[{"role": "user", "content": p}] for p in prompts]
    tmp = Path(tempfile.mkdtemp(prefix="wb-merged-"))
    cache = gguf_cache_dir(resolve_chat_model(str(out)))
    made = not cache.exists()
    try:
        merged.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        want_model = load_model(str(tmp))
        want = [g.text for g in want_model.generate(convs, params)]
        log(f"loading {out} back through the workbench's GGUF path")
        got_model = load_model(str(out), backend="local")  # its logits are compared
        got = [g.text for g in got_model.generate(convs, params)]
        agree, total = _top1_agreement(want_model, got_model, convs, want)
    finally:  # the copies this check made are ours: nothing stays in the model cache
        shutil.rmtree(tmp, ignore_errors=True)
        if made:
            shutil.rmtree(cache, ignore_errors=True)
    same = sum(a == b for a, b in zip(want, got, strict=True))
    log(f"greedy answers: {same}/{len(prompts)} the same as the merged model's; top-1 "
        f"agreement on the merged answers' tokens {agree}/{total}")
    return {"check": {"prompts": len(prompts), "same_answers": same, "max_tokens": max_tokens,
                      "top1_agree": agree, "top1_tokens": total,
                      "answers": [{"prompt": p, "merged": a, "gguf": b}
                                  for p, a, b in zip(prompts, want, got, strict=True)]}}


def _top1_agreement(a, b, convs, answers) -> tuple[int, int]:
    """Positions of each answer where both backends' models rank the same next token first,
    each fed the prompt and the answer so far (the same tokens: both use one tokenizer)."""
    import torch

    agree = total = 0
    with torch.inference_mode():
        for conv, ans in zip(convs, answers, strict=True):
            prompt = a.tokenizer(a.render(conv), add_special_tokens=False)["input_ids"]
            answer = a.tokenizer(ans, add_special_tokens=False)["input_ids"]
            if not answer:
                continue
            ids = torch.tensor([prompt + answer])
            sl = slice(len(prompt) - 1, ids.shape[1] - 1)
            top_a = a.model(ids).logits[0, sl].argmax(-1)
            top_b = b.model(ids.to(b.model.device)).logits[0, sl].argmax(-1).to(top_a.device)
            agree += int((top_a == top_b).sum())
            total += len(answer)
    return agree, total


def _adapter_name(adapter: Path) -> str:
    return adapter.parent.name if adapter.name == "adapter" else adapter.name
