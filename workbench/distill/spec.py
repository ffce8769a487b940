"""The distillation pipeline as the registry sees it (data only; nothing heavy imported)."""

from workbench.registry import Artifact, Pipeline, Stage

PIPELINE = Pipeline(
    name="distill",
    help="QTSA distillation: corpus sections to question-thinking-solution-answer training "
         "data and a multiple-choice benchmark.",
    config="workbench.distill.config:DistillConfig",
    run="workbench.distill.api:run",
    stages=(Stage("distill", help="sections, questions, answers, checks, split, exports",
                  outputs=(
                      Artifact("sections", "sections.jsonl", "Section"),
                      Artifact("samples_mc", "mcQTSA.jsonl", "QTSASample"),
                      Artifact("samples_nd", "ndQTSA.jsonl", "QTSASample"),
                      Artifact("benchmark", "benchmark.jsonl", "MCItem",
                               "multiple-choice items from held-out sections (unseen)"),
                      Artifact("benchmark_seen", "benchmark_seen.jsonl", "MCItem",
                               "held-out items about trained sentences (distill."
                               "seen_fraction; RF-Agent's item-level protocol)",
                               required=False),
                      Artifact("sft", "sft/instruct_mixed.messages.jsonl", "ChatExample",
                               "training split, mc + nd, OpenAI messages"),
                      Artifact("sft_thinking", "sft/thinking_mixed.messages.jsonl",
                               "ChatExample", "the same with the thinking in the reply",
                               required=False),
                      Artifact("gates", "gates.jsonl", required=False,
                               help="every question's verdict from each quality gate, and "
                                    "what became of it"),
                      Artifact("report", "report.json"),
                      Artifact("report_md", "report.md"),
                      Artifact("review", "review.jsonl", required=False,
                               help="an expert's accept / reject / edit log"),
                      Artifact("manifest", "manifest.json", required=False,
                               help="the run's RunManifest: config, input hashes, versions"),
                      Artifact("verifier", "verifier.jsonl", required=False,
                               help="the answers the verifier disagreed with"),
                      Artifact("verifier_ratings", "verifier_ratings.jsonl", required=False,
                               help="a person's ratings of the verifier's verdicts"),
                      Artifact("calls", "calls.sqlite", required=False,
                               help="the distillation's model-call cache (cache on)"),
                  )),),
    cli="workbench.distill.cli:register",
    page="distill.py", page_title="Distill", page_icon=":material/science:", order=20,
)
