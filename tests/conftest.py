"""Shared fixtures, and the two test tiers.

The README's command (`python -m pytest -q`) runs the fast tier: every package through its
public API with tiny random-init models, scripted models and in-process CLI calls. The full
tier (`python -m pytest -q --tier full`) runs the rest: a test belongs to it because it asks
for one of the fixtures in FULL_TIER (the bundled model, a CLI subprocess, a server process,
the Flower deployment, kill injection, real training, the browser, the installed wheel),
directly or through another fixture. `--tier all` runs both; CI runs the fast tier, then the
full tier.

A fast-tier test that loads the bundled chat model or starts the CLI as a subprocess fails
with a message saying which fixture would move it to the full tier.
"""

import functools
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# --- tiers -------------------------------------------------------------------------------------

FULL_TIER = {
    "bundled_model": "loads the bundled SmolLM2-135M chat model",
    "bundled_llamacpp": "loads the bundled SmolLM2-135M chat model into llama.cpp",
    "cli_process": "runs the workbench CLI as a subprocess",
    "server_process": "starts a server in another process",
    "flower_deployment": "starts a Flower SuperLink and SuperNodes",
    "kill_injection": "kills a process in the middle of its work",
    "real_training": "trains or scores past a tiny model's few steps",
    "browser": "drives Chromium",
    "installed_workbench": "installs a wheel of the checkout into a new virtual environment",
    "thorough_fuzz": "sends a thousand fuzzed requests or more",
}
_current = {"tier": "all", "test": ""}


def tier_of(item) -> str:
    return "full" if FULL_TIER.keys() & set(getattr(item, "fixturenames", ())) else "fast"


def pytest_addoption(parser):
    parser.addoption("--tier", choices=("fast", "full", "all"), default=None,
                     help="fast (the default): tiny and scripted models, in-process CLI, "
                          "minutes; full: the tests that use a fixture of conftest.FULL_TIER "
                          "(bundled model, processes, servers, Flower, kills, browser); all: "
                          "both. Naming tests by id (file::test) runs them whatever their "
                          "tier.")


def _chosen_tier(config) -> str:
    tier = config.getoption("--tier")
    if tier:
        return tier
    if any("::" in a for a in config.args):  # tests named by id run whatever their tier
        return "all"
    return "fast"


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Workers (pytest-xdist's -n from addopts) only for the fast tier as a whole: the full
    tier's bundled models, servers and deployments want the memory and cores to
    themselves (measured on 2 cores: two workers took the same 43 min as one and pushed
    the timing-bound tests past their limits), and a test named by id needs no second
    process."""
    if getattr(config.option, "numprocesses", None) and _chosen_tier(config) != "fast":
        config.option.numprocesses = 0
        config.option.dist = "no"


def pytest_report_header(config):
    tier = _chosen_tier(config)
    other = {"fast": " (the full tier: --tier full)", "full": "", "all": ""}[tier]
    return f"workbench test tier: {tier}{other}"


def pytest_collection_modifyitems(config, items):
    tier = _chosen_tier(config)
    if tier == "all":
        return
    keep = [i for i in items if tier_of(i) == tier]
    drop = [i for i in items if tier_of(i) != tier]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


# Files that share the session's finished runs (compare_run, federated_run, knowledge_run) go
# to one worker together, so each run is built once instead of once per worker.
SHARED_RUNS = {"test_app.py", "test_compare.py", "test_federated.py",
               "test_federated_knowledge.py"}


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with one change: the SHARED_RUNS files are one unit of work. (xdist's
    own `xdist_group` marks do nothing under pytest 9: xdist 3.8 renames `item._nodeid`,
    which pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "shared-runs" if Path(file).name in SHARED_RUNS else file

    return ByFile(config, log)


# --- nothing written outside the temp folders --------------------------------------------------

def _repo_files() -> set[str]:
    """Every file git sees in the checkout, ignored ones included, less caches."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--ignored",
                              "--untracked-files=all"], cwd=REPO, capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return set()
    skip = ("__pycache__", ".pytest_cache", ".hypothesis", ".venv/", ".ruff_cache", ".mypy_cache",
            ".egg-info", ".cache/", ".grimp_cache/", ".import_linter_cache/",  # tool caches
            "test-artifacts/")  # the browser tests' screenshots, kept for people on purpose
    return {line[3:] for line in out.stdout.splitlines()
            if line[3:] and not any(k in line for k in skip)}


DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


def _devices() -> dict[str, tuple[int, int] | None]:
    """(mode, device number) of the device nodes a careless write would replace."""
    out: dict[str, tuple[int, int] | None] = {}
    for d in DEVICES:
        try:
            st = os.lstat(d)
            out[d] = (st.st_mode, st.st_rdev)
        except OSError:
            out[d] = None
    return out


def _temp_leftovers() -> set[str]:
    """Top-level entries of the temp folder a run may leave (pytest's own folder aside):
    sandbox folders, conversions, temp files of atomic writes."""
    import tempfile

    root = Path(tempfile.gettempdir())
    try:
        return {p.name for p in root.iterdir()
                if p.name.startswith(("wb-", "tmp", ".tmp")) and not p.name.startswith(
                    "pytest-of-")}
    except OSError:
        return set()


def pytest_sessionstart(session):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller (or the only process)
        session.config._wb_repo_files = _repo_files()
        session.config._wb_devices = _devices()
        session.config._wb_temp = _temp_leftovers()


def pytest_sessionfinish(session, exitstatus):
    """A test run leaves no new file in the checkout (tests write under tmp_path): a file
    that appears here was written outside what the test named."""
    before = getattr(session.config, "_wb_repo_files", None)
    if before is None or exitstatus not in (0, 1):
        return
    new = sorted(_repo_files() - before)
    changed = [d for d, v in _devices().items() if v != session.config._wb_devices.get(d)]
    sandboxes = sorted(n for n in _temp_leftovers() - session.config._wb_temp
                       if n.startswith("wb-sandbox-"))  # each run removes its own
    if new or changed or sandboxes:
        session.config._wb_stray = new + [f"{d} (device node changed)" for d in changed] + \
            [f"{n} (a sandbox folder left in the temp folder)" for n in sandboxes]
        # both tiers fail on it (the full tier was run whole with this check: it found a
        # test building an index in runs/, fixed); WB_STRAY_CHECK=report only reports
        if os.environ.get("WB_STRAY_CHECK") != "report":
            session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    stray = getattr(config, "_wb_stray", None)
    if stray:
        terminalreporter.write_line(
            f"the tests left {len(stray)} thing(s) behind (tests write under tmp_path and "
            f"touch no device): " + ", ".join(stray[:10]), red=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _current.update(tier=tier_of(item), test=item.nodeid)


def fast_tier_refuses(what: str, fixture: str) -> None:
    """Fail the running test if it is in the fast tier and does `what`."""
    if _current["tier"] == "fast":
        pytest.fail(f"{_current['test']} is a fast-tier test and {what}; ask for the "
                    f"`{fixture}` fixture (full tier: {FULL_TIER[fixture]}) or use a tiny or "
                    "scripted model / the in-process `cli` fixture", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _guard_bundled_model():
    """In the fast tier, converting or opening the bundled GGUF model fails the test."""
    from workbench.models import llamacpp, local

    real = local.convert_gguf
    real_file = llamacpp._gguf_file

    def guarded(source, *a, **kw):
        if source.kind == "bundled-gguf":
            fast_tier_refuses("loads the bundled chat model", "bundled_model")
        return real(source, *a, **kw)

    def guarded_file(source):
        if source.kind == "bundled-gguf":
            fast_tier_refuses("loads the bundled chat model into llama.cpp",
                              "bundled_llamacpp")
        return real_file(source)

    local.convert_gguf = guarded
    llamacpp._gguf_file = guarded_file
    yield
    local.convert_gguf = real
    llamacpp._gguf_file = real_file


def shared_build(tmp_path_factory, name: str, build) -> Path:
    """`build(folder)` once per test run instead of once per xdist worker: the workers of a
    run share the parent of their temp folders, so the first worker to ask builds there under
    a lock and the others wait for it and reuse the folder (which they must only read).
    Without workers, the session's own temp folder. Returns the folder."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out, done = root / f"shared-{name}", root / f"shared-{name}.done"
    with FileLock(str(root / f"shared-{name}.lock")):
        if not done.is_file():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            done.touch()
    return out


def require(ok: bool, why: str) -> None:
    """Skip the test when `ok` is false, except in CI (CI set), where it fails: nothing is
    skipped in CI."""
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {why}", pytrace=False)
        pytest.skip(why)


@pytest.fixture(scope="session")
def cli_process():
    """`run_cli`: the workbench CLI in a subprocess (full tier). Prefer the in-process `cli`
    fixture unless the test is about the process (exit by signal, stdout/stderr streams)."""
    return run_cli


@pytest.fixture(scope="session")
def server_process():
    """Declares that the test starts a server in another process (full tier)."""


@pytest.fixture(scope="session")
def flower_deployment():
    """Declares that the test starts a Flower SuperLink and SuperNodes (full tier)."""


@pytest.fixture(scope="session")
def kill_injection():
    """Declares that the test kills a process mid-work (full tier)."""


@pytest.fixture(scope="session")
def real_training():
    """Declares that the test trains or scores past a tiny model's few steps (full tier)."""


@pytest.fixture(scope="session")
def thorough_fuzz():
    """Declares a fuzz run of a thousand requests or more (full tier)."""


# --- the package as a user installs it ----------------------------------------------------------

def _build_wheel(dest: Path) -> Path:
    """A wheel of the checkout's tracked and new (not ignored) files, built from a copy so
    that no build/ or egg-info folder lands in the checkout (no build isolation: offline)."""
    src = dest / "src"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True, timeout=60).stdout
    for rel in filter(None, listed.split("\0")):
        if not (rel.startswith("workbench/") or rel in ("pyproject.toml", "README.md")):
            continue
        f = REPO / rel
        if f.is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, src / rel)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--no-index", "-q", "-w", str(dest / "dist"), str(src)],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (wheel,) = (dest / "dist").glob("domain_agent_workbench-*.whl")
    return wheel


def _venv_with(wheel: Path, venv: Path) -> Path:
    """A fresh venv holding the wheel; the project venv's site-packages folder is added
    after its own by a .pth line, which adds the folder only: the .pth files in it (the
    editable install's finder among them) are not run, so the checkout stays out of sight."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = venv / "bin" / "python"
    # installed before the dependencies are visible: pip sees no other workbench to replace
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(py), "-c", purelib], check=True, capture_output=True,
                               text=True, timeout=60).stdout.strip())
    paths = sysconfig.get_paths()  # this (the project's) environment
    deps = dict.fromkeys([paths["purelib"], paths["platlib"]])
    (site / "zz_project_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    return py


def _env(venv: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(PATH=str(venv / "bin") + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=str(venv),
               TQDM_DISABLE="1", PYTHONDONTWRITEBYTECODE="1")
    return env


@dataclass(frozen=True)
class Installed:
    """A wheel of the checkout installed (not editable) into a new venv: its folder, its
    python, and the environment to run it in (its bin first, no PYTHONPATH)."""
    venv: Path
    python: Path
    env: dict

    @property
    def workbench(self) -> Path:
        return self.venv / "bin" / "workbench"


@pytest.fixture(scope="session")
def installed_workbench(tmp_path_factory) -> Installed:
    """The workbench as `pip install .` leaves it (full tier), built once a session. Run it
    from a folder outside the checkout: a `python -m` child started in the checkout would
    import the checkout's copy first."""
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    py = _venv_with(_build_wheel(root / "wheel"), venv)
    return Installed(venv, py, _env(venv))


CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, which the test drives (full tier): its path."""
    require(Path(CHROMIUM).exists(), f"{CHROMIUM} (Debian's chromium) is not installed")
    return CHROMIUM


class CliResult:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr

    def __repr__(self) -> str:
        return f"CliResult({self.returncode}, stdout={self.stdout[-300:]!r}, " \
               f"stderr={self.stderr[-300:]!r})"


def cli_in_process(*args: str, env: dict | None = None, cwd: Path | None = None,
                   stdin: str = "") -> CliResult:
    """`workbench ARGS` through `workbench.cli.main.main(argv)` in this process: its exit
    code, stdout and stderr, as `run_cli` gives them for a subprocess. Environment, working
    folder, signal handlers and logging are put back afterwards."""
    import contextlib
    import io
    import logging
    import signal

    from workbench.cli.main import main

    old_env = dict(os.environ)
    old_cwd = os.getcwd()
    old_handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    old_log = (list(root.handlers), root.level)
    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    try:
        os.environ.update(env or {})
        os.chdir(cwd or REPO)
        sys.stdin = io.StringIO(stdin)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(args))
            except SystemExit as e:  # a command that exits by itself
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.stdin = old_stdin
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
        for s, h in old_handlers.items():
            signal.signal(s, h)
        root.handlers[:], root.level = old_log
    return CliResult(rc, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def cli():
    """The workbench CLI called in-process (fast tier): `cli("data", "validate", f)`."""
    return cli_in_process


@pytest.fixture(scope="session")
def bundled_model():
    """The real bundled SmolLM2 on transformers (converted once to safetensors, then cached
    on disk): the scoring engine, and the generation engine where llama.cpp is not."""
    from workbench.models import load_model

    return load_model("default", backend="transformers", batch_size=8)


@pytest.fixture(scope="session")
def bundled_llamacpp():
    """The real bundled SmolLM2 on llama.cpp, the default generation engine of a GGUF."""
    from workbench.models import load_model

    model = load_model("default", backend="llamacpp", batch_size=8)
    yield model
    model.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 120.0, proc: subprocess.Popen | None = None,
              headers: dict | None = None) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2, headers=headers).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(url)


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    fast_tier_refuses("starts the CLI as a subprocess", "cli_process")
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True,
                          text=True, env=e, cwd=cwd or REPO, timeout=timeout)


@pytest.fixture(scope="session")
def embedder():
    from workbench.models.embed import load_embedder

    return load_embedder("minilm", device="cpu")


@pytest.fixture(scope="session")
def rf_sections():
    from workbench.corpus import ingest

    return ingest(REPO / "datasets" / "rf").sections


@pytest.fixture(scope="session")
def rf_index(tmp_path_factory, rf_sections, embedder):
    from workbench.retrieval.index import RagConfig, RagIndex

    def build(folder: Path) -> None:
        RagIndex.build(rf_sections, folder / "rf",
                       config=RagConfig(chunk_size=96, chunk_overlap=16), embedder=embedder)

    return shared_build(tmp_path_factory, "idx", build) / "rf"  # built once, read by all


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from workbench.models.resolve import resolve_chat_model

    def bundled_tokenizer(folder: Path) -> None:
        # the bundled model's tokenizer and chat template, read from the GGUF's metadata (no
        # weights are loaded or converted): seconds, so once per run, then from its copy
        src = resolve_chat_model("default")
        AutoTokenizer.from_pretrained(src.path, gguf_file=src.gguf_file).save_pretrained(folder)

    tok = AutoTokenizer.from_pretrained(shared_build(tmp_path_factory, "tokenizer",
                                                     bundled_tokenizer))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=1024, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


@functools.cache
def _bundled_tokenizer_fields() -> tuple:
    """(name, value, type, item type) of the bundled GGUF's tokenizer.* fields, read once
    per process (opening the file and reading its 49k tokens takes seconds)."""
    import gguf

    from workbench.models.resolve import resolve_chat_model

    src = resolve_chat_model("default")
    reader = gguf.GGUFReader(str(src.path / src.gguf_file))
    fields = []
    for field in reader.fields.values():
        if field.name.startswith("tokenizer."):
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            fields.append((field.name, field.contents(), vtype, sub))
    return tuple(fields)


def write_tiny_gguf(folder: str | Path, out: Path) -> Path:
    """A GGUF file (f32) of a tiny llama-layout HF folder made by these tests: its weights in
    llama.cpp's names and layout, its hyper-parameters from its config, and the tokenizer
    and chat template from the bundled GGUF's metadata (which the tiny models share); no
    weights of the bundled model are read."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file
    from transformers import AutoConfig

    from workbench.train.gguf_export import gguf_tensors

    cfg = AutoConfig.from_pretrained(folder)
    state = load_file(str(Path(folder) / "model.safetensors"))
    tensors = gguf_tensors(state, n_blocks=cfg.num_hidden_layers,
                           n_head=cfg.num_attention_heads, n_head_kv=cfg.num_key_value_heads,
                           tied=cfg.tie_word_embeddings)
    w = gguf.GGUFWriter(str(out), "llama")
    for name, value, vtype, sub in _bundled_tokenizer_fields():
        w.add_key_value(name, value, vtype, sub_type=sub)
    w.add_string("general.name", "tiny-llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or
                               (cfg.rope_parameters or {}).get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for name, t in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory, tiny_model) -> Path:
    """`tiny_model` as a GGUF file: what the llama.cpp backend runs in the fast tier."""
    return write_tiny_gguf(tiny_model, tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf")


# --- trajectory synthesis: shared environments ----------------------------------------------

SHOP_SQL = """
    CREATE TABLE region (region_id INTEGER PRIMARY KEY, name TEXT);
    CREATE TABLE sale (sale_id INTEGER PRIMARY KEY, region_id INTEGER REFERENCES region,
                       item TEXT, amount REAL, day TEXT);
    INSERT INTO region VALUES (1, 'north'), (2, 'south'), (3, 'east');
    INSERT INTO sale VALUES
      (1, 1, 'pen', 2.5, '2021-01-03'), (2, 1, 'ink', 4.0, '2021-02-10'),
      (3, 2, 'pen', 2.5, '2022-01-05'), (4, 2, 'pad', 3.0, '2022-03-01'),
      (5, 3, 'cap', 9.0, '2022-03-09'), (6, 1, 'mug', 6.0, '2023-05-01'),
      (7, 2, 'mug', 6.0, '2023-06-01');
"""


def make_shop(path: Path, extra_sql: str = "") -> Path:
    """A tiny shop database (regions tie on counts, a value matches two rows) at `path`."""
    import sqlite3

    con = sqlite3.connect(path)
    con.executescript(SHOP_SQL + extra_sql)
    con.commit()
    con.close()
    return path


@pytest.fixture(scope="session")
def trajsynth_cache(tmp_path_factory) -> Path:
    """One profile cache for the trajectory-synthesis tests."""
    return tmp_path_factory.mktemp("trajsynth-cache")


@pytest.fixture(scope="session")
def chinook(trajsynth_cache):
    """The shipped Chinook environment (read-only; tests fork it, never step it)."""
    from workbench.dataenv.env import DataEnvironment, sample_environment

    return DataEnvironment.open(sample_environment("chinook"), cache_dir=trajsynth_cache)


def small_trajsynth_run(out: Path) -> Path:
    """A finished search over 6 Chinook tasks (uniform prior, 50 iterations) in `out`, as
    the Trajectories page reads it."""
    from workbench.trajsynth.api import explore_pool, open_env
    from workbench.datatasks.explore import ExploreConfig
    from workbench.datatasks.tasks import build_pool, save_pool

    env = open_env("chinook")
    pool = build_pool(env)
    save_pool(pool, out / "tasks.jsonl")
    explore_pool(env, pool.tasks[:6], out, ExploreConfig(prior="uniform", iterations=50),
                 log=lambda m: None)
    return out


# --- the tiny compare run, made once per test run ----------------------------------------------

TINY_COMPARE = """name: tiny
output_dir: {out}
models:
  chat: {{spec: {model}}}
corpus: {corpus}
distill:
  mode: single
  max_sections: 12
  kinds: [mc, nd]
  perspectives: [concepts, analysis]
  benchmark_fraction: 0.3
  verifier: {{method: generate}}
  models: {{writer: {teacher}, answerer: {teacher}, verifier: {teacher}}}
rag: {{chunk_size: 96, chunk_overlap: 16}}
train: {{max_steps: 3, batch_size: 2, max_length: 512, eval_fraction: 0.1,
        domain_eval: {{every: 3, max_items: 5}}}}
eval: {{methods: [loglik, generate], max_tokens: 8}}
compare: {{eval_items: 8}}
"""


class CompareRun:
    def __init__(self, workspace: Path, config: Path, result: "CliResult"):
        self.workspace, self.config, self.result = workspace, config, result
        self.run = workspace / "runs" / "tiny"


@pytest.fixture(scope="session")
def compare_run(tmp_path_factory, tiny_model) -> CompareRun:
    """The main job (`workbench compare run`, in-process) on a tiny configuration, made once
    and shared: a scripted teacher distils, the tiny random-init Llama is the student. Its
    run folder sits in a workspace's runs/, as the app finds runs made outside it."""
    from workbench.workspace import open_workspace

    ws = open_workspace(tmp_path_factory.mktemp("compare") / "ws")
    conf = ws.parent / "tiny.yaml"
    conf.write_text(TINY_COMPARE.format(
        out=ws / "runs", model=tiny_model, corpus=REPO / "datasets" / "rf",
        teacher='{spec: fake, options: {script: "fake_teacher:reply"}}'))
    result = cli_in_process("compare", "run", str(conf), env={"TQDM_DISABLE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return CompareRun(Path(ws), conf, result)


# --- federated runs, made once per test run ----------------------------------------------------

class FedRun:
    def __init__(self, workspace: Path, cfg, report_dir: Path):
        self.workspace, self.cfg, self.report_dir = workspace, cfg, report_dir


def _fed_run(tmp_path_factory, name: str, settings: list[str]) -> FedRun:
    from workbench.config import load_config
    from workbench.runs import RunContext, RunLayout, run_pipeline
    from workbench.workspace import open_workspace

    ws = Path(open_workspace(tmp_path_factory.mktemp(name) / "ws"))
    cfg = load_config(None, [*settings, f"output_dir={ws / 'runs'}", f"name={name}"])
    res = run_pipeline("fed", cfg, RunContext(layout=RunLayout.of(cfg), log=lambda m: None))
    return FedRun(ws, cfg, Path(res.outputs["report"]).parent)


def half_of(source: Path, out: Path) -> Path:
    """Every other row of a distilled sample's QTSA rows and benchmark items, in `out`."""
    out.mkdir(parents=True)
    for name in ("mcQTSA.jsonl", "ndQTSA.jsonl", "benchmark.jsonl"):
        rows = (source / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (out / name).write_text("".join(rows[::2]), encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def federated_run(tmp_path_factory, tiny_model) -> FedRun:
    """A finished federated LoRA experiment (2 rounds, 3 sites of half the shipped distilled
    RF rows, the tiny model, batches of one row), in a workspace's runs/: the federated
    tests and the app share it."""
    half = half_of(REPO / "datasets" / "rf_distilled", tmp_path_factory.mktemp("fed-rows") / "rf")
    return _fed_run(tmp_path_factory, "fedrun", [
        f"federated.model={tiny_model}", "federated.rounds=2", "federated.local.steps=1",
        "federated.local.batch_size=1", "federated.local.lora.r=4",
        "federated.local.lora.alpha=8", "federated.guards.min_nodes=3",
        f"federated.split.source={half}"])


@pytest.fixture(scope="session")
def knowledge_run(tmp_path_factory) -> FedRun:
    """A finished knowledge-track run (3 rounds, 4 sites with search agents, 4 tasks in
    each slice of a site), shared."""
    return _fed_run(tmp_path_factory, "krun", [
        "federated.track=knowledge", "federated.rounds=3", "federated.model=",
        "federated.guards.min_nodes=4", "federated.knowledge.learn_iterations=12",
        "federated.knowledge.slice=4"])


def tiny_litsearch_data(folder: Path, parts: tuple[str, ...] = ("dev", "train")) -> Path:
    """A four-paper literature-search library with one intent per entry of `parts`."""
    import json

    folder.mkdir(parents=True)
    papers = [{"pmid": str(i), "title": t, "year": 1977, "journal": "J", "mesh": m,
               "major": m[:1], "refs": r} for i, t, m, r in [
        (1, "glutamine light chains", ["Glutamine"], ["2"]),
        (2, "light chain sequences", ["Immunoglobulin"], []),
        (3, "glutamine pyrrolidone acid", ["Glutamine"], ["1"]),
        (4, "heart rate in rats", ["Heart"], [])]]
    (folder / "papers.jsonl").write_text("".join(json.dumps(p) + "\n" for p in papers))
    intents = [{"id": f"ls-{k}", "anchor": "1", "query": "glutamine light chains",
                "relevance": {"2": 3, "3": 3, "4": 0}, "part": part}
               for k, part in enumerate(parts)]
    (folder / "anchors.jsonl").write_text("".join(json.dumps(i) + "\n" for i in intents))
    return folder
