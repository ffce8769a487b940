"""The RF design pack as the agent pipeline sees it (data only; `pack.AgentPack`): its code,
its conditions, its stages and its report. An entry of the group `workbench.agent_packs`."""

from workbench.agent_packs.pack import AgentPack, PackReport, grpo_outputs
from workbench.registry import Artifact, Stage

PACK = AgentPack(
    name="rf",
    entry="workbench.agent_packs.rf.api",
    help="RF design with unit-checked calculators: the model alone, with retrieval, with the "
         "tools, and the tools agent trained with GRPO",
    # rf.api: CONDITIONS (the default set), then rf.grpo's CONDITION (on request)
    conditions=("alone", "rag", "tools", "tools+grpo"),
    stages=(
        Stage("rf", per="condition", help="RF design: the questions under one condition "
                                            "(alone, rag, tools)",
              outputs=(Artifact("rf", "rf_{value}.jsonl"),)),
        Stage("rf_grpo", help="RF design: the tools agent trained with GRPO on the training "
                              "items' rollouts against the pack's reward (tools+grpo)",
              outputs=grpo_outputs("rf_grpo")),
        Stage("rf_index", help="RF design: the corpus indexed once for the rag and tools "
                               "conditions (the searcher reuses it while the corpus holds)",
              outputs=(Artifact("rf_index", "rf_index", required=False),)),
        # the report: a typed record (`rf.report.read_report`) and the same in markdown
        Stage("rf_report", help="RF design: right answers per condition, paired tests",
              outputs=(Artifact("rf_report", "rf_report.json",
                                "workbench.agent_packs.rf.report:RfReport"),
                       Artifact("rf_report_md", "rf_report.md"))),
    ),
    report=PackReport(record="workbench.agent_packs.rf.report:RfReport",
                      reader="workbench.agent_packs.rf.report:read_report",
                      artifact="rf_report"),
)
