"""A pipeline that lives outside the workbench package: registering it must make it appear in
`--help`, `jobs start` and the config schema without touching a core file."""

from pydantic import BaseModel, ConfigDict, Field

from workbench.io import atomic_write_json
from workbench.registry import Artifact, Pipeline, PipelineResult, Stage


class ToyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    words: int = Field(3, ge=1, description="How many words to count to.")


def run(cfg, ctx) -> PipelineResult:
    out = ctx.layout.folder("toy")
    calls = []

    def count():
        calls.append(1)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "counts.json", {"n": cfg.toy.words})
        return {"n": cfg.toy.words}

    ctx.stages("toy").run("count", (cfg.toy.words,), count)
    return PipelineResult(pipeline="toy", run_dir=str(ctx.layout.root),
                          outputs={"counts": str(out / "counts.json")},
                          figures={"n": cfg.toy.words, "ran": bool(calls)},
                          message=f"counted to {cfg.toy.words} (ran: {bool(calls)})")


PIPELINE = Pipeline(
    name="toy", help="A toy pipeline that counts words (registered from a test module).",
    config="toy_pipeline:ToyConfig", run="toy_pipeline:run",
    stages=(Stage("count", outputs=(Artifact("counts", "counts.json"),)),),
)
