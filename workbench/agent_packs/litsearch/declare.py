"""The literature-search pack as the agent pipeline sees it (data only; `pack.AgentPack`):
its code, its conditions, its stages and its report. An entry of the group
`workbench.agent_packs`."""

from workbench.agent_packs.pack import AgentPack, PackReport

PACK = AgentPack(
    name="litsearch",
    entry="workbench.agent_packs.litsearch.api",
    help="literature search over a citation graph: query only, a fixed workflow, the agent, "
         "an oracle, and the agent with SFT and DPO adapters",
    # litsearch.api: CONDITIONS (the default set), then tuned.TRAINED (on request; more
    # agent+NAME conditions come from agent.adapters)
    conditions=("query_only", "fixed", "agent", "oracle", "agent+sft", "agent+sft_dpo"),
    report=PackReport(record="workbench.agent_packs.litsearch.report:LitsearchReport",
                      reader="workbench.agent_packs.litsearch.report:read_report",
                      artifact="litsearch_report"),
    reads=("adapters",),
)
