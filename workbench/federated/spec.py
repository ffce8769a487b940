"""The federated pipeline as the registry sees it (data only; nothing heavy imported)."""

from workbench.registry import Artifact, Pipeline, Stage

PIPELINE = Pipeline(
    name="fed",
    requires=("knowledge_site", "knowledge_sites", "knowledge_agent_settings", "qtsa_chat"),
    config_key="federated",
    help="Federated LoRA with Flower: sites train a shared adapter on private data (FedAvg "
         "or FFA-LoRA), in process or on a real SuperLink/SuperNode deployment; report "
         "against local-only and centralised training.",
    config="workbench.federated.config:FederatedConfig",
    run="workbench.federated.api:run",
    stages=(
        Stage("sites", help="split the QTSA data into per-site folders (by chapter)",
              outputs=(Artifact("sites", "sites"),)),
    ),
    cli="workbench.federated.cli:register",
    page="federated.py", page_title="Federated", page_icon=":material/hub:", order=70,
)
