"""The ServerApp's body, above both tracks as the ClientApp is: it reads the config that
`workbench fed run` wrote and runs that track's rounds, the adapters' (`server.FedServer`) or
the knowledge units' (`knowledge.server.KnowledgeServer`); an abort is written where the
launcher reads it."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.federated.config import FederatedConfig
from workbench.federated.guards import FedAbort
from workbench.federated.knowledge.server import KnowledgeServer
from workbench.federated.server import FedServer
from workbench.io import append_line, atomic_write_json
from workbench.runs import outputs_at

if TYPE_CHECKING:
    from flwr.serverapp import Grid


def serve(grid: Grid, config_file: str, out_dir: str) -> dict[str, Any]:
    """The ServerApp's body: read the config `workbench fed run` wrote, run the rounds. An
    abort is written to `out_dir/abort.json` (the launcher reports it) and re-raised, so
    the run ends as failed."""
    if not config_file or not out_dir:
        raise FedAbort("run config needs config-file and out-dir (use `workbench fed run`)")
    cfg = FederatedConfig.model_validate_json(Path(config_file).read_text())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = outputs_at("fed", out, under="federation")
    files.path("abort").unlink(missing_ok=True)  # a resumed run starts without the old one
    logger = logging.getLogger("workbench.federated")

    def log(line: str) -> None:
        logger.info(line)
        append_line(files.path("server_log"), f"{time.strftime('%H:%M:%S')} {line}")

    server = KnowledgeServer if cfg.track == "knowledge" else FedServer
    try:
        return server(cfg, out, log=log).run(grid)
    except FedAbort as e:
        atomic_write_json(files.path("abort"),
                          {"message": str(e), "exit_code": e.exit_code, **e.details})
        log(f"abort: {e}")
        raise
