"""The trajectory-synthesis pipeline as the registry sees it (data only; nothing heavy
imported)."""

from workbench.registry import Artifact, Pipeline, Stage

PIPELINE = Pipeline(
    name="trajsynth",
    help="Trajectory synthesis for data agents: a verified task pool over a SQLite file or a "
         "CSV/Parquet folder, MCTS search per task, SFT / ICL / preference exports.",
    config="workbench.trajsynth.api:TrajsynthConfig",
    run="workbench.trajsynth.api:run",
    stages=(
        Stage("tasks", help="profile the environment, synthesise and verify the task pool",
              outputs=(Artifact("tasks", "tasks.jsonl", "workbench.datatasks.pool:Task"),
                       Artifact("tasks_summary", "tasks.summary.json"))),
        Stage("explore", help="one MCTS tree per task (resumable), the prefix trie",
              outputs=(Artifact("explore", "explore.json"),
                       Artifact("trie", "trie.json"),
                       Artifact("trees", "trees", help="one search tree per task "
                                                       "(trees/<task id>.json)"),
                       Artifact("attempts", "attempts.jsonl",
                                "workbench.trajsynth.costmodel:Attempt", required=False,
                                help="one row per task searched by one arm (none when no "
                                     "task needed a search)"),
                       Artifact("icl_bank", "icl_bank.jsonl", required=False,
                                help="verified trajectories as ICL demonstrations"),
                       Artifact("icl_index", "icl_index", required=False,
                                help="the ICL bank indexed for retrieval (rag)"),
                       Artifact("sft", "sft.messages.jsonl", "ChatExample", required=False,
                                help="verified trajectories as SFT conversations"),
                       Artifact("preferences", "preferences.jsonl", "PreferencePair",
                                required=False, help="verified path vs its nearest failed "
                                                     "sibling (DPO: train.method=dpo)"))),
        # the downstream check (`workbench trajsynth report`, trajsynth.downstream)
        Stage("sft_adapter", help="downstream check: LoRA SFT on sft.messages.jsonl",
              outputs=(Artifact("sft_adapter", "sft_adapter/adapter_model.safetensors"),)),
        Stage("dpo_adapter", help="downstream check: DPO from the SFT adapter (also the "
                                     "reference) on preferences.jsonl or step-level pairs",
              outputs=(Artifact("sft_dpo_adapter", "sft_dpo_adapter/adapter_model.safetensors"),
                       Artifact("dpo_reference_cache", "dpo_reference_cache.jsonl",
                                required=False, help="the reference's log-probabilities"),
                       Artifact("step_pairs", "step_pairs.jsonl", "PreferencePair",
                                required=False, help="dpo_pairs=steps: the pairs trained on"))),
        Stage("downstream", per="condition",
              help="downstream check: the held-out tasks under one condition (zero_shot, icl, "
                   "sft, sft_dpo)",
              outputs=(Artifact("downstream", "downstream_{value}.jsonl"),)),
        Stage("downstream_report", help="downstream check: verified rates with Wilson "
                                        "intervals, McNemar against zero-shot and sft",
              outputs=(Artifact(
                  "downstream_report", "downstream.json",
                  "workbench.trajsynth.downstream_report:DownstreamReport"),)),
    ),
    cli="workbench.trajsynth.cli:register",
    page="trajsynth.py", page_title="Trajectories", page_icon=":material/account_tree:",
    order=60,
)
