"""A real Flower deployment on this machine: one SuperLink and one SuperNode per site, bound to
127.0.0.1, started, driven and stopped by pid.

`up` starts the processes with an isolated Flower home (`FLWR_HOME` under the deployment
folder), telemetry and update checks off, runtime dependency installation off; without TLS
certificates it refuses unless `insecure=True`. `run` submits the app and reads the run's
final status from the SuperLink (`flwr run --stream` exits 0 even when the server app
fails); `down` stops what `up` started. Real sites run `flower-supernode` on their own
machines with the same flags (`supernode_command` prints them); see the README.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.federated.certs import make_node_key
from workbench.io import atomic_write_json, atomic_write_text, pid_alive

APP_DIR = Path(__file__).parent / "flower_app"
CONNECTION = "wb"


class DeployError(WorkbenchError):
    exit_code = 5


@dataclass
class Security:
    """TLS material (`ca`, `cert`, `key`: PEM files) and node authentication (the folder of
    per-site `site-N.key` private keys and `.pub` public keys to register)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    node_keys: Path | None = None

    @property
    def tls(self) -> bool:
        return self.ca is not None

    @classmethod
    def from_folder(cls, folder: str | Path, *, auth: bool = False) -> Security:
        d = Path(folder)
        need = [d / "ca.crt", d / "server.crt", d / "server.key"]
        if missing := [str(p) for p in need if not p.exists()]:
            raise DeployError(f"TLS material missing: {', '.join(missing)} (make it with "
                              f"`workbench fed certs {d}`)")
        return cls(ca=need[0], cert=need[1], key=need[2],
                   node_keys=(d / "nodes") if auth else None)


def _bin(name: str) -> str:
    p = Path(sys.executable).parent / name
    if not p.exists():
        raise DeployError(f"{name} is not installed next to {sys.executable} "
                          f"(pip install 'flwr==1.42.*')")
    return str(p)


@dataclass
class Deployment:
    home: Path
    port: int = 9190
    security: Security = field(default_factory=Security)
    insecure: bool = False

    def __post_init__(self):
        self.home = Path(self.home).resolve()
        self._procs: dict[str, subprocess.Popen] = {}

    # -- environment ---------------------------------------------------------------------------
    @property
    def flwr_home(self) -> Path:
        return self.home / "flwr"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(FLWR_HOME=str(self.flwr_home), FLWR_TELEMETRY_ENABLED="0",
                   FLWR_DISABLE_UPDATE_CHECK="1",
                   FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                   PYTHONUNBUFFERED="1")
        return env

    def security_check(self) -> None:
        """Refuse a deployment without TLS unless it was started as --insecure, and node
        authentication without TLS."""
        if not self.security.tls and not self.insecure:
            raise DeployError("no TLS certificates: pass --certs FOLDER (make one with "
                              "`workbench fed certs`) or --insecure for a loopback test")
        if self.security.node_keys and not self.security.tls:
            raise DeployError("node authentication needs TLS: pass --certs as well")

    def superlink_command(self) -> list[str]:
        cmd = [_bin("flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
               "--database", str(self.home / "superlink.db"),
               "--disable-runtime-dependency-installation"]
        if self.security.tls:
            cmd += ["--ssl-ca-certfile", str(self.security.ca),
                    "--ssl-certfile", str(self.security.cert),
                    "--ssl-keyfile", str(self.security.key)]
        else:
            cmd += ["--insecure"]
        if self.security.node_keys:
            cmd += ["--enable-supernode-auth"]
        return cmd

    def supernode_command(self, index: int, data_path: str | Path, *,
                          superlink: str | None = None, max_wait_s: float | None = 60,
                          private_key: Path | None = None, ca: Path | None = None) -> list[str]:
        """The command a site runs; `superlink` is the server's host:port (default: this
        machine's loopback port)."""
        node_config = f'data-path="{Path(data_path).resolve()}"'
        cmd = [_bin("flower-supernode"), "--superlink", superlink or f"127.0.0.1:{self.port}",
               "--host", "127.0.0.1", "--port", str(self.port + 1 + index),
               "--node-config", node_config]
        if max_wait_s:
            cmd += ["--max-wait-time", f"{max_wait_s:g}"]
        ca = ca or self.security.ca
        cmd += ["--root-certificates", str(ca)] if ca else ["--insecure"]
        key = private_key or (self.security.node_keys / f"site-{index}.key"
                              if self.security.node_keys else None)
        if key:
            cmd += ["--auth-supernode-private-key", str(key)]
        return cmd

    def write_cli_config(self) -> None:
        lines = ["[superlink]", f'default = "{CONNECTION}"', "",
                 f"[superlink.{CONNECTION}]", f'address = "127.0.0.1:{self.port}"']
        lines += [f'root-certificates = "{self.security.ca}"'] if self.security.tls \
            else ["insecure = true"]
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.flwr_home / "config.toml", "\n".join(lines) + "\n")

    # -- processes ---------------------------------------------------------------------------
    @property
    def pid_file(self) -> Path:
        return self.home / "pids.json"

    def pids(self) -> dict[str, int]:
        """The processes `up` started that still run Flower (a pid the system gave to some
        other program since is not ours)."""
        try:
            raw = json.loads(self.pid_file.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        return {k: v for k, v in raw.items() if _is_flower(v)}

    def _spawn(self, name: str, cmd: list[str]) -> int:
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as out:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env(),
                                 cwd=self.home, start_new_session=True)
        self._procs[name] = p
        pids = self.pids()
        pids[name] = p.pid
        atomic_write_json(self.pid_file, pids)
        return p.pid

    def up(self, sites: list[Path], *, wait_s: float = 60.0) -> dict[str, int]:
        """Start the SuperLink and one SuperNode per site folder; return when every node is
        online (or raise naming the logs)."""
        self.security_check()
        if live := {k: v for k, v in self.pids().items() if pid_alive(v)}:
            raise DeployError(f"{self.home} already runs {sorted(live)}: `workbench fed down "
                              f"--home {self.home}` first")
        for p in range(self.port, self.port + 1 + len(sites)):
            if _port_busy(p):
                raise DeployError(f"port 127.0.0.1:{p} is taken: choose another --port")
        self.home.mkdir(parents=True, exist_ok=True)
        self.write_cli_config()
        if self.security.node_keys:
            self.make_node_keys(len(sites))
        try:
            self._spawn("superlink", self.superlink_command())
            self.wait_port(self.port, wait_s)
            if self.security.node_keys:
                for i in range(len(sites)):
                    self.register_node(self.security.node_keys / f"site-{i}.pub")
            for i, s in enumerate(sites):
                self._spawn(f"supernode-{i}", self.supernode_command(i, s))
            self.wait_nodes(len(sites), wait_s)
        except BaseException:
            self.down(grace_s=5)  # nothing half-started is left behind
            raise
        return self.pids()

    def add_node(self, index: int, data_path: Path, **kw) -> int:
        return self._spawn(f"supernode-{index}", self.supernode_command(index, data_path, **kw))

    def wait_exit(self, name: str, timeout_s: float) -> int | None:
        """The exit status of a process this object started, or None if it still runs after
        `timeout_s`. (Flower exits 1 for its own error codes >= 100 and logs `Exit Code: N`.)"""
        try:
            return self._procs[name].wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def log_text(self, name: str) -> str:
        p = self.home / "logs" / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def wait_port(self, port: int, wait_s: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < wait_s:
            if _port_busy(port):
                return
            if not pid_alive(self.pids().get("superlink")):
                break
            time.sleep(0.2)
        raise DeployError(f"the SuperLink did not listen on 127.0.0.1:{port} within "
                          f"{wait_s:g} s; see {self.home / 'logs' / 'superlink.log'}")

    def flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([_bin("flwr"), *args], env=self.env(), cwd=self.home,
                                  capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise DeployError(f"`flwr {args[0]}` did not answer within {timeout:g} s; is the "
                              f"SuperLink up? see {self.home / 'logs'}") from None

    def nodes(self) -> list[dict]:
        """The SuperLink's view of its SuperNodes (`flwr supernode list`)."""
        r = self.flwr("supernode", "list", CONNECTION, "--format", "json")
        try:
            data = json.loads(r.stdout)
        except json.JSONDecodeError:
            return []
        return data.get("nodes", []) if isinstance(data, dict) else []

    def online(self) -> int:
        return sum(1 for n in self.nodes() if str(n.get("status", "")).lower() == "online")

    def wait_nodes(self, n: int, wait_s: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < wait_s:
            if self.online() >= n:
                return
            time.sleep(1.0)
        raise DeployError(f"{self.online()} of {n} SuperNodes online after {wait_s:g} s; see "
                          f"{self.home / 'logs'}")

    def processes(self) -> set[int]:
        """Every live process of the deployment: the ones `up` started and all their
        descendants (Flower's SuperExec starts its own session, and the server and client
        apps run under it, so process groups alone miss them)."""
        return descendants(set(self.pids().values()))

    def down(self, grace_s: float = 10.0) -> list[str]:
        """SIGTERM every process of the deployment, SIGKILL what is left after `grace_s`;
        return the names of the processes `up` started."""
        pids = self.pids()
        every = self.processes()
        for pid in pids.values():
            _signal_group(pid, signal.SIGTERM)
        for pid in every:
            _signal(pid, signal.SIGTERM)
        t0 = time.monotonic()
        while time.monotonic() - t0 < grace_s and any(pid_alive(p) for p in every):
            time.sleep(0.2)
        for pid in every | descendants(every):
            if pid_alive(pid):
                _signal(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return sorted(pids)

    # -- node authentication -----------------------------------------------------------------
    def make_node_keys(self, n: int) -> None:
        d = self.security.node_keys
        if d is None:
            raise WorkbenchError("node keys are made for a deployment with node authentication")
        d.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            if not (d / f"site-{i}.key").exists():
                make_node_key(d / f"site-{i}.key", d / f"site-{i}.pub")

    def register_node(self, public_key: Path) -> None:
        r = self.flwr("supernode", "register", str(public_key), CONNECTION, "--format", "json")
        try:
            ok = json.loads(r.stdout).get("success")  # the CLI exits 0 on errors too
        except json.JSONDecodeError:
            ok = False
        if not ok:
            raise DeployError(f"registering {public_key} failed: "
                              f"{(r.stdout or r.stderr).strip()[-300:]}")

    # -- runs --------------------------------------------------------------------------------
    def submit(self, config_file: Path, out_dir: Path) -> int:
        overrides = f'config-file="{Path(config_file).resolve()}" ' \
                    f'out-dir="{Path(out_dir).resolve()}"'
        r = self.flwr("run", str(APP_DIR), CONNECTION, "--run-config", overrides,
                      "--format", "json", timeout=120)
        try:
            data = json.loads(r.stdout)
        except json.JSONDecodeError:
            data = {}
        if not data.get("success") or not data.get("run-id"):
            why = str(data.get("error-message") or r.stderr or r.stdout).strip()
            raise DeployError("flwr run failed: " + " ".join(why.split())[-400:])
        return int(data["run-id"])

    def status(self, run_id: int) -> dict:
        r = self.flwr("ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        try:
            runs = json.loads(r.stdout).get("runs", [])
        except json.JSONDecodeError:
            runs = []
        return runs[0] if runs else {}

    def wait_run(self, run_id: int, timeout_s: float, poll_s: float = 2.0) -> dict:
        """Poll until the run is finished; stop it (`flwr stop`) when `timeout_s` passes."""
        t0 = time.monotonic()
        while True:
            st = self.status(run_id)
            if str(st.get("status", "")).startswith("finished"):
                return st
            if not st and "superlink" not in self.pids():
                raise DeployError(f"the SuperLink is gone (run {run_id} unknown); see "
                                  f"{self.home / 'logs' / 'superlink.log'}")
            if time.monotonic() - t0 > timeout_s:
                self.flwr("stop", str(run_id), CONNECTION)
                raise DeployError(f"run {run_id} did not finish within {timeout_s:g} s "
                                  f"(stopped); see {self.home / 'logs'}")
            time.sleep(poll_s)


def _port_busy(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _is_flower(pid: int | None) -> bool:
    if not pid or not pid_alive(pid):
        return False
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the pid file
    return b"flower-" in cmd or b"flwr" in cmd


def descendants(roots: set[int]) -> set[int]:
    """`roots` and every live process below them (from `ps`)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True,
                         check=False).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        pid, ppid = (int(x) for x in line.split())
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [r for r in roots if r]
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo += children.get(p, [])
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(os.getpgid(pid), sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def emitted_flags(d: Deployment | None = None) -> dict[str, set[str]]:
    """Every flag the launcher can pass, per binary (for the version contract test)."""
    sec = Security(ca=Path("ca"), cert=Path("c"), key=Path("k"), node_keys=Path("n"))
    d = d or Deployment(Path("/tmp/x"), security=sec)
    insecure = Deployment(Path("/tmp/x"), insecure=True)
    link = set(d.superlink_command()) | set(insecure.superlink_command())
    node = set(d.supernode_command(0, "/tmp")) | set(insecure.supernode_command(0, "/tmp"))
    return {"flower-superlink": {a for a in link if a.startswith("--")},
            "flower-supernode": {a for a in node if a.startswith("--")}}


def shell(cmd: list[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)
