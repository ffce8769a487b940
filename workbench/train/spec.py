"""The training pipeline as the registry sees it (data only: its `run` entry is in
`train.api`)."""

from workbench.registry import Artifact, Pipeline, Stage

PIPELINE = Pipeline(
    name="train",
    help="LoRA SFT (or DPO on preference pairs: train.method=dpo) of models.chat on "
         "train.data (default: the run's distilled SFT split); resumable; preview the "
         "trained spans; build step-level pairs from trajectories; merge an adapter.",
    config="workbench.train.config:TrainConfig",
    run="workbench.train.api:run",
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

