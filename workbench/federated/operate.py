"""Operating a Flower deployment: what `workbench fed up` and `fed run` do, as library
functions the CLI only prints (and the app or a script can call). `bring_up` starts the
SuperLink and one SuperNode per site (splitting the data first when no site folders are
given); `run_rounds` submits the rounds, waits for the SuperLink's final status and turns an
abort or an unfinished run into a `WorkbenchError` with the server's exit code."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.federated.config import FederatedConfig
from workbench.federated.deploy import DeployError, Deployment, Security
from workbench.federated.sites import site_folders, split_sites
from workbench.io import atomic_write_text
from workbench.runs import outputs_at


class RunFailed(WorkbenchError):
    """A federated run on a deployment that aborted or did not finish; `exit_code` is the
    server's (abort.json) or 1."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def deployment(fc: FederatedConfig, home: Path | None = None, certs: Path | None = None, *,
               auth: bool = False, insecure: bool = False) -> Deployment:
    """The deployment under `home` (default `federated.deploy.home`), with TLS material from
    `certs` and node authentication when `auth`; refuses `auth` without `certs`."""
    if auth and not certs:
        raise DeployError("--auth needs --certs (node authentication runs over TLS)")
    sec = Security.from_folder(certs, auth=auth) if certs else Security()
    return Deployment(home or Path(fc.deploy.home), port=fc.deploy.port, security=sec,
                      insecure=insecure)


def bring_up(fc: FederatedConfig, d: Deployment, sites: Path | None = None) -> dict[str, int]:
    """Start the SuperLink and one SuperNode per site folder under `sites` (default
    `federated.sites_dir`, else a split of `federated.split.source` into HOME/sites); returns
    the pids by process name once every node is online."""
    d.security_check()  # before any folder is written
    src = sites or (Path(fc.sites_dir) if fc.sites_dir else None)
    if src is None:
        sp = fc.split
        split_sites(sp.source, d.home / "sites", sites=sp.sites, by=sp.by,
                    eval_fraction=sp.eval_fraction, canaries=sp.canaries, seed=fc.seed)
        src = d.home / "sites"
    return d.up(site_folders(src))


@dataclass
class DeployedRun:
    """A finished federated run on a deployment: its id, server folder, the SuperLink's
    final status and the rounds the server logged."""

    run_id: int
    out: Path
    status: str
    rounds: list[dict[str, Any]] = field(default_factory=list)


def run_rounds(fc: FederatedConfig, d: Deployment, out: Path | None = None, *,
               timeout: float = 3600, log=print) -> DeployedRun:
    """Submit the rounds to the running deployment, wait for the final status (the
    SuperLink's, not `flwr run`'s exit code) and return it with the round log; raises
    `RunFailed` when the server aborted (its message and exit code) or the run did not
    finish."""
    from workbench.federated.server import read_rounds

    d.security_check()
    if "superlink" not in d.pids():
        raise DeployError(f"no SuperLink runs from {d.home}: start one with `workbench fed "
                          f"up --home {d.home}` (or point --home at the deployment)")
    out = (out or d.home / "runs" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    config = outputs_at("fed", out, under="federation").path("deploy_config")
    atomic_write_text(config, fc.model_dump_json(indent=1))
    run_id = d.submit(config, out)
    log(f"run {run_id} submitted; server folder {out}")
    st = d.wait_run(run_id, timeout)
    return DeployedRun(run_id=run_id, out=out, status=str(st.get("status", "")),
                       rounds=list(read_rounds(out)))


def check_outcome(run: DeployedRun, d: Deployment) -> None:
    """Raise `RunFailed` for a run the server aborted (abort.json) or that did not finish."""
    abort = outputs_at("fed", run.out, under="federation").path("abort")
    if abort.exists():
        info = json.loads(abort.read_text())
        raise RunFailed(info["message"], int(info.get("exit_code", 1)))
    if run.status != "finished:completed":
        raise RunFailed(f"the run ended {run.status}: see {d.home / 'logs'}")
