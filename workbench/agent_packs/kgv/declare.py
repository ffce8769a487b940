"""The KGV pack as the agent pipeline sees it (data only; `pack.AgentPack`): its code, its
conditions, its stages and its report. An entry of the group `workbench.agent_packs`."""

from workbench.agent_packs.pack import AgentPack, PackReport, grpo_outputs
from workbench.registry import Artifact, Stage

TRAJECTORY = "workbench.agents.steps:AgentTrajectory"

PACK = AgentPack(
    name="kgv",
    entry="workbench.agent_packs.kgv.api",
    help="knowledge-graph fact verification: closed book, single-turn RAG, the agent, a LoRA "
         "student on the teacher's trajectories, the agent trained with GRPO",
    # kgv.api: CONDITIONS (the default set), then GRPO (on request)
    conditions=("closed_book", "rag", "agent", "agent_sft", "agent_grpo"),
    stages=(
        Stage("closed_book", help="the verdict without retrieval",
              outputs=(Artifact("closed_book", "trajectories/closed_book.jsonl",
                                TRAJECTORY),)),
        Stage("rag", help="single-turn RAG: one search for the verbalised triple",
              outputs=(Artifact("rag", "trajectories/rag.jsonl", TRAJECTORY),)),
        Stage("agent", help="the agent: routing, query rewriting, verdict with evidence",
              outputs=(Artifact("agent", "trajectories/agent.jsonl", TRAJECTORY),)),
        Stage("teacher", help="sampled teacher runs on training claims; correct, fewest "
                              "searches, routes balanced -> SFT",
              outputs=(Artifact("teacher", "teacher.jsonl", TRAJECTORY),
                       Artifact("sft", "sft.messages.jsonl", "ChatExample"))),
        Stage("student", help="LoRA on the teacher's trajectories (turn-level SFT)",
              outputs=(Artifact("adapter", "student/adapter_config.json"),)),
        Stage("agent_sft", help="the agent on the student model",
              outputs=(Artifact("agent_sft", "trajectories/agent_sft.jsonl",
                                TRAJECTORY),)),
        Stage("kgv_grpo", help="KGV: the agent trained with GRPO on the training claims' "
                               "rollouts against the pack's reward (right verdict, less a "
                               "cost per search: AgentKGV's second stage)",
              outputs=grpo_outputs("kgv_grpo")),
        Stage("agent_grpo", help="KGV: the agent with the kgv_grpo adapter",
              outputs=(Artifact("agent_grpo", "trajectories/agent_grpo.jsonl",
                                TRAJECTORY),)),
        # declared for their files, not run on their own: what `api.run_condition` keeps
        # beside a run's trajectories, and the teacher's samples (run in the teacher stage)
        Stage("kgv_run", per="run",
              help="KGV: beside the trajectories of a run over claims (a condition, or "
                   "teacher.I for the teacher's sample I), its wall time and the key its "
                   "claims were run under (a file made under another key starts over)",
              outputs=(Artifact("timing", "trajectories/{value}.timing.json",
                                required=False),
                       Artifact("run_key", "trajectories/{value}.key", kind="text",
                                required=False))),
        Stage("teacher_sample", per="sample",
              help="KGV: the teacher's sample I on the training claims (all of them in "
                   "teacher.jsonl)",
              outputs=(Artifact("teacher_run", "trajectories/teacher.{value}.jsonl",
                                TRAJECTORY, required=False),)),
        # a person's check of the verdicts (`workbench agent check`, the app), not a stage's
        Stage("kgv_check", help="KGV: a person's ratings of shown verdicts (append-only)",
              outputs=(Artifact("verdict_ratings", "verdict_ratings.jsonl",
                                required=False),)),
        # the report: a typed record with schema_version (`kgv.report.read_report` is the
        # one reader) and the same in markdown; kgv.report takes these names
        Stage("kgv_report", help="KGV: macro-F1 per condition with intervals, paired tests",
              outputs=(Artifact("kgv_report", "report.json",
                                "workbench.agent_packs.kgv.report:KgvReport"),
                       Artifact("kgv_report_md", "report.md"),
                       Artifact("kgv_plot", "report.png", required=False))),
    ),
    report=PackReport(record="workbench.agent_packs.kgv.report:KgvReport",
                      reader="workbench.agent_packs.kgv.report:read_report",
                      artifact="kgv_report"),
    reads=("index",),
)
