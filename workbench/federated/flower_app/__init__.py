"""The Flower app (FAB) of the federated pipeline: `pyproject.toml` + `wbfed/` (client app,
server app). It holds code only; sites' data paths come from node config."""
