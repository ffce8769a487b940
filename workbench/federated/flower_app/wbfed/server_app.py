"""ServerApp: FedAvg / FFA-LoRA rounds (workbench.federated.server.FedServer) or knowledge
rounds (workbench.federated.knowledge.server.KnowledgeServer), by the config's track, with
bounded waits, a minimum-success check, atomic per-round saves and resume
(workbench.federated.serving.serve).

Run config: `config-file` (the resolved federated config as JSON) and `out-dir` (where the
global adapters, rounds.jsonl and summary.json go), both set by `workbench fed run`."""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from workbench.federated.serving import serve

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    serve(grid, str(context.run_config["config-file"]), str(context.run_config["out-dir"]))
