"""The literature-search pack as the agent pipeline sees it (data only; `pack.AgentPack`):
its code, its conditions, its stages and its report. An entry of the group
`workbench.agent_packs`."""

from workbench.agent_packs.pack import AgentPack, PackReport
from workbench.registry import Artifact, Stage

PACK = AgentPack(
    name="litsearch",
    entry="workbench.agent_packs.litsearch.api",
    help="literature search over a citation graph: query only, a fixed workflow, the agent, "
         "an oracle, and the agent with SFT and DPO adapters",
    # litsearch.api: CONDITIONS (the default set), then tuned.TRAINED (on request; more
    # agent+NAME conditions come from agent.adapters)
    conditions=("query_only", "fixed", "agent", "oracle", "agent+sft", "agent+sft_dpo"),
    stages=(
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
        # the report: a typed record (`litsearch.report.read_report`) and its markdown
        Stage("litsearch_report", help="litsearch: Hit@5, MRR, nDCG@10 per condition",
              outputs=(Artifact("litsearch_report", "litsearch_report.json",
                                "workbench.agent_packs.litsearch.report:LitsearchReport"),
                       Artifact("litsearch_report_md", "litsearch_report.md"))),
    ),
    report=PackReport(record="workbench.agent_packs.litsearch.report:LitsearchReport",
                      reader="workbench.agent_packs.litsearch.report:read_report",
                      artifact="litsearch_report"),
    reads=("adapters",),
)
