"""The Flower app (FAB) of the federated pipeline: `pyproject.toml` + `wbfed/` (client app,
server app). It holds code only; sites' data paths come from node config. Its apps sit above
both tracks: the ClientApp routes each message type to its track's handler, the ServerApp
runs the config's track (`federated.serving`)."""


def client_app():
    """The FAB's ClientApp object (the same one a SuperNode loads), for in-process runs
    (`inprocess.InProcessGrid`)."""
    from workbench.federated.flower_app.wbfed.client_app import app

    return app
