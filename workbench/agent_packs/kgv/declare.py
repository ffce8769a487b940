"""The KGV pack as the agent pipeline sees it (data only; `pack.AgentPack`): its code, its
conditions, its stages and its report. An entry of the group `workbench.agent_packs`."""

from workbench.agent_packs.pack import TRAJECTORIES as _T
from workbench.agent_packs.pack import AgentPack, PackReport, grpo_outputs
from workbench.registry import Artifact, Stage

PACK = AgentPack(
    name="kgv",
    entry="workbench.agent_packs.kgv.api",
    help="knowledge-graph fact verification: closed book, single-turn RAG, the agent, a LoRA "
         "student on the teacher's trajectories, the agent trained with GRPO",
    # kgv.api: CONDITIONS (the default set), then GRPO (on request)
    conditions=("closed_book", "rag", "agent", "agent_sft", "agent_grpo"),
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
              outputs=grpo_outputs("kgv_grpo")),
        Stage("agent_grpo", help="KGV: the agent with the kgv_grpo adapter",
              outputs=(Artifact("agent_grpo", _T.format("agent_grpo"), "AgentTrajectory"),)),
        # the report: a typed record with schema_version (`kgv.report.read_report` is the
        # one reader) and the same in markdown; kgv.report takes these names
        Stage("kgv_report", help="KGV: macro-F1 per condition with intervals, paired tests",
              outputs=(Artifact("kgv_report", "report.json", "KgvReport"),
                       Artifact("kgv_report_md", "report.md"),
                       Artifact("kgv_plot", "report.png", required=False))),
    ),
    report=PackReport(record="workbench.agent_packs.kgv.report:KgvReport",
                      reader="workbench.agent_packs.kgv.report:read_report",
                      artifact="kgv_report"),
    reads=("index",),
)
