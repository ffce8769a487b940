"""The LoRA adapter on a model: its default target modules, injecting it (or checking the
one a PeftModel carries), starting from a saved one, and reading or replacing its tensors."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from workbench.errors import WorkbenchError
from workbench.models.local import model_folder
from workbench.models.resolve import resolve_chat_model
from workbench.train.config import LoraSettings

if TYPE_CHECKING:
    import torch


class CarriesAdapter(Protocol):
    """What reading or replacing the adapter needs of a session (`session.TrainingSession`,
    `grpo_session.GrpoSession`): its model, a PeftModel carrying the adapter."""

    model: Any

# Attention and MLP projections of the common decoder families (Llama/SmolLM/Qwen/Mistral,
# GPT-2, GPT-NeoX, Phi, Falcon); LoRA on the attention projections is the usual default.
DEFAULT_TARGETS = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "mistral": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "gemma": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "phi3": ["qkv_proj", "o_proj"],
    "gpt2": ["c_attn", "c_proj"],
    "gpt_neox": ["query_key_value", "dense"],
    "falcon": ["query_key_value", "dense"],
}


def adapter_state(session: CarriesAdapter) -> dict[str, torch.Tensor]:
    """The adapter's tensors, named as PEFT names them in `adapter_model.safetensors`, as
    detached CPU copies (training on does not change them)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(session.model, adapter_name=session.model.active_adapter)
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def local_weights(model_spec: str, why: str = "training"):
    """(the folder of a model spec's local weights, the resolved source); an HTTP endpoint is
    refused in one line ("training needs local weights ...")."""
    source = resolve_chat_model(model_spec)
    if source.kind == "openai":
        raise WorkbenchError(f"{why} needs local weights, not an HTTP endpoint")
    return model_folder(source), source


def init_adapter_state(lora: LoraSettings, *, model_spec: str | None = None, model=None,
                       seed: int = 0) -> dict[str, torch.Tensor]:
    """The adapter `setup` would start from (same seed: same A, B = 0) without data or an
    optimizer: what a federated server sends out in round 1. `model` is consumed (LoRA layers
    are injected into it)."""
    import torch

    if (model_spec is None) == (model is None):
        raise WorkbenchError("pass a model_spec or an in-memory model, not both or neither")
    if model_spec is not None:  # (else the in-memory model)
        from transformers import AutoModelForCausalLM

        folder, _ = local_weights(model_spec, "an adapter")
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    torch.manual_seed(seed)
    from peft import get_peft_model_state_dict

    peft = with_adapter(model, lora)
    state = get_peft_model_state_dict(peft, adapter_name=peft.active_adapter)
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def load_adapter_state(session: CarriesAdapter, state: Mapping[str, torch.Tensor]) -> None:
    """Replace the adapter's tensors with `state` (names as `adapter_state` gives them).

    Strict: a missing, unexpected or differently shaped tensor is refused, by name, before
    anything is written. The optimizer's moments and the step counter are left as they are.
    """
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    name = session.model.active_adapter
    expected = get_peft_model_state_dict(session.model, adapter_name=name)
    problems = [f"missing {k}" for k in sorted(set(expected) - set(state))]
    problems += [f"unexpected {k}" for k in sorted(set(state) - set(expected))]
    for k in sorted(set(expected) & set(state)):
        want = tuple(expected[k].shape)
        if not hasattr(state[k], "shape"):
            problems.append(f"{k} is a {type(state[k]).__name__}, not a tensor")
        elif tuple(state[k].shape) != want:
            problems.append(f"{k} has shape {tuple(state[k].shape)}, the adapter's is {want}")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more"
                                           if len(problems) > 5 else "")
        raise WorkbenchError(f"adapter state does not fit this session's adapter: {shown}")
    set_peft_model_state_dict(session.model, dict(state), adapter_name=name)


@contextmanager
def adapter_swapped(session: CarriesAdapter, state: Mapping[str, torch.Tensor] | None
                    ) -> Iterator[None]:
    """Run the block with `state` in the adapter (e.g. to export the best step's), then put
    the session's own tensors back; None: the block runs on the adapter as it is."""
    if state is None:
        yield
        return
    current = adapter_state(session)
    load_adapter_state(session, state)
    try:
        yield
    finally:
        load_adapter_state(session, current)


def from_adapter(model, folder: str):
    """The model with a trainable copy of the adapter in `folder` (train.init_adapter)."""
    from peft import PeftModel

    path = Path(folder)
    if not (path / "adapter_config.json").is_file():
        raise WorkbenchError(f"train.init_adapter {folder}: not an adapter folder (no "
                             f"adapter_config.json)")
    with warnings.catch_warnings():  # as in with_adapter
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        return PeftModel.from_pretrained(model, str(path), is_trainable=True)


def with_adapter(model, lora: LoraSettings):
    """The model as a PeftModel with a trainable LoRA adapter."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if isinstance(model, PeftModel):
        _check_adapter(model, lora)
        return model
    targets = lora.target_modules or DEFAULT_TARGETS.get(model.config.model_type)
    if not targets:
        raise WorkbenchError(f"no default LoRA targets for model type "
                             f"{model.config.model_type!r}: set train.lora.target_modules")
    with warnings.catch_warnings():  # PEFT reads an attribute transformers 5 deprecates
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha,
                                                lora_dropout=lora.dropout,
                                                target_modules=targets, task_type="CAUSAL_LM"))


def _check_adapter(model, lora: LoraSettings) -> None:
    from peft import LoraConfig

    pc = model.peft_config[model.active_adapter]
    if not isinstance(pc, LoraConfig):
        raise WorkbenchError(f"the PeftModel carries a {pc.peft_type} adapter; training here "
                             f"is LoRA")
    have: dict[str, Any] = {"r": pc.r, "alpha": pc.lora_alpha, "dropout": pc.lora_dropout}
    want: dict[str, Any] = {"r": lora.r, "alpha": lora.alpha, "dropout": lora.dropout}
    if lora.target_modules:
        got = pc.target_modules  # PEFT keeps a list, or one regular expression as a string
        have["target_modules"] = sorted([got] if isinstance(got, str) else got or [])
        want["target_modules"] = sorted(lora.target_modules)
    differ = [f"{k}: adapter {have[k]}, train.lora {want[k]}" for k in want
              if have[k] != want[k]]
    if differ:
        raise WorkbenchError("the PeftModel's adapter disagrees with train.lora ("
                             + "; ".join(differ) + "): make them agree")
    if not any(p.requires_grad for p in model.parameters()):
        raise WorkbenchError("the PeftModel's adapter is frozen: load it with "
                             "PeftModel.from_pretrained(..., is_trainable=True)")
