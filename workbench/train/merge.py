"""Merge a LoRA adapter into its base model and prove the merge changed nothing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.io import check_made_here, replace_dir
from workbench.models.local import check_adapter_dir, model_folder
from workbench.models.resolve import resolve_chat_model

# Short prompts of any domain: the check compares logits position by position, so what
# matters is a spread of ordinary tokens, not the subject. A domain pack passes its own.
PARITY_PROMPTS = ["Hello! How are you today?", "Summarise the text above in one sentence.",
                  "List three prime numbers.",
                  "What should I check first when something stops working?"]


def merge_adapter(base_spec: str, adapter: str | Path, out: str | Path, *,
                  tolerance: float = 1e-4, prompts: list[str] | None = None) -> dict:
    """Merge `adapter` into `base_spec`'s weights and write the merged model to `out`, only
    if its logits match base+adapter within `tolerance` on `prompts` (default:
    PARITY_PROMPTS; the CLI passes a domain pack's own)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = PARITY_PROMPTS if prompts is None else prompts
    if not prompts:
        raise WorkbenchError("merge parity needs at least one prompt")
    adapter = check_adapter_dir(adapter)
    check_made_here(out, ("merge_report.json",))  # before any work: never a user's folder
    folder = model_folder(resolve_chat_model(base_spec))
    tok = AutoTokenizer.from_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).eval()
    enc = [tok(p, return_tensors="pt") for p in prompts]
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


def adapter_base(adapter: str | Path) -> str | None:
    """The model spec an adapter was trained on (its manifest's `base_model`), if it says;
    only a regular manifest file is read."""
    import stat

    path = Path(adapter) / "manifest.json"
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 16 * 1024 * 1024:
            return None
        spec = json.loads(path.read_text(encoding="utf-8"))["outputs"]["base_model"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return spec if isinstance(spec, str) and spec and spec != "in-memory" else None
