"""The domain-agent pipeline as the registry sees it: `workbench agent run|eval PACK CONFIG`."""

from workbench.registry import Artifact, Pipeline, Stage

_T = "trajectories/{}.jsonl"


def _grpo(stage: str) -> tuple[Artifact, ...]:
    """What a pack's GRPO training writes (`agent_packs.grpo.train`): the kept adapter, and
    beside it the rollouts of every step and one metric row per step (the live curves)."""
    return (Artifact(stage, f"{stage}/adapter_model.safetensors"),
            Artifact(f"{stage}_rollouts", f"{stage}.rollouts", required=False,
                     help="every step's rollouts (one JSONL file a step)"),
            Artifact(f"{stage}_live", f"{stage}.live.jsonl", required=False,
                     help="one metric row per step: reward, groups with no signal, tool "
                          "calls, KL, clipping, dev reward"))

PIPELINE = Pipeline(
    name="agent",
    # searcher: the agents' entries indexed in the run; open_index: a prebuilt index (kgv)
    help="Domain agents on one loop (KG fact verification, RF design tools, literature "
         "search): baselines, the agent, teacher trajectories, a LoRA student, one report "
         "with intervals.",
    config="workbench.agent_packs.config:AgentConfig",
    run="workbench.agent_packs.api:run",
    stages=(
        Stage("closed_book", help="the verdict without retrieval",
              outputs=(Artifact("closed_book", _T.format("closed_book"), "AgentTrajectory"),)),
        Stage("rag", help="single-turn RAG: one search for the verbalised triple",
              outputs=(Artifact("rag", _T.format("rag"), "AgentTrajectory"),)),
        Stage("agent", help="the agent: routing, query rewriting, verdict with evidence",
              outputs=(Artifact("agent", _T.format("agent"), "AgentTrajectory"),)),
        Stage("teacher", help="sampled teacher runs on training claims; correct, fewest "
                              "searches, routes balanced -> SFT",
              outputs=(Artifact("teacher", "teacher.jsonl", "AgentTrajectory"),
                       Artifact("sft", "sft.messages.jsonl", "ChatExample"))),
        Stage("student", help="LoRA on the teacher's trajectories (turn-level SFT)",
              outputs=(Artifact("adapter", "student/adapter_config.json"),)),
        Stage("agent_sft", help="the agent on the student model",
              outputs=(Artifact("agent_sft", _T.format("agent_sft"), "AgentTrajectory"),)),
        Stage("kgv_grpo", help="KGV: the agent trained with GRPO on the training claims' "
                               "rollouts against the pack's reward (right verdict, less a "
                               "cost per search: AgentKGV's second stage)",
              outputs=_grpo("kgv_grpo")),
        Stage("agent_grpo", help="KGV: the agent with the kgv_grpo adapter",
              outputs=(Artifact("agent_grpo", _T.format("agent_grpo"), "AgentTrajectory"),)),
        Stage("rf", per="condition", help="RF design: the questions under one condition "
                                            "(alone, rag, tools)",
              outputs=(Artifact("rf", "rf_{value}.jsonl"),)),
        Stage("rf_grpo", help="RF design: the tools agent trained with GRPO on the training "
                              "items' rollouts against the pack's reward (tools+grpo)",
              outputs=_grpo("rf_grpo")),
        Stage("rf_index", help="RF design: the corpus indexed once for the rag and tools "
                               "conditions (the searcher reuses it while the corpus holds)",
              outputs=(Artifact("rf_index", "rf_index", required=False),)),
        Stage("litsearch", per="condition",
              help="literature search: the dev dialogues under one condition (query_only, "
                   "fixed, agent, oracle, agent+sft, agent+sft_dpo, agent+ADAPTER)",
              outputs=(Artifact("litsearch", "litsearch_{value}.jsonl"),)),
        Stage("litsearch_training_data", help="litsearch: gold dialogues as SFT, and "
                                              "chosen/rejected pairs per turn against "
                                              "controlled corruptions",
              # litsearch_ names: a run folder may hold several packs (KGV's teacher
              # writes sft.messages.jsonl)
              outputs=(Artifact("litsearch_teacher", "litsearch_teacher_train.jsonl"),
                       Artifact("litsearch_sft_data", "litsearch_sft.messages.jsonl",
                                "ChatExample"),
                       Artifact("preferences", "litsearch_preferences.jsonl",
                                "PreferencePair", required=False))),
        Stage("litsearch_sft", help="litsearch: LoRA SFT on the teacher's dialogues (the "
                                    "agent+sft condition's adapter)",
              outputs=(Artifact("litsearch_sft", "litsearch_sft/adapter_model.safetensors"),)),
        Stage("litsearch_dpo", help="litsearch: DPO from the SFT adapter (also the "
                                    "reference) on the corruption pairs (agent+sft_dpo)",
              outputs=(Artifact("litsearch_sft_dpo",
                                "litsearch_sft_dpo/adapter_model.safetensors"),)),
        # each pack's report: a typed record with schema_version (its pack's `read_report`
        # is the one reader) and the same in markdown; the pack modules take these names
        Stage("kgv_report", help="KGV: macro-F1 per condition with intervals, paired tests",
              outputs=(Artifact("kgv_report", "report.json", "KgvReport"),
                       Artifact("kgv_report_md", "report.md"),
                       Artifact("kgv_plot", "report.png", required=False))),
        Stage("rf_report", help="RF design: right answers per condition, paired tests",
              outputs=(Artifact("rf_report", "rf_report.json", "RfReport"),
                       Artifact("rf_report_md", "rf_report.md"))),
        Stage("litsearch_report", help="litsearch: Hit@5, MRR, nDCG@10 per condition",
              outputs=(Artifact("litsearch_report", "litsearch_report.json",
                                "LitsearchReport"),
                       Artifact("litsearch_report_md", "litsearch_report.md"))),
    ),
    cli="workbench.agent_packs.cli:register",
    page="agents.py", page_title="Domain agents", page_icon=":material/smart_toy:",
    order=65,
)
