"""Merge a LoRA adapter into its base model and prove the merge changed nothing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.io import replace_dir

PARITY_PROMPTS = ["What is the characteristic impedance of a coaxial cable?",
                  "Explain VSWR in one sentence.", "Define noise figure.",
                  "Why match impedances?"]


def merge_adapter(base_spec: str, adapter: str | Path, out: str | Path, *,
                  tolerance: float = 1e-4, prompts: list[str] | None = None) -> dict:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.local import check_adapter_dir, model_folder
    from workbench.models.resolve import resolve_chat_model

    adapter = check_adapter_dir(adapter)
    folder = model_folder(resolve_chat_model(base_spec))
    tok = AutoTokenizer.from_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).eval()
    enc = [tok(p, return_tensors="pt") for p in (prompts or PARITY_PROMPTS)]
    with torch.no_grad():
        before = [model(**e).logits for e in enc]
        merged = model.merge_and_unload(safe_merge=True)
        after = [merged(**e).logits for e in enc]
    diff = max((a - b).abs().max().item() for a, b in zip(before, after, strict=True))
    if diff > tolerance:
        raise WorkbenchError(f"merged model differs from base+adapter by {diff:.2e} "
                             f"(> {tolerance}); not written")
    out = Path(out)
    tmp = out.parent / f".{out.name}.merge-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    report = {"base": base_spec, "adapter": str(adapter), "max_abs_logit_diff": diff,
              "tolerance": tolerance, "prompts": len(enc)}
    (tmp / "merge_report.json").write_text(json.dumps(report, indent=2))
    replace_dir(tmp, out)
    return report
