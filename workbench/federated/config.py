"""Federated settings (the `federated:` section of an experiment config).

One config drives both ways to run: in process (`workbench fed sim`, tests, the experiment)
and a real Flower deployment (`workbench fed up` / `run` / `down`), where the server app reads
the same JSON and the sites get their part in each round's message.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from workbench.config import ConfigSection
from workbench.errors import WorkbenchError
from workbench.records import StrictModel
from workbench.train.config import LoraSettings


class SplitSettings(ConfigSection):
    """How one QTSA dataset becomes per-site data (for experiments; real sites bring their
    own folders)."""

    source: str = Field("datasets/rf_distilled", description="A distillation run folder or "
                        "the shipped rf_distilled sample (mcQTSA/ndQTSA + benchmark.jsonl).")
    sites: int = Field(3, ge=2, le=16, description="Number of sites.")
    by: Literal["chapter", "random"] = Field(
        "chapter", description="chapter: whole corpus documents go to one site each "
                               "(non-IID, as real sites are); random: rows are dealt out.")
    eval_fraction: float = Field(0.2, gt=0, lt=1, description="Per-site held-out share.")
    canaries: int = Field(2, ge=0, description="Unique secret strings planted in each site's "
                                               "training rows; none may ever leave a site.")


class LocalTrain(ConfigSection):
    """What each site does with the global adapter in one round."""

    steps: int = Field(4, ge=1, description="Optimizer steps per site per round.")
    learning_rate: float = Field(3e-4, gt=0)
    batch_size: int = Field(4, ge=1)
    max_length: int = Field(512, ge=16)
    lora: LoraSettings = Field(default_factory=lambda: LoraSettings(r=8, alpha=16,
                                                                     dropout=0.0))


class Guards(ConfigSection):
    """What Flower's own strategies lack: bounded waits, minimum success, failure budget."""

    min_nodes: int = Field(2, ge=1, description="Sites that must be connected before round 1.")
    wait_nodes_s: float = Field(60.0, gt=0, description="Give up (non-zero exit) when fewer "
                                "than min_nodes are connected after this many seconds.")
    min_replies: int = Field(1, ge=1, description="Successful replies a round needs; with "
                             "fewer the round fails and the global adapter stays as it was.")
    round_timeout_s: float = Field(120.0, gt=0, description="Seconds a round waits for "
                                   "replies (Flower's default is an hour).")
    max_failed_rounds: int = Field(2, ge=1, description="Consecutive failed rounds before the "
                                   "run aborts with a non-zero exit.")


class DeploySettings(ConfigSection):
    """The loopback deployment `workbench fed up` starts (real sites run their own
    SuperNode; see the README)."""

    port: int = Field(9190, ge=1024, le=65535, description="SuperLink port (Fleet, Control "
                      "and ServerApp APIs share it); SuperNodes take the following ports.")
    home: str = Field(".fed", description="Deployment folder: FLWR_HOME, pids, logs, certs.")


class AgentSettings(StrictModel):
    """How a prompted data agent works a task (`knowledge.prompted`; the agent is
    `knowledge.agent.DataAgent`)."""

    model: str = Field("default", description="Chat model that chooses the calls.")
    candidates: int = Field(8, ge=2, le=32, description="Grammar plans offered per task.")
    rollouts: int = Field(40, ge=1, description="Plan samples drawn to find the candidates.")
    max_steps: int = Field(4, ge=2, description="Model turns per trial (a plan counts).")
    max_tool_calls: int = Field(2, ge=1, description="run_sql calls per trial.")
    trials: int = Field(2, ge=1, description="reflexion: trials per task.")
    rows: int = Field(5, ge=1, description="Rows a run_sql observation shows.")


def parse_agent_settings(raw: dict | None) -> AgentSettings:
    """`knowledge.prompted` validated (errors name the field)."""
    try:
        return AgentSettings.model_validate(raw or {})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"])) or "(settings)"
        raise WorkbenchError(f"knowledge.prompted.{where}: {first['msg']}") from None


class KnowledgeSettings(ConfigSection):
    """Track B: knowledge units (workflows) evolved across data-agent sites."""

    k_min: int = Field(2, ge=1, description="Sites that must support a unit before it is "
                                            "active and sent out.")
    agent: Literal["grammar", "prompted"] = Field(
        "grammar", description="grammar: each scaffold is a search strategy over the query "
                               "grammar and units reweight its prior (fast); prompted: a chat "
                               "model runs ReAct / plan-then-execute / Reflexion with tools, "
                               "units rendered into its prompt.")
    prompted: dict[str, Any] = Field(
        default_factory=dict, description="The prompted agent's settings: model, candidates, "
                                          "rollouts, max_steps, max_tool_calls, trials, rows.")
    slice: int | None = Field(None, ge=1, description="At most this many tasks in each of a "
                              "site's slices (learn, gate, eval); None: all of them.")

    @field_validator("prompted")
    @classmethod
    def _prompted_settings(cls, v: dict[str, Any]) -> dict[str, Any]:
        """Checked here, not at the first round on every site (`AgentSettings`)."""
        try:
            parse_agent_settings(v)
        except WorkbenchError as e:
            raise ValueError(str(e).removeprefix("knowledge.prompted.")) from None
        return v
    learn_iterations: int = Field(24, ge=1, description="Search iterations per local task "
                                                        "when a site works its tasks.")
    eval_iterations: int = Field(6, ge=1, description="Search budget per task when success "
                                                      "is measured (gate and report).")
    boost: float = Field(8.0, ge=1, description="How much a workflow raises the prior of "
                                                "the options it predicts.")
    min_support: int = Field(2, ge=1, description="Verified plans a site needs before it "
                                                  "proposes a workflow.")
    gate: bool = Field(True, description="Local A/B gate: keep a new unit only if it does "
                                         "not lower success on the site's gate slice.")
    ngram: int = Field(5, ge=2, description="Word n-gram the privacy filter matches against "
                                            "the site's own trajectories.")
    max_similarity: float | None = Field(
        None, gt=0, le=1, description="Also drop a unit whose MiniLM cosine to any of the "
                                      "site's trajectory texts reaches this (e.g. 0.9); None: "
                                      "n-grams and identifiers only.")
    merge_similarity: float = Field(0.95, gt=0, le=1, description="Server: a new insight "
                                    "(free text) joins an existing unit of its family when "
                                    "their MiniLM cosine reaches this.")
    embed_against: Literal["questions", "all"] = Field(
        "questions", description="What the embedding threshold compares a unit with: the "
                                 "site's task questions, or every private text of the round "
                                 "(questions, reference programs, the SQL its agents ran).")
    chinook_parts: int = Field(3, ge=1, description="Experiment sites: Chinook split by "
                                                    "customer into this many sites ...")
    extra: list[str] = Field(default_factory=lambda: ["sklearn_classic"],
                             description="... plus these shipped environments as sites.")
    scaffolds: list[str] = Field(default_factory=lambda: ["react", "plan", "reflexion"],
                                 description="Scaffold of each site, in turn.")
    listener: int | None = Field(3, description="A site that receives units and contributes "
                                                "none (cross-scaffold transfer); None: none.")
    poison: int | None = Field(2, description="A site that pushes a harmful workflow every "
                                              "round (how often it gets promoted); None: none.")


class FederatedConfig(ConfigSection):
    track: Literal["lora", "knowledge"] = Field(
        "lora", description="lora: FedAvg over LoRA adapters; knowledge: knowledge units "
                            "(workflows) across data-agent sites.")
    model: str = Field("default", description="Base model spec every site resolves locally.")
    rounds: int = Field(3, ge=1)
    aggregation: Literal["fedavg", "ffa"] = Field(
        "fedavg", description="fedavg: average A and B separately (what FlowerTune does; not "
                              "the average of BA); ffa: FFA-LoRA, A frozen at its shared "
                              "initialisation and only B averaged, which is exact.")
    sites_dir: str | None = Field(None, description="Folder of per-site data folders; None: "
                                  "split `split.source` into <run>/federated/sites.")
    split: SplitSettings = Field(default_factory=SplitSettings)
    local: LocalTrain = Field(default_factory=LocalTrain)
    knowledge: KnowledgeSettings = Field(default_factory=KnowledgeSettings)
    guards: Guards = Field(default_factory=Guards)
    deploy: DeploySettings = Field(default_factory=DeploySettings)
    baselines: bool = Field(True, description="Also train local-only and centralised adapters "
                                              "at equal total steps, for the report.")
    mc_eval: bool = Field(True, description="Score each site's benchmark items (cloze "
                                            "log-likelihood) with the final adapters.")
    keep_replies: bool = Field(False, description="Save every site's returned adapter per "
                               "round under <out>/replies (audit; tests check the average).")
    seed: int = 0
