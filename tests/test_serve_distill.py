"""The default distillation config, whose verifier scores letters by log-likelihood of chat
prompts, run end to end against `workbench serve` (a real process on 127.0.0.1)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, free_port, wait_http



@pytest.fixture(scope="module")
def served(server_process):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "serve", "--port", str(port)],
                            cwd=REPO, env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=180, proc=proc)
        yield f"http://127.0.0.1:{port}/v1#smollm2-135m-instruct"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_default_distillation_config_against_workbench_serve(served, tmp_path, monkeypatch):
    from workbench.config import load_config
    from workbench.distill.api import distill_from_config, read_report

    monkeypatch.chdir(REPO)  # the default corpus is the relative datasets/rf
    # Defaults, except a tiny corpus and short answers to fit a CI budget, the run's seed, the
    # grammar the main job uses (distill.constrained=auto: through the server's
    # response_format/guided decoding) and no quality gates (tests/test_distill_gates.py
    # checks them): what is tested is the verifier's log-likelihood scoring over HTTP, so MC
    # items must reach it. In free text the 135M writer leaves the question mark off 11-13 of
    # 15 questions, and the gates removed every question the grammar got written (7-9 of 7-9
    # at seeds 4, 0, 5 on a loaded 2-core machine); which items reach the verifier moves with
    # the machine's arithmetic and load, so the test takes the first of a few seeds whose
    # items reach it.
    for seed in (4, 0, 5, 6, 7):
        cfg = load_config(None, [f"output_dir={tmp_path / str(seed)}", f"models.chat.spec={served}",
                                 f"seed={seed}", "distill.max_sections=2",
                                 "distill.answer_max_tokens=48", "distill.constrained=auto",
                                 "distill.gates.enabled=false"])
        assert cfg.distill.verifier.method == "loglik" and cfg.distill.verifier.enabled
        result = distill_from_config(cfg, progress=lambda msg: None)
        report = json.loads((Path(result.run_dir) / "report.json").read_text())
        if report["verifier"]["checked"] > 0:
            break
    markdown = read_report(result.run_dir)[1]
    assert set(report["models"].values()) == {f"openai:{served}"}
    verifier = report["verifier"]
    assert verifier["method"] == "loglik" and verifier["checked"] > 0, report
    # questions were written and reached the end, kept or not: which ones the 135M model's
    # verifier keeps moves with the engine (one CI run on llama.cpp kept none at seed 4)
    assert report["model_calls"]["made"] > 0 and report["stages"]["written"] > 0, report
    assert "verifier (loglik" in markdown
