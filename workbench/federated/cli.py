"""`workbench fed ...`: split data into sites, run the federation in process (`sim`), or on a
real Flower deployment (`up`, `run`, `status`, `down`), make TLS/auth material (`certs`), and
print the command a real site runs (`join`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from workbench.cli_options import ConfigArg, ConfigOpt, SetOpt, load
from workbench.federated.certs import make_node_key, make_tls
from workbench.federated.deploy import Deployment, shell
from workbench.federated.operate import bring_up, check_outcome, deployment, run_rounds
from workbench.federated.sites import load_site, split_sites
from workbench.io import pid_alive
from workbench.jobs import run_in_process
from workbench.progress import quiet_libraries

HomeOpt = Annotated[Path | None, typer.Option(
    "--home", help="Deployment folder (FLWR_HOME, pids, logs); default federated.deploy.home.")]
CertsOpt = Annotated[Path | None, typer.Option(
    "--certs", help="Folder with ca.crt, server.crt, server.key (`workbench fed certs`).")]


def _cfg(config, config_opt, set_):
    return load(config, config_opt, set_)


def _deployment(fc, home: Path | None, certs: Path | None, auth: bool, insecure: bool):
    return deployment(fc, home, certs, auth=auth, insecure=insecure)


def register(group: typer.Typer) -> None:
    @group.command("split")
    def split(source: Annotated[Path, typer.Argument(help="A distillation run folder (or "
                                                          "datasets/rf_distilled).")],
              out: Annotated[Path, typer.Argument(help="Folder for site-0, site-1, ...")],
              sites: Annotated[int, typer.Option(help="Number of sites.")] = 3,
              by: Annotated[str, typer.Option(help="chapter or random.")] = "chapter",
              canaries: Annotated[int, typer.Option(help="Secret strings planted per site "
                                                         "(leak checks).")] = 2):
        """Split QTSA rows into site folders (train/eval/benchmark + site.json)."""
        for d in split_sites(source, out, sites=sites, by=by, canaries=canaries):
            s = load_site(d)
            typer.echo(f"{d}: {len(s.train)} train, {len(s.eval)} eval, "
                       f"{len(s.benchmark)} MC items")

    @group.command("sim")
    def sim(config: ConfigArg = None, config_opt: ConfigOpt = None, set_: SetOpt = None,
            fresh: Annotated[bool, typer.Option(help="Start over.")] = False):
        """Run the federated experiment in this process: sites from federated.sites_dir (or
        a split of federated.split.source), FedAvg rounds through the same Flower apps a
        deployment runs, local-only and centralised baselines, report."""
        quiet_libraries()
        result = run_in_process("fed", _cfg(config, config_opt, set_),
                                log=lambda m: typer.echo(m, err=True), fresh=fresh)
        typer.echo(result.message)

    @group.command("up")
    def up(sites: Annotated[Path | None, typer.Option(
               help="Folder of site folders; default federated.sites_dir, else a split of "
                    "federated.split.source into HOME/sites.")] = None,
           config: ConfigArg = None, config_opt: ConfigOpt = None, set_: SetOpt = None,
           home: HomeOpt = None, certs: CertsOpt = None,
           auth: Annotated[bool, typer.Option(help="SuperNode authentication: one key pair "
                                                   "per site, registered with the SuperLink.")]
           = False,
           insecure: Annotated[bool, typer.Option(
               help="Run without TLS (loopback tests only).")] = False):
        """Start a SuperLink and one SuperNode per site on 127.0.0.1; wait until all are
        online. Refuses to run without --certs unless --insecure is given."""
        fc = _cfg(config, config_opt, set_).federated
        d = _deployment(fc, home, certs, auth, insecure)
        pids = bring_up(fc, d, sites)
        typer.echo(f"up: SuperLink 127.0.0.1:{d.port}, {len(pids) - 1} SuperNodes "
                   f"(pids {', '.join(f'{k}={v}' for k, v in pids.items())}); logs in "
                   f"{d.home / 'logs'}")

    @group.command("run")
    def run(config: ConfigArg = None, config_opt: ConfigOpt = None,
            set_: SetOpt = None, home: HomeOpt = None,
            certs: CertsOpt = None,
            out: Annotated[Path | None, typer.Option(
                help="The server's folder (global adapters, rounds.jsonl); default "
                     "HOME/runs/<time>.")] = None,
            timeout: Annotated[float, typer.Option(help="Stop the run after this many "
                                                        "seconds.")] = 3600,
            insecure: Annotated[bool, typer.Option(help="The deployment runs without TLS.")]
            = False):
        """Submit the federated rounds to the deployment `up` started, wait for the final
        status (read from the SuperLink, not from `flwr run`'s exit code), print the round
        summary. Exits non-zero when the run failed or aborted (the server's exit code)."""
        fc = _cfg(config, config_opt, set_).federated
        d = _deployment(fc, home, certs, False, insecure)
        run = run_rounds(fc, d, out, timeout=timeout, log=lambda m: typer.echo(m, err=True))
        for r in run.rounds:
            typer.echo(f"round {r['round']} {r['kind']}: {r['status']}, {r['used']}/"
                       f"{r['sent']} replies, {r['seconds']:.1f} s")
        typer.echo(f"run {run.run_id}: {run.status}")
        check_outcome(run, d)

    @group.command("status")
    def status(config: ConfigArg = None, config_opt: ConfigOpt = None, set_: SetOpt = None,
               home: HomeOpt = None):
        """The processes `up` started and the SuperLink's view of its SuperNodes."""
        fc = _cfg(config, config_opt, set_).federated
        d = _deployment(fc, home, None, False, True)
        for name, pid in sorted(d.pids().items()):
            typer.echo(f"{name}: pid {pid} {'alive' if pid_alive(pid) else 'gone'}")
        for n in d.nodes():
            typer.echo(f"node {n.get('node-id')}: {n.get('status')}")

    @group.command("down")
    def down(config: ConfigArg = None, config_opt: ConfigOpt = None, set_: SetOpt = None,
             home: HomeOpt = None):
        """Stop every process `up` started (SIGTERM, then SIGKILL after 10 s)."""
        fc = _cfg(config, config_opt, set_).federated
        d = _deployment(fc, home, None, False, True)
        stopped = d.down()
        typer.echo(f"stopped {', '.join(stopped) or 'nothing (no pids recorded)'}")

    @group.command("certs")
    def certs_cmd(folder: Annotated[Path, typer.Argument(help="Where to write the files.")],
                  host: Annotated[list[str] | None, typer.Option(
                      help="SuperLink host names / IPs for the certificate (repeat).")]
                  = None,
                  nodes: Annotated[int, typer.Option(help="Site key pairs to make under "
                                                         "FOLDER/nodes.")] = 0):
        """Make a CA, a SuperLink certificate and (with --nodes) site key pairs."""
        files = make_tls(folder, hosts=tuple(host or ("127.0.0.1", "localhost")))
        for i in range(nodes):
            (folder / "nodes").mkdir(parents=True, exist_ok=True)
            make_node_key(folder / "nodes" / f"site-{i}.key",
                          folder / "nodes" / f"site-{i}.pub")
        typer.echo(f"wrote {', '.join(str(p) for p in files.values())}"
                   + (f" and {nodes} key pairs in {folder / 'nodes'}" if nodes else ""))

    @group.command("join")
    def join(data: Annotated[Path, typer.Argument(help="This site's data folder.")],
             superlink: Annotated[str, typer.Option(help="The server's host:port.")],
             ca: Annotated[Path | None, typer.Option(help="The federation's ca.crt.")] = None,
             key: Annotated[Path | None, typer.Option(
                 help="This site's private key (node authentication).")] = None,
             port: Annotated[int, typer.Option(help="Local port of this SuperNode's "
                                                    "runtime API.")] = 9094):
        """Print the `flower-supernode` command a real site runs to join (its data path goes
        in the node config and never leaves the machine)."""
        load_site(data)  # refuse a broken folder before anyone starts a node on it
        d = Deployment(Path("."), port=port - 1, insecure=ca is None)
        typer.echo(shell(d.supernode_command(0, data, superlink=superlink, private_key=key,
                                             ca=ca, max_wait_s=None)))
        if ca is None:
            typer.echo("warning: no --ca: the command uses --insecure (no TLS)",
                       err=sys.stdout.isatty())
