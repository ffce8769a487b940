"""ServerApp: FedAvg / FFA-LoRA rounds with bounded waits, a minimum-success check, atomic
per-round adapters and resume (workbench.federated.server.FedServer).

Run config: `config-file` (the resolved federated config as JSON) and `out-dir` (where the
global adapters, rounds.jsonl and summary.json go), both set by `workbench fed run`."""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from workbench.federated.server import serve

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    serve(grid, str(context.run_config["config-file"]), str(context.run_config["out-dir"]))
