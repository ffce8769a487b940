import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def bundled_model():
    """The real bundled SmolLM2 (converted once to safetensors, then cached on disk)."""
    from workbench.models import load_model

    return load_model("default", batch_size=8)


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
    from workbench.rag.index import RagConfig, RagIndex

    out = tmp_path_factory.mktemp("idx") / "rf"
    RagIndex.build(rf_sections, out, config=RagConfig(chunk_size=96, chunk_overlap=16),
                   embedder=embedder)
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from workbench.models.local import model_folder
    from workbench.models.resolve import resolve_chat_model

    tok = AutoTokenizer.from_pretrained(model_folder(resolve_chat_model("default")))
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
    from workbench.trajsynth.env import DataEnvironment, sample_environment

    return DataEnvironment.open(sample_environment("chinook"), cache_dir=trajsynth_cache)


def small_trajsynth_run(out: Path) -> Path:
    """A finished search over 6 Chinook tasks (uniform prior, 50 iterations) in `out`, as
    the Trajectories page reads it."""
    from workbench.trajsynth.api import explore_pool, open_env
    from workbench.trajsynth.explore import ExploreConfig
    from workbench.trajsynth.tasks import build_pool, save_pool

    env = open_env("chinook")
    pool = build_pool(env)
    save_pool(pool, out / "tasks.jsonl")
    explore_pool(env, pool.tasks[:6], out, ExploreConfig(prior="uniform", iterations=50),
                 log=lambda m: None)
    return out
