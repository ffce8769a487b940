"""The federated pipeline as the registry sees it (data only; nothing heavy imported)."""

from workbench.registry import Artifact, Pipeline, Stage

PIPELINE = Pipeline(
    name="fed",
    config_key="federated",
    help="Federated LoRA with Flower: sites train a shared adapter on private data (FedAvg "
         "or FFA-LoRA), in process or on a real SuperLink/SuperNode deployment; report "
         "against local-only and centralised training.",
    config="workbench.federated.config:FederatedConfig",
    run="workbench.federated.api:run",
    # Every path of the `fed` folder is declared here; the code and the app find them only
    # through it (`RunLayout.outputs("fed")`, `runs.outputs_at`). Only "sites"
    # is a hashed stage: the rounds resume by their own round files (the global store, the
    # knowledge bases), the baselines by their adapter files and the evaluation by its cache.
    stages=(
        Stage("sites", help="split the QTSA data into per-site folders (by chapter)",
              outputs=(Artifact("sites", "sites"),)),
        Stage("rounds", help="the federation's rounds (resumed from its own round files)",
              outputs=(Artifact("federation", "federated"),
                       Artifact("rounds", "federated/rounds.jsonl",
                                "workbench.federated.results:RoundRow",
                                help="one line per round: replies, aggregate, guards"),
                       Artifact("summary", "federated/summary.json"),
                       Artifact("global", "federated/global", required=False,
                                help="the global adapter of every round (LoRA track)"),
                       Artifact("kb", "federated/kb", required=False,
                                help="the shared knowledge base of every round "
                                     "(knowledge track)"),
                       Artifact("replies", "federated/replies", required=False,
                                help="every site's reply per round (keep_replies: audit)"),
                       Artifact("server_log", "federated/server.log", required=False,
                                help="a deployment's server log"),
                       Artifact("abort", "federated/abort.json", required=False,
                                help="why a deployment's server aborted"),
                       Artifact("deploy_config", "federated/config.json", required=False,
                                help="the config a deployment's run was submitted with"))),
        Stage("baselines", help="each site alone and, for LoRA, all data pooled",
              outputs=(Artifact("local", "local", required=False),
                       Artifact("central", "central.safetensors", required=False))),
        Stage("evaluate", help="every condition on every site's held-out slice (cached)",
              outputs=(Artifact("eval", "eval.jsonl"),)),
        Stage("report", help="report.md, report.json (a typed record) and the rounds plot",
              outputs=(Artifact("report", "report.json"),
                       Artifact("report_md", "report.md"),
                       Artifact("plot", "rounds.png", required=False))),
    ),
    cli="workbench.federated.cli:register",
    page="federated.py", page_title="Federated", page_icon=":material/hub:", order=70,
)
