"""The improvement loop as the registry sees it:
`workbench loop plan|approve|run|decide|history`."""

from workbench.registry import Artifact, Pipeline, Stage

PIPELINE = Pipeline(
    name="loop", kind="experiment",
    requires=("searcher",),
    help="Improvement loop with human gates (Cura): evaluate, mine failures by mode, "
         "synthesise targeted data with retention anchors, gate it, search the mixture, "
         "train a LoRA candidate, guard every subset, keep or revert.",
    config="workbench.loop.config:LoopConfig",
    run="workbench.loop.api:run",
    stages=(
        Stage("rounds", help="rounds/NN/: round.json, failures, synthesised and accepted "
                             "data, mixture probes, candidate adapter, report.md",
              outputs=(Artifact("state", "state.json", "LoopState"),)),
        Stage("history", outputs=(Artifact("history", "history.md"),
                                  Artifact("history_plot", "history.png", required=False))),
    ),
    cli="workbench.loop.cli:register",
    page="loop.py", page_title="Improvement loop", page_icon=":material/autorenew:",
    order=75,
)
