"""GGUF export (issue 29, item 3): an adapter merged into its base and written as one GGUF file
in llama.cpp's layout, loaded back by the workbench's own GGUF path, answers compared."""

from __future__ import annotations

import json
import re

import pytest

from workbench.errors import WorkbenchError


def _adapter(model, out, *, seed: int = 0, base: str = "default"):
    """A LoRA adapter with non-zero B (so merging changes the weights), saved as training
    saves one, with the manifest naming its base."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    peft.save_pretrained(out, safe_serialization=True)
    (out / "manifest.json").write_text(json.dumps({"outputs": {"base_model": base}}))
    peft.unload()
    return out


def test_a_base_that_is_not_a_gguf_is_refused_with_the_way_out(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from workbench.train.gguf_export import export_gguf

    adapter = _adapter(AutoModelForCausalLM.from_pretrained(tiny_model), tmp_path / "a",
                       base=tiny_model)
    with pytest.raises(WorkbenchError, match="not a GGUF file.*train merge.*convert_hf_to_gguf"):
        export_gguf(adapter, tmp_path / "m.gguf")
    with pytest.raises(WorkbenchError, match="must end in .gguf"):
        export_gguf(adapter, tmp_path / "m.bin")
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(WorkbenchError, match="not a regular file"):
        export_gguf(adapter, tmp_path / "dir.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "dir.gguf"]


def test_the_bundled_models_tensors_come_out_as_its_gguf_holds_them(bundled_model):
    """The layout check that needs no llama.cpp: the base's own weights (the workbench's
    dequantized copy of the bundled GGUF) mapped by `gguf_tensors` equal the GGUF's tensors,
    dequantized, exactly: every name, shape and the query/key permutation."""
    import gguf
    import numpy as np

    from workbench.models.resolve import resolve_chat_model
    from workbench.train.gguf_export import gguf_tensors

    src = resolve_chat_model("default")
    reader = gguf.GGUFReader(str(src.path / src.gguf_file))
    cfg = bundled_model.model.config
    state = {k: v.detach().float().numpy() for k, v in bundled_model.model.state_dict().items()}
    mine = gguf_tensors(state, n_blocks=cfg.num_hidden_layers, n_head=cfg.num_attention_heads,
                        n_head_kv=cfg.num_key_value_heads, tied=True)
    assert set(mine) == {t.name for t in reader.tensors}
    for t in reader.tensors:
        theirs = gguf.quants.dequantize(t.data, t.tensor_type).reshape(mine[t.name].shape)
        assert np.array_equal(theirs, mine[t.name]), t.name


def test_export_loads_back_and_answers_as_the_merged_model(bundled_model, tmp_path, cli):
    """`workbench train export-gguf` on an adapter of the bundled model: the file loads back
    through the workbench's GGUF path (as any .gguf spec does) and its greedy answers are the
    merged model's, word for word; the weights are the merged ones, not the base's."""
    import gguf
    import numpy as np
    from transformers import AutoModelForCausalLM

    from workbench.models.local import model_folder
    from workbench.models.resolve import resolve_chat_model

    folder = model_folder(resolve_chat_model("default"))
    adapter = _adapter(AutoModelForCausalLM.from_pretrained(folder), tmp_path / "adapter")
    out = tmp_path / "smol-rf.gguf"
    r = cli("train", "export-gguf", str(adapter), "-o", str(out), "--type", "f32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "greedy answers 4/4 the same as the merged model's" in r.stdout
    top1 = re.search(r"top-1 agreement (\d+)/(\d+) tokens", r.stdout)
    assert top1 and top1.group(1) == top1.group(2) and int(top1.group(2)) > 20
    src = resolve_chat_model("default")
    new, old = gguf.GGUFReader(str(out)), gguf.GGUFReader(str(src.path / src.gguf_file))
    assert new.get_field("tokenizer.chat_template").contents() == \
        old.get_field("tokenizer.chat_template").contents()
    assert new.get_field("general.file_type").contents() == 0  # all f32
    q_new = next(t for t in new.tensors if t.name == "blk.0.attn_q.weight")
    q_old = next(t for t in old.tensors if t.name == "blk.0.attn_q.weight")
    diff = np.abs(np.asarray(q_new.data).reshape(-1) - gguf.quants.dequantize(
        q_old.data, q_old.tensor_type).reshape(-1)).max()
    assert diff > 1e-4  # the adapter is in the weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "smol-rf.gguf"]
    from workbench.models.local import gguf_cache_dir

    assert not gguf_cache_dir(resolve_chat_model(str(out))).exists()  # the check's copy
