"""The RF design pack as the agent pipeline sees it (data only; `pack.AgentPack`): its code,
its conditions, its stages and its report. An entry of the group `workbench.agent_packs`."""

from workbench.agent_packs.pack import AgentPack, PackReport

PACK = AgentPack(
    name="rf",
    entry="workbench.agent_packs.rf.api",
    help="RF design with unit-checked calculators: the model alone, with retrieval, with the "
         "tools, and the tools agent trained with GRPO",
    # rf.api: CONDITIONS (the default set), then rf.grpo's CONDITION (on request)
    conditions=("alone", "rag", "tools", "tools+grpo"),
    report=PackReport(record="workbench.agent_packs.rf.report:RfReport",
                      reader="workbench.agent_packs.rf.report:read_report",
                      artifact="rf_report"),
)
