"""The adapters the literature-search evaluation trains itself (issue 27): LoRA SFT on the
oracle teacher's dialogues (`litsearch_sft.messages.jsonl`), then DPO on its corruption
pairs (`litsearch_preferences.jsonl`) starting from that SFT adapter, which is also DPO's
reference. They are the conditions `agent+sft` and `agent+sft_dpo`: the agent with the
adapter, run and reported as every `agent+NAME` condition is, with `agent+sft_dpo` compared
to `agent+sft` on the same intents.

Both are opt-in through `agent.conditions` (not in the pack's default set): with the bundled
model a pair side is ~2,100 tokens, so the reference pass and DPO take hours on two CPU
cores. Each training is a stage (`litsearch_sft`, `litsearch_dpo`) keyed by its data, its
settings (`agent.student`: steps, rows a step, learning rate, max length and LoRA, used for
both; DPO's beta and loss are the training library's defaults) and the model, trained through
`workbench.train.recipe.train` (checkpoints resume, DPO's reference log-probabilities are
cached next to the adapter), so a re-run skips what is done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.errors import ConfigError, DataError, WorkbenchError
from workbench.runs import file_hash, outputs_at
from workbench.train import recipe  # by module: tests count its trainings
from workbench.train.config import TrainConfig

SFT, SFT_DPO = "agent+sft", "agent+sft_dpo"
TRAINED = (SFT, SFT_DPO)
ARTIFACTS = {SFT: "litsearch_sft", SFT_DPO: "litsearch_sft_dpo"}  # in the agent spec


def adapter_folder(out: Path, cond: str) -> Path:
    """The adapter folder of a trained condition, as the pipeline's spec declares it."""
    return outputs_at("agent", out).path(ARTIFACTS[cond]).parent


def check_names(ac, trained: list[str]) -> None:
    """A trained condition and an `agent.adapters` entry may not share a name."""
    clash = [c for c in trained if c.removeprefix("agent+") in ac.adapters]
    if clash:
        names = ", ".join(repr(c.removeprefix("agent+")) for c in clash)
        raise ConfigError([f"agent.adapters: {names} would also be the trained condition "
                           f"{', '.join(clash)} (agent.conditions); rename the adapter"])


def train_adapters(cfg, ctx, out: Path, trained: list[str]) -> tuple[dict[str, Path], dict]:
    """Train what the trained conditions need (SFT always; DPO for agent+sft_dpo), each as
    its stage; returns ({condition: adapter folder}, {condition: training info})."""
    if not trained:
        return {}, {}
    s = cfg.agent.student
    stages = ctx.stages("agent")
    settings = (s.model_dump(mode="json"), cfg.models.chat.spec, cfg.seed)
    files = outputs_at("agent", out)
    sft_data, pairs = files.path("litsearch_sft_data"), files.path("preferences")
    folders = {c: adapter_folder(out, c) for c in TRAINED}
    rec, _ = stages.run("litsearch_sft", (file_hash(sft_data), *settings),
                        lambda: _train(cfg, ctx, "sft", sft_data, folders[SFT]))
    infos = {SFT: dict(rec.info or {})}
    if SFT_DPO in trained:
        init = folders[SFT]
        rec, _ = stages.run("litsearch_dpo", (file_hash(pairs), file_hash(
            init / "adapter_model.safetensors"), *settings),
            lambda: _train(cfg, ctx, "dpo", pairs, folders[SFT_DPO], init=init))
        infos[SFT_DPO] = dict(rec.info or {})
    return {c: folders[c] for c in trained}, {c: infos[c] for c in trained}


def _count(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())


def _train(cfg, ctx, method: str, data: Path, output: Path, init: Path | None = None
           ) -> dict[str, Any]:
    """One adapter through the training recipe; the stage's info (the report's record)."""
    s = cfg.agent.student
    n = _count(data)
    if n == 0:
        what = "SFT dialogues" if method == "sft" else "preference pairs"
        raise WorkbenchError(f"{data}: no {what} to train {SFT if method == 'sft' else SFT_DPO}"
                             " on (the oracle teacher works the intents with part 'train'; "
                             "agent.train_limit)")
    # agent.student.batch_size rows (pairs) a step, one at a time: the same step, a fraction
    # of the peak memory (a pair side is ~2,100 tokens with the bundled model)
    tc = TrainConfig(method=method, data=str(data),
                     init_adapter=str(init) if init is not None else None,
                     max_steps=s.max_steps, batch_size=1, grad_accum=s.batch_size,
                     learning_rate=s.learning_rate, max_length=s.max_length, lora=s.lora,
                     eval_fraction=0.0)
    try:
        r = recipe.train(tc, model_spec=cfg.models.chat.spec, output=output, seed=cfg.seed,
                         log=ctx.log)
    except DataError as e:
        if e.code != "too_long":
            raise
        raise DataError(f"{e} (litsearch trains with agent.student.max_length="
                        f"{s.max_length}: raise it)", code="too_long") from None
    losses = [m["loss"] for m in r.metrics if "loss" in m]
    last = r.metrics[-1] if r.metrics else {}
    info = {"method": method, "adapter": output.name, "examples": n, "steps": r.steps,
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None}
    if init is not None:
        info["init_adapter"] = init.name
    if method == "dpo":
        info |= {k: last.get(k) for k in ("reward_accuracy", "reward_margin")}
    return info
