import json
import subprocess
import sys

from conftest import REPO

COMMANDS = [[], ["smoke"], ["serve"], ["models"], ["models", "list"], ["models", "resolve"],
            ["data"], ["data", "validate"], ["data", "convert"], ["rag"], ["train"],
            ["distill"], ["compare"], ["jobs"], ["eval"], ["agent"], ["fed"], ["trajsynth"],
            ["loop"], ["config"]]
# what --help must never import: each costs seconds at start-up (torch alone ~2 s here)
HEAVY = ("torch", "transformers", "peft", "flwr", "httpx", "numpy", "pandas", "scipy",
         "sklearn", "faiss", "streamlit", "sentence_transformers", "llama_index", "pyarrow",
         "onnxruntime", "fastapi", "uvicorn", "matplotlib")


def test_help_imports_nothing_heavy_and_explains_every_command():
    """`--help` of every command group in one fresh interpreter: each prints its usage and
    exits 0, and none imports a heavy library (the cost that made help slow). The command
    that first pulls one in is named."""
    code = f"""
import io, sys, contextlib
from workbench.cli.main import main
for cmd in {COMMANDS!r}:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(cmd + ["--help"])
    heavy = [m for m in {HEAVY!r} if m in sys.modules]
    print(" ".join(cmd) or "workbench", rc, "Usage" in out.getvalue(),
          len(out.getvalue()), ",".join(heavy) or "-")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.rsplit(" ", 4) for line in out.stdout.strip().splitlines()]
    assert len(rows) == len(COMMANDS), out.stdout
    for name, rc, usage, size, heavy in rows:
        assert rc == "0" and usage == "True", (name, rc, usage)
        assert int(size) > 200, (name, size)  # it explains, not just a usage line
        assert heavy == "-", f"`{name} --help` imported {heavy}"


def test_validate_reports_lines_and_exits_3(tmp_path, cli):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "q"},
                                          {"role": "assistant", "content": "a"}]}) + "\n"
                 + "{oops\n"
                 + json.dumps({"conversations": [{"from": "human", "value": "q"}]}) + "\n")
    r = cli("data", "validate", str(f))
    assert r.returncode == 3
    assert f"{f}:2:" in r.stderr and "bad_json" in r.stderr
    assert f"{f}:3:" in r.stderr and "no_assistant" in r.stderr
    assert "Traceback" not in r.stderr
    assert "1 valid, 2 invalid" in r.stdout


def test_convert_between_formats(tmp_path, cli):
    src = tmp_path / "a.jsonl"
    src.write_text(json.dumps({"instruction": "Define VSWR.", "input": "", "output": "A ratio.",
                               "system": "Be brief."}) + "\n")
    r = cli("data", "convert", str(src), str(tmp_path / "s.jsonl"), "--to", "sharegpt")
    assert r.returncode == 0, r.stderr
    row = json.loads((tmp_path / "s.jsonl").read_text())
    assert row == {"system": "Be brief.", "conversations": [
        {"from": "human", "value": "Define VSWR."}, {"from": "gpt", "value": "A ratio."}]}
    r = cli("data", "convert", str(tmp_path / "s.jsonl"), str(tmp_path / "b.jsonl"),
                "--to", "alpaca")
    assert json.loads((tmp_path / "b.jsonl").read_text()) == json.loads(src.read_text())


def test_user_errors_are_one_line_without_traceback(tmp_path, cli):
    r = cli("data", "convert", str(tmp_path / "missing.jsonl"), str(tmp_path / "o.jsonl"))
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "not found" in r.stderr
    r = cli("models", "resolve", "no/such-model")
    assert r.returncode == 1 and r.stderr.startswith("error: model 'no/such-model' not found")
    bad = tmp_path / "c.yaml"
    bad.write_text("seed: x\nbogus: 1\n")
    r = cli("smoke", str(bad))
    assert r.returncode == 2 and "2 problems" in r.stderr and "bogus: unknown key" in r.stderr
    assert "Traceback" not in r.stderr
    r = cli("data", "validate")
    assert r.returncode == 2 and "Missing argument" in r.stderr


def test_models_list_shows_bundled_defaults(cli):
    r = cli("models", "list")
    assert r.returncode == 0
    assert "smollm2-135m-instruct" in r.stdout and "minilm" in r.stdout
    assert "missing" not in r.stdout
    # the bundled GGUF generates on llama.cpp; scoring stays on transformers
    assert "generate -> llamacpp, score -> transformers" in r.stdout
    r = cli("models", "list", "-s", "models.chat.backend=transformers")
    assert "generate -> transformers, score -> transformers" in r.stdout
    # per use: int8 CTranslate2 generates, scoring stays on transformers (parity not met)
    r = cli("models", "list", "-s", "models.chat.backend=ctranslate2")
    assert "generate -> ctranslate2, score -> transformers" in r.stdout, r.stdout + r.stderr
    r = cli("models", "list", "-s", "models.chat.backend=ctranslate2",
                "-s", "models.chat.options.quantization=float32")
    assert "generate -> ctranslate2, score -> ctranslate2" in r.stdout


def test_smoke_job_end_to_end(tmp_path, cli_process):
    r = cli_process("smoke", "configs/smoke.yaml", "-s", f"output_dir={tmp_path}", "--json",
                env={"TQDM_DISABLE": "1"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # the bundled Q4_1 file generates on llama.cpp from its f16 copy; scoring on transformers
    assert out["answer"] and out["model"] == "llamacpp:smollm2-135m-instruct@f16+score:transformers"
    assert {"load_chat_s", "generate_s"} <= set(out["timings"])
    assert "\r" not in r.stderr  # no progress-bar control characters in logs
