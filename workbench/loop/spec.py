"""The improvement loop as the registry sees it:
`workbench loop plan|approve|run|decide|history`."""

from workbench.registry import Artifact, Pipeline, Stage

PIPELINE = Pipeline(
    name="loop", kind="experiment",
    help="Improvement loop with human gates (Cura): evaluate, mine failures by mode, "
         "synthesise targeted data with retention anchors, gate it, search the mixture, "
         "train a LoRA candidate, guard every subset, keep or revert.",
    config="workbench.loop.config:LoopConfig",
    run="workbench.loop.api:run",
    # Every path of the `loop` folder is declared here; the loop's modules and the app find
    # them only through it (`runs.outputs_at("loop", folder)`, per round `for_value`).
    # The loop's steps record themselves in round.json (not through StageRunner): a killed
    # round re-run redoes only the steps whose inputs changed or whose files are missing.
    stages=(
        Stage("state", help="what the loop keeps across rounds",
              outputs=(Artifact("config", "config.yaml", help="the config its plans use"),
                       Artifact("state", "state.json", "workbench.loop.records:LoopState"),
                       Artifact("evals", "evals", required=False,
                                help="evals/<adapter sha>-<key>/<suite>.jsonl (cached)"),
                       Artifact("adapters", "adapters", required=False,
                                help="adapters/<sha>/: every adapter kept"),
                       Artifact("deployed", "deployed", required=False,
                                help="the adapter a decision deployed"),
                       Artifact("judge_ratings", "judge_ratings.jsonl", required=False,
                                help="a person's ratings of the open-question judge"))),
        Stage("rounds", per="round",
              help="rounds/NN/: one round's plan, data, candidate and report",
              outputs=(Artifact("round", "rounds/{value}/round.json",
                                "workbench.loop.records:Round"),
                       Artifact("failures", "rounds/{value}/failures.jsonl",
                                "workbench.loop.records:FailureRow"),
                       Artifact("synth", "rounds/{value}/synth.jsonl", "ChatExample",
                                required=False, help="targeted samples and anchors"),
                       Artifact("accepted", "rounds/{value}/accepted.jsonl", "ChatExample",
                                required=False, help="what the gates kept"),
                       Artifact("dropped", "rounds/{value}/dropped.jsonl", required=False),
                       Artifact("review", "rounds/{value}/review.json", required=False,
                                help="a person's review of the accepted samples"),
                       Artifact("mixture", "rounds/{value}/mixture", required=False,
                                help="the mixture probes' data and adapters"),
                       Artifact("train", "rounds/{value}/train.jsonl", "ChatExample",
                                required=False),
                       Artifact("candidate", "rounds/{value}/candidate", required=False,
                                help="the round's LoRA candidate"),
                       Artifact("report", "rounds/{value}/report.md", required=False))),
        Stage("history", outputs=(Artifact("history", "history.md"),
                                  Artifact("history_plot", "history.png", required=False))),
    ),
    cli="workbench.loop.cli:register",
    page="loop.py", page_title="Improvement loop", page_icon=":material/autorenew:",
    order=75,
)
