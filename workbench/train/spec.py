"""The training pipeline as the registry sees it, and its `run` entry."""

from __future__ import annotations

from pathlib import Path

from workbench.registry import Artifact, Pipeline, PipelineResult, Stage

PIPELINE = Pipeline(
    name="train",
    help="LoRA SFT (or DPO on preference pairs: train.method=dpo) of models.chat on "
         "train.data (default: the run's distilled SFT split); resumable; preview the "
         "trained spans; build step-level pairs from trajectories; merge an adapter.",
    config="workbench.train.config:TrainConfig",
    run="workbench.train.spec:run",
    folder="",
    stages=(Stage("train", help="LoRA SFT or DPO, checkpoints, adapter export", outputs=(
        Artifact("adapter", "adapter", help="PEFT adapter folder (safetensors)"),
        Artifact("weights", "adapter/adapter_model.safetensors"),
        Artifact("manifest", "adapter/manifest.json"),
        Artifact("metrics", "adapter/metrics.jsonl"),
        Artifact("curves", "adapter/training_curves.png", required=False),
        Artifact("live", "adapter.live.jsonl", required=False,
                 help="per-step metrics while training runs"))),),
    cli="workbench.train.cli:register",
    page="train.py", page_title="Train", page_icon=":material/model_training:", order=40,
)


def training_data(cfg, layout) -> str:
    """train.data, or the SFT split that a distillation wrote into the same run."""
    from workbench.errors import WorkbenchError

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
    from workbench.runs import file_hash
    from workbench.train.recipe import train

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
