"""The training pipeline's `run` entry: the run's data found (train.data or the SFT split a
distillation wrote into the same run), then `recipe.train` as the `train` stage."""

from __future__ import annotations

from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.registry import PipelineResult
from workbench.runs import file_hash
from workbench.train.recipe import train


def training_data(cfg, layout) -> str:
    """train.data, or the SFT split that a distillation wrote into the same run."""
    if cfg.train.data:
        return cfg.train.data
    if cfg.train.method == "dpo":
        raise WorkbenchError("train.method is dpo and train.data is not set: pass a preference "
                             "JSONL (prompt/chosen/rejected), e.g. trajsynth's "
                             "preferences.jsonl, the litsearch agent's, or `workbench train "
                             "pairs` made from a trajectory file")
    if layout.has("distill", "sft"):
        return str(layout.artifact("distill", "sft"))
    raise WorkbenchError("train.data is not set and this run has no distilled SFT data: pass "
                         "-s train.data=FILE or run `workbench distill run` first")


def run(cfg, ctx) -> PipelineResult:
    data = training_data(cfg, ctx.layout)
    out = Path(cfg.train.output) if cfg.train.output else ctx.layout.artifact("train",
                                                                              "adapter")
    tc = cfg.train.model_copy(update={"data": data, "output": str(out)})
    inputs = (cfg.models.chat.model_dump(), cfg.seed, file_hash(data), tc.model_dump())
    done = {}

    def work():
        res = train(tc, model_spec=cfg.models.chat.spec, output=out, seed=cfg.seed,
                    resume=not ctx.fresh, log=ctx.log)
        done["steps"] = res.steps
        return {"steps": res.steps}

    rec, _ = ctx.stages("train").run("train", inputs, work)
    steps = done.get("steps", rec.info.get("steps"))
    return PipelineResult(pipeline="train", run_dir=str(ctx.layout.root),
                          outputs={"adapter": str(out)}, figures={"steps": steps},
                          message=f"adapter written to {out} ({steps} steps)")
