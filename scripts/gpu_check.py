"""The GPU check: one command that proves the GPU paths of the training and evaluation core
on whatever CUDA machine is at hand, in under ten minutes, with no weights, hub or index.

    scripts/gpu_check.sh [--out gpu_check.json]      # on a CUDA machine
    scripts/gpu_check.sh --cpu-smoke                 # the same stages at toy sizes, on CPU
    scripts/gpu_check.sh --prepare                   # here, before a GPU shows up (see below)

Stages (each timed, each recorded as ok / failed / skipped with its figures):

- sft, dpo: LoRA training through the training library (`workbench.train.session`) on a
  random-initialised model built from a real architecture's config (TinyLlama-1.1B's shape
  on a GPU); bf16 on CUDA, fp32 on CPU; tokens/s, model FLOPs utilisation (MFU) against the
  device's measured bf16 matmul peak (and its datasheet peak where known), peak GPU memory.
- sft_resume, dpo_resume: a run stopped after step 3 and resumed from its checkpoint ends
  with the same adapter and losses as one uninterrupted run (deterministic kernels on).
- scoring_parity: the MC evaluator's log-likelihood choices, CUDA bf16 against CPU fp32, on
  a tiny model: the same choice on every item whose fp32 margin exceeds the largest
  log-likelihood difference between the two.
- torchrun: the README's distributed command, `torchrun --nproc_per_node N -m workbench
  train run CONFIG`, with N the GPUs present (2 CPU processes on gloo in the smoke run):
  exit code, adapter written.
- constrained: JSON-schema constrained generation (llguidance) on the device, every output
  valid; generation tokens/s at batch 1 and 32.
- size: what travels to the GPU machine (the tree, plus `build/gpu_vendor`) is at most
  64 MiB.

The GPU machine's image has PyTorch (CUDA), transformers, peft, accelerate, safetensors,
sentence-transformers and onnxruntime, and reaches no package index. What else the
workbench imports travels as wheels: `--prepare` (run here, where PyPI is reachable)
downloads them into `build/gpu_vendor/` for CPython 3.10-3.13 on x86_64 Linux; the check
unpacks the ones its interpreter can use into a temporary folder and puts it on `sys.path`
after the image's own packages (nothing is installed, nothing the image has is replaced).
The tokenizer is trained here on the bundled RF corpus, so no model file is needed.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENDOR = REPO / "build" / "gpu_vendor"
LIMIT_BYTES = 64 * 2**20
# what the workbench imports that the GPU machine's image may lack (PyPI names); the image
# has torch, transformers, peft, accelerate, safetensors, sentence-transformers, onnxruntime
# and their own requirements (numpy, tokenizers, huggingface-hub, pyyaml, jinja2, ...)
VENDORED = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection",
            "typing-extensions", "llguidance", "typer", "click", "rich", "markdown-it-py",
            "mdurl", "pygments", "shellingham", "jsonschema", "jsonschema-specifications",
            "referencing", "rpds-py", "attrs", "platformdirs", "filelock", "pyyaml"]
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
# dense bf16 tensor-core peaks from the datasheets (TFLOP/s), for the MFU beside the measured
DATASHEET_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0,
                    "A10": 125.0, "4090": 165.0}
SIZES = {
    # TinyLlama-1.1B's shape (22 layers, 2048 wide, grouped-query attention)
    "gpu": dict(hidden=2048, layers=22, heads=32, kv_heads=4, intermediate=5632, vocab=32000,
                seq=1024, batch=8, steps=10, warmup=2, resume_steps=6, gen_tokens=128,
                tokenizer_vocab=8000),
    "cpu-smoke": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=2048,
                      seq=128, batch=2, steps=3, warmup=1, resume_steps=6, gen_tokens=8,
                      tokenizer_vocab=2048),
}
TINY = SIZES["cpu-smoke"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# --- what travels -----------------------------------------------------------------------------

def prepare() -> int:
    """Download the vendored wheels for every supported CPython into build/gpu_vendor: the
    versions installed here where that CPython has them, else the newest set pip resolves for it
    within pyproject's bounds."""
    VENDOR.mkdir(parents=True, exist_ok=True)
    for py in PYTHONS:
        base = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
                "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                "--platform", "manylinux_2_28_x86_64",
                # llguidance ships manylinux_2_31 only: CUDA images are Ubuntu 22.04+ (2.35)
                "--platform", "manylinux_2_31_x86_64",
                "--python-version", py, "--implementation", "cp", "-d", str(VENDOR)]
        r = subprocess.run([*base, "--no-deps", *_pins()], capture_output=True, text=True)
        if r.returncode:  # an older CPython than the pins support: resolve for it
            r = subprocess.run([*base, *_bounds()], capture_output=True, text=True)
        if r.returncode:
            print(f"pip download for Python {py} failed:\n{r.stderr.strip()[-2000:]}")
            return 1
    size = sum(f.stat().st_size for f in VENDOR.iterdir())
    print(f"{len(list(VENDOR.iterdir()))} wheels, {size / 2**20:.1f} MiB in {VENDOR}")
    return 0


def _bounds() -> list[str]:
    """pyproject's requirements for the vendored packages it names (the others come as their
    dependencies)."""
    import re
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps
            if re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() in VENDORED]


def _pins() -> list[str]:
    """The vendored packages at the versions installed here (the ones the tests ran with)."""
    from importlib import metadata

    out = []
    for name in VENDORED:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def use_vendor() -> tuple[list[str], str | None]:
    """Unpack the vendored wheels this interpreter can use and that it does not already have
    into a temporary folder at the end of sys.path; the names of what was added, and the
    folder."""
    if not VENDOR.is_dir():
        return [], None
    from importlib import metadata

    from packaging.tags import sys_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename

    ours = set(sys_tags())
    target = Path(tempfile.mkdtemp(prefix="gpu_vendor."))
    atexit.register(shutil.rmtree, target, True)
    added = []
    for whl in sorted(VENDOR.glob("*.whl")):
        name, _, _, tags = parse_wheel_filename(whl.name)
        if not tags & ours or name in added:
            continue
        try:
            metadata.version(str(name))
            continue  # the image has it: keep the image's
        except metadata.PackageNotFoundError:
            pass
        with zipfile.ZipFile(whl) as z:
            z.extractall(target)
        added.append(canonicalize_name(name))
    sys.path.append(str(target))
    return [str(a) for a in added], str(target)


def travel_size() -> dict:
    """Bytes of what `run` carries: git's tracked and not-ignored files, plus the wheels."""
    try:
        names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                "--exclude-standard"], cwd=REPO, capture_output=True,
                               check=True).stdout.decode().split("\0")
        files = [REPO / n for n in names if n]
    except (OSError, subprocess.CalledProcessError):  # a copy without .git
        skip = {".git", ".venv", "runs", "build", "__pycache__", ".pytest_cache", "node_modules"}
        files = [p for p in REPO.rglob("*") if not skip & set(p.relative_to(REPO).parts)]
    tree = sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())
    wheels = sum(f.stat().st_size for f in VENDOR.glob("*.whl")) if VENDOR.is_dir() else 0
    return {"ok": tree + wheels <= LIMIT_BYTES, "tree_mib": round(tree / 2**20, 2),
            "wheels_mib": round(wheels / 2**20, 2), "limit_mib": LIMIT_BYTES // 2**20}


# --- the model, tokenizer and data ------------------------------------------------------------

def corpus_texts() -> list[str]:
    from workbench.corpus import load_sections

    sections, _ = load_sections(str(REPO / "datasets" / "rf"))
    return [s.text for s in sections if len(s.text) > 200]


def make_tokenizer(folder: Path, vocab: int):
    """A byte-level BPE trained on the bundled RF corpus, with ChatML's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus_texts(), trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=special, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>",
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    tok.save_pretrained(folder)
    return tok


def make_model(folder: Path, size: dict, tok, device: str, dtype) -> int:
    """A random-initialised Llama of `size`'s shape, saved to `folder`; its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=max(size["vocab"], len(tok)), hidden_size=size["hidden"],
                      intermediate_size=size["intermediate"],
                      num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
                      num_key_value_heads=size["kv_heads"], max_position_embeddings=4096,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    del model
    return n


def sft_examples(n: int = 64, chars: int = 3000):
    from workbench.records import ChatExample

    texts = corpus_texts()
    return [ChatExample.model_validate({"messages": [
        {"role": "user", "content": f"Explain part {i} of the RF notes."},
        {"role": "assistant", "content": texts[i % len(texts)][:chars]}]})
        for i in range(n)]


def preference_pairs(n: int = 64, chars: int = 1500):
    from workbench.records import PreferencePair

    texts = corpus_texts()
    return [PreferencePair.model_validate({
        "id": f"p{i}", "prompt": [{"role": "user", "content": f"Explain part {i}."}],
        "chosen": [{"role": "assistant", "content": texts[i % len(texts)][:chars]}],
        "rejected": [{"role": "assistant", "content": "I cannot explain that."}]})
        for i in range(n)]


# --- stages -----------------------------------------------------------------------------------

class Check:
    def __init__(self, mode: str, budget_s: float):
        import torch

        self.mode = mode
        self.size = SIZES[mode]
        self.deadline = time.monotonic() + budget_s
        self.cuda = mode == "gpu"
        self.device = "cuda" if self.cuda else "cpu"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.work = Path(tempfile.mkdtemp(prefix="gpu_check."))
        atexit.register(shutil.rmtree, self.work, True)
        self.stages: dict[str, dict] = {}
        self.n_params = 0
        self.peak_tflops: float | None = None

    def stage(self, name: str, fn, need_s: float) -> None:
        import torch

        left = self.deadline - time.monotonic()
        if left < need_s:
            self.stages[name] = {"status": "skipped",
                                 "why": f"{left:.0f} s left of the budget, needs ~{need_s:.0f}"}
            return
        print(f"[gpu_check] {name} ...", flush=True)
        t0 = time.perf_counter()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            row = fn()
            row.setdefault("status", "ok")
        except Exception as e:  # a failed stage is a finding; the others still run
            import traceback

            row = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:800],
                   "traceback": traceback.format_exc()[-3000:]}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        if self.cuda:
            row.setdefault("peak_gpu_gib", round(torch.cuda.max_memory_allocated() / 2**30, 2))
        self.stages[name] = row
        print(f"[gpu_check] {name}: {row['status']} in {row['seconds']} s", flush=True)

    # the device and its peak
    def device_info(self) -> dict:
        import torch

        info = {"torch": torch.__version__, "python": platform.python_version(),
                "device": "cpu", "count": 0}
        if self.cuda:
            p = torch.cuda.get_device_properties(0)
            info.update(device=p.name, count=torch.cuda.device_count(),
                        memory_gib=round(p.total_memory / 2**30, 1),
                        capability=f"{p.major}.{p.minor}",
                        bf16=torch.cuda.is_bf16_supported())
        n = 8192 if self.cuda else 512
        a = torch.randn(n, n, device=self.device, dtype=self.dtype)
        b = torch.randn(n, n, device=self.device, dtype=self.dtype)
        for _ in range(3):
            a @ b
        self._sync()
        reps = 20 if self.cuda else 5
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        self._sync()
        self.peak_tflops = 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12
        info["matmul_peak_tflops"] = round(self.peak_tflops, 2)
        info["datasheet_tflops"] = next((v for k, v in DATASHEET_TFLOPS.items()
                                         if k in info["device"]), None)
        return info

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def build(self) -> dict:
        self.tok = make_tokenizer(self.work / "tok", self.size["tokenizer_vocab"])
        self.big = self.work / "model"
        self.n_params = make_model(self.big, self.size, self.tok, self.device, self.dtype)
        self.tiny = self.work / "tiny"
        make_model(self.tiny, TINY, self.tok, "cpu", __import__("torch").float32)
        return {"params_m": round(self.n_params / 1e6, 1), "vocab": len(self.tok)}

    def _cfg(self, method: str, **kw):
        from workbench.train.config import TrainConfig

        s = self.size
        base = dict(method=method, max_length=s["seq"], batch_size=s["batch"], packing=True,
                    learning_rate=1e-4, warmup_ratio=0.0, scheduler="constant",
                    eval_fraction=0.0, max_steps=s["warmup"] + s["steps"],
                    lora={"r": 16, "alpha": 32, "dropout": 0.0}, device=self.device,
                    dtype="bfloat16" if self.cuda else "float32")
        base.update(kw)
        return TrainConfig(**base)

    def _session(self, method: str, **kw):
        from workbench.train.session import setup

        ck = kw.pop("checkpoint_dir", None)
        c = min(3000, self.size["seq"] * 3 // 2)  # characters that fit max_length
        data = {"pairs": preference_pairs(chars=c // 2)} if method == "dpo" \
            else {"examples": sft_examples(chars=c)}
        return setup(self._cfg(method, **kw), model_spec=str(self.big), seed=1,
                     checkpoint_dir=ck, **data)

    def throughput(self, method: str) -> dict:
        from workbench.train.session import train_steps

        s = self._session(method)
        train_steps(s, self.size["warmup"])
        self._sync()
        tok0, t0 = s.tokens_padded, time.perf_counter()
        train_steps(s, self.size["steps"])
        self._sync()
        dt = time.perf_counter() - t0
        tokens = s.tokens_padded - tok0
        tps = tokens / dt
        # LoRA: the forward pass (2N FLOPs a token) and the backward pass through the
        # activations (2N); no weight gradients for the frozen base; attention's
        # sequence-length term left out, so this MFU is a slight underestimate
        flops = 4 * self.n_params * tps
        row = {"tokens_per_s": round(tps, 1), "steps": self.size["steps"],
               "tokens": tokens, "loss_last": round(s.metrics[-1]["loss"], 4),
               "mfu_measured_peak": round(flops / (self.peak_tflops * 1e12), 4)}
        sheet = self.info.get("datasheet_tflops")
        if sheet:
            row["mfu_datasheet"] = round(flops / (sheet * 1e12), 4)
        if not all(_finite(m["loss"]) for m in s.metrics):
            row["status"] = "failed"
            row["error"] = "a loss is not finite"
        return row

    def resume(self, method: str) -> dict:
        import torch

        from workbench.errors import TrainingInterrupted
        from workbench.train.session import adapter_state, restore_checkpoint, train_steps

        n = self.size["resume_steps"]
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            whole = self._session(method, max_steps=n)
            train_steps(whole, n)
            a = adapter_state(whole)
            losses = [m["loss"] for m in whole.metrics]
            del whole
            ck = self.work / f"ck-{method}"
            first = self._session(method, max_steps=n, checkpoint_dir=ck)
            with contextlib.suppress(TrainingInterrupted):
                train_steps(first, n, should_stop=lambda: first.step == 3)
            again = self._session(method, max_steps=n, checkpoint_dir=ck)
            restored = restore_checkpoint(again)
            train_steps(again, n - again.step)
            b = adapter_state(again)
            diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
            loss_diff = max(abs(x - y) for x, y in zip(losses, [m["loss"] for m in
                                                                again.metrics], strict=True))
        finally:
            torch.use_deterministic_algorithms(False)
        ok = restored is not None and diff <= 1e-6 and loss_diff <= 1e-6
        return {"status": "ok" if ok else "failed", "resumed_at_step": 3,
                "max_adapter_diff": diff, "max_loss_diff": loss_diff,
                **({} if ok else {"error": "the resumed run differs from the whole run"})}

    def scoring_parity(self) -> dict:
        from workbench.evaluate.mc import evaluate_mc
        from workbench.models import load_model
        from workbench.records import MCItem, read_records

        items = read_records(REPO / "datasets" / "rf_distilled" / "benchmark.jsonl",
                             MCItem)[:24]
        ref = evaluate_mc(load_model(str(self.tiny), device="cpu", dtype="float32"), items,
                          methods=("loglik",))
        dev = evaluate_mc(load_model(str(self.tiny), device=self.device,
                                     dtype="bfloat16" if self.cuda else "float32"), items,
                          methods=("loglik",))
        worst, must, agree = 0.0, 0, 0
        for r, d in zip(ref, dev, strict=True):
            for f, lp in r.extra["logprobs"].items():
                worst = max(worst, max(abs(x - y) for x, y in zip(lp, d.extra["logprobs"][f],
                                                                  strict=True)))
        for r, d in zip(ref, dev, strict=True):
            for f, lp in r.extra["logprobs"].items():
                top = sorted(lp, reverse=True)
                if top[0] - top[1] > 2 * worst:  # a choice the precision cannot flip
                    must += 1
                    agree += r.extra["predictions"][f] == d.extra["predictions"][f]
        same = sum(r.extra["predictions"] == d.extra["predictions"]
                   for r, d in zip(ref, dev, strict=True))
        return {"status": "ok" if agree == must else "failed", "items": len(items),
                "same_choices": same, "clear_choices_agreeing": f"{agree}/{must}",
                "max_logprob_diff": round(worst, 5),
                "compared": f"{self.device} {'bf16' if self.cuda else 'fp32'} vs cpu fp32"}

    def torchrun(self) -> dict:
        import torch

        procs = torch.cuda.device_count() if self.cuda else 2
        data = self.work / "sft.jsonl"
        rows = sft_examples(32, chars=self.size["seq"] * 3 // 2)
        data.write_text("".join(json.dumps(e.to_json()) + "\n" for e in rows))
        out = self.work / "ddp-adapter"
        cfg = self.work / "ddp.yaml"
        cfg.write_text(json.dumps({
            "name": "gpu_check_ddp", "output_dir": str(self.work / "runs"),
            "models": {"chat": {"spec": str(self.big if self.cuda else self.tiny)}},
            "train": {"data": str(data), "output": str(out), "max_steps": 4,
                      "max_length": self.size["seq"], "batch_size": 2, "eval_fraction": 0.0,
                      "lora": {"r": 8, "alpha": 16, "dropout": 0.0}}}))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={procs}", "-m", "workbench", "train", "run", str(cfg)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=420,
                           cwd=self.work)
        ok = r.returncode == 0 and (out / "adapter_model.safetensors").is_file()
        row = {"status": "ok" if ok else "failed", "processes": procs,
               "backend": "nccl" if self.cuda else "gloo", "exit_code": r.returncode}
        if not ok:
            row["error"] = (r.stdout[-1500:] + "\n" + r.stderr[:2500])
        return row

    def constrained(self) -> dict:
        from workbench.models import load_model
        from workbench.models.base import GenerationParams
        from workbench.models.constrain import Constraint

        schema = {"type": "object", "additionalProperties": False,
                  "required": ["part", "gain_db"],
                  "properties": {"part": {"type": "string", "maxLength": 16},
                                 "gain_db": {"type": "integer", "minimum": 0,
                                             "maximum": 60}}}
        model = load_model(str(self.big), device=self.device,
                           dtype="bfloat16" if self.cuda else "float32", batch_size=32)
        ask = [{"role": "user", "content": "Name an amplifier and its gain as JSON."}]
        gens = model.generate([ask] * 8, GenerationParams(
            max_tokens=64, temperature=1.0, seed=3, constraint=Constraint.json_schema(schema)))
        valid = sum(_fits(g.text, schema) for g in gens)
        row = {"valid_json": f"{valid}/{len(gens)}"}
        for batch in (1, 32):
            p = GenerationParams(max_tokens=self.size["gen_tokens"], temperature=1.0, seed=1)
            model.generate([ask] * batch, p)  # warm
            self._sync()
            t0 = time.perf_counter()
            out = model.generate([ask] * batch, p)
            self._sync()
            row[f"gen_tokens_per_s_batch{batch}"] = round(
                sum(g.completion_tokens for g in out) / (time.perf_counter() - t0), 1)
        if valid < len(gens):
            row.update(status="failed", error="an output under the schema does not fit it")
        return row

    def run(self) -> dict:
        self.info = self.device_info()
        print(f"[gpu_check] {self.info['device']}: matmul peak "
              f"{self.info['matmul_peak_tflops']} TFLOP/s", flush=True)
        big = self.cuda
        self.stage("build", self.build, 20)
        if self.stages["build"]["status"] == "ok":
            self.stage("sft", lambda: self.throughput("sft"), 40 if big else 5)
            self.stage("sft_resume", lambda: self.resume("sft"), 60 if big else 5)
            self.stage("dpo", lambda: self.throughput("dpo"), 60 if big else 5)
            self.stage("dpo_resume", lambda: self.resume("dpo"), 90 if big else 5)
            self.stage("scoring_parity", self.scoring_parity, 20)
            self.stage("constrained", self.constrained, 40 if big else 10)
            self.stage("torchrun", self.torchrun, 120 if big else 60)
        return self.stages


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def _fits(text: str, schema: dict) -> bool:
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return (isinstance(obj, dict) and set(obj) == set(schema["required"])
            and isinstance(obj["part"], str) and len(obj["part"]) <= 16
            and isinstance(obj["gain_db"], int) and 0 <= obj["gain_db"] <= 60)


def table(result: dict) -> str:
    lines = [f"GPU check ({result['mode']}), {result['date']}, {result['device']['device']}"
             f" x{result['device']['count']}, torch {result['device']['torch']}, matmul peak "
             f"{result['device']['matmul_peak_tflops']} TFLOP/s", "",
             "| stage | status | s | figures |", "|---|---|---|---|"]
    for name, row in result["stages"].items():
        figs = ", ".join(f"{k} {v}" for k, v in row.items()
                         if k not in ("status", "seconds", "traceback", "error", "why"))
        why = row.get("error") or row.get("why") or ""
        lines.append(f"| {name} | {row['status']} | {row.get('seconds', '')} | "
                     f"{figs}{' - ' + why.splitlines()[-1][:200] if why else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="Every stage at toy sizes on "
                                                             "CPU (the full test tier runs "
                                                             "this).")
    ap.add_argument("--prepare", action="store_true", help="Download the vendored wheels into "
                                                           "build/gpu_vendor (needs PyPI).")
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"),
                    help="JSON result file (a new or regular file).")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="Stop starting stages when this little time is left (default 540).")
    args = ap.parse_args(argv)
    if args.prepare:
        return prepare()
    if args.out.exists() and (args.out.is_symlink() or not args.out.is_file()):
        print(f"--out {args.out}: exists and is not a regular file; name another")
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic resume check
    size = travel_size()
    added, vendor_dir = use_vendor()
    sys.path.insert(0, str(REPO))
    # torchrun's processes see the same packages (the image's first, then the vendored)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH"), vendor_dir) if p)
    import torch

    mode = "cpu-smoke" if args.cpu_smoke else "gpu"
    if mode == "gpu" and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu-smoke for the CPU check")
        return 2
    from workbench.progress import quiet_libraries

    quiet_libraries()
    check = Check(mode, args.budget_s)
    stages = {"size": size, **check.run()}
    size["status"] = "ok" if size.pop("ok") else "failed"
    result = {"mode": mode, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "device": check.info, "vendored": added, "params": check.n_params,
              "stages": stages}
    from workbench.io import atomic_write_json

    atomic_write_json(args.out, result)
    print(table(result))
    return 0 if all(r["status"] == "ok" for r in stages.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
