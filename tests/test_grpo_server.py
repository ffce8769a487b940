"""GRPO with its rollouts on an OpenAI-compatible server (`train.grpo.rollout_server`), with
`workbench serve --lora-dir` standing in for vLLM, on 127.0.0.1 over the tiny random Llama:
after each update the trainer publishes its adapter, the server loads it (vLLM's runtime
LoRA API), and the next rollouts are the adapter's (the server's log-probs and greedy
replies under its name are the trainer's own). Then the two LoRA routes' refusals: names,
paths outside the allowed folder (links included), pickles, shapes that do not fit, the API
key, and an engine without runtime adapters: each a 4xx with one line."""

import contextlib
import json
import os
import threading
import warnings

import httpx
import pytest
from conftest import free_port, wait_http
from test_train_grpo import config, free_setup, guided_setup, prefers_yes, tasks, text_parity

from workbench.models import load_model
from workbench.models.base import GenerationParams
from workbench.serve import ServerLimits, create_app, make_server
from workbench.train import grpo_session as G

KEY = "grpo-test-key"


@contextlib.contextmanager
def serving(model, name: str, limits: ServerLimits):
    port = free_port()
    server = make_server(create_app(model, name, limits), port=port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60,
                  headers={"Authorization": f"Bearer {limits.api_key}"} if limits.api_key
                  else None)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def lora_server(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    model = load_model(tiny_model, device="cpu")
    with serving(model, "tiny", ServerLimits(api_key=KEY, lora_dir=str(root),
                                             max_loras=3)) as base:
        yield base, root


def post(base: str, path: str, body: dict, key: str | None = KEY) -> httpx.Response:
    return httpx.post(base + path, json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}"} if key else {})


def listed(base: str) -> dict[str, dict]:
    r = httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    return {m["id"]: m for m in r.json()["data"]}


def test_the_published_adapter_is_loaded_and_the_next_rollouts_use_it(
        lora_server, tiny_model, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.errors import WorkbenchError
    from workbench.io import sha256_file
    from workbench.models.local import LocalChatModel

    base, root = lora_server
    monkeypatch.setenv("WB_GRPO_TEST_KEY", KEY)
    cfg = config(max_steps=2, grpo={"rollout_server": {
        "url": base + "/v1", "model": "tiny", "api_key_env": "WB_GRPO_TEST_KEY",
        "lora_name": "policy", "publish_dir": str(root / "run")}})
    s = G.setup(cfg, model=AutoModelForCausalLM.from_pretrained(tiny_model),
                tokenizer=AutoTokenizer.from_pretrained(tiny_model), tasks=tasks(4),
                agent_setup=free_setup, reward=text_parity, seed=3)
    rows = G.train_steps(s, 1)
    # step 1's rollouts came from the server, under the starting adapter's name; a group's
    # samples differ (each request's seed is its own)
    assert [p["step"] for p in s.server.published] == [0]
    first = s.server.name
    assert first.startswith("policy-s000000-") and rows[0]["grad_norm"] > 0
    groups, _, _ = G.step_rollouts(s, 0)
    assert len({m.content for r in groups[0] for m in r.trajectory.messages
                if m.role == "assistant"}) > 1

    # the update changed the adapter: the next rollout publishes it, and unloads the first
    server_model = G.policy_model(s, 1)
    second = s.server.name
    assert second != first and second.startswith("policy-s000001-")
    folder = root / "run" / second
    models = listed(base)
    assert first not in models and not (root / "run" / first).exists()
    assert models[second]["parent"] == "tiny" and models[second]["root"] == str(folder)
    assert models[second]["sha256"] == sha256_file(folder / "adapter_model.safetensors")
    assert sorted(p.name for p in (root / "run").iterdir()) == \
        sorted([second, "workbench-published.json"])  # written whole: no temporary left

    # the server under that name is the trainer's adapter: its log-probs and greedy reply
    text = "The engine warms up slowly. Is the answer yes?"
    here = LocalChatModel.wrap(s.model.get_base_model(), s.tokenizer, device="cpu")
    s.model.eval()
    mine = here.token_logprobs(text).logprobs
    served = server_model.token_logprobs(text).logprobs
    assert server_model.model_name == second
    assert served[1:] == pytest.approx(mine[1:], abs=2e-4)
    server_model.model_name = "tiny"  # the base, for contrast
    plain = server_model.token_logprobs(text).logprobs
    server_model.model_name = second
    assert max(abs(a - b) for a, b in zip(plain[1:], mine[1:], strict=True)) > 1e-3
    conv = [{"role": "user", "content": "Name a colour."}]
    greedy = GenerationParams(max_tokens=8, temperature=0.0)
    assert server_model.generate([conv], greedy)[0].text == \
        here.generate([conv], greedy)[0].text

    # step 2 runs on it. Rollouts the server fails to make (its adapter gone) are refused,
    # not trained on; publishing again loads it again; the recipe's close unloads it
    G.train_steps(s, 1)
    assert [p["step"] for p in s.server.published] == [0, 1]
    G.policy_model(s, 1)  # step 2's update published
    last = s.server.name
    assert post(base, "/v1/unload_lora_adapter", {"lora_name": last}).status_code == 200
    with pytest.raises(WorkbenchError, match="failed on the server.*not served here"):
        G.rollout(s, tasks(1), group_size=2, sampling=G.Sampling(1.0, 0, 4), desc="again")
    s.server.digest = None
    G.policy_model(s, 1)
    assert s.server.name in listed(base)
    s.server.close()
    assert s.server.name is None and not {n for n in listed(base) if n.startswith("policy")}


def test_the_server_template_is_checked_before_the_first_rollout(lora_server, tiny_model):
    """A trainer whose tokenizer renders another chat template than the server's is
    refused before any rollout: the loss would train other tokens than were sampled."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.errors import WorkbenchError

    base, root = lora_server
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n" \
                        "{% endfor %}[assistant] "
    cfg = config(max_steps=1, grpo={"rollout_server": {
        "url": base + "/v1", "model": "tiny", "api_key_env": "WB_GRPO_TEST_KEY",
        "publish_dir": str(root / "run-template")}})
    os.environ["WB_GRPO_TEST_KEY"] = KEY
    try:
        s = G.setup(cfg, model=AutoModelForCausalLM.from_pretrained(tiny_model),
                    tokenizer=tok, tasks=tasks(2), agent_setup=free_setup,
                    reward=text_parity, seed=3)
        with pytest.raises(WorkbenchError, match="renders a chat prompt into other tokens"):
            G.train_steps(s, 1)
    finally:
        del os.environ["WB_GRPO_TEST_KEY"]


def _adapter(folder, tiny_model, *, r=4, targets=("q_proj", "v_proj")):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():  # PEFT reads an attribute transformers 5 deprecates
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing.*", FutureWarning)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model),
                               LoraConfig(r=r, lora_alpha=8, target_modules=list(targets),
                                          init_lora_weights=False))
    model.save_pretrained(folder)
    return folder


def test_the_lora_routes_refuse_bad_input_with_one_line(lora_server, tiny_model, tmp_path):
    base, root = lora_server
    good = _adapter(root / "good", tiny_model)
    outside = _adapter(tmp_path / "outside", tiny_model)
    (root / "escape").symlink_to(outside, target_is_directory=True)
    pickled = root / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text((good / "adapter_config.json").read_text())
    (pickled / "adapter_model.bin").write_bytes(b"not loaded")
    wide = root / "wide"  # a rank-4 adapter's config over rank-8 tensors: shapes do not fit
    _adapter(tmp_path / "r8", tiny_model, r=8)
    wide.mkdir()
    (wide / "adapter_config.json").write_text((good / "adapter_config.json").read_text())
    (wide / "adapter_model.safetensors").write_bytes(
        (tmp_path / "r8" / "adapter_model.safetensors").read_bytes())
    cases = [
        ({"lora_name": "../x", "lora_path": "good"}, 400, "lora_name"),
        ({"lora_name": "tiny", "lora_path": "good"}, 400, "base model's name"),
        ({"lora_name": "a", "lora_path": "../" + outside.parent.name}, 403, "outside"),
        ({"lora_name": "a", "lora_path": str(outside)}, 403, "outside"),
        ({"lora_name": "a", "lora_path": "escape"}, 403, "outside"),  # a link out
        ({"lora_name": "a", "lora_path": str(root)}, 403, "outside"),
        ({"lora_name": "a", "lora_path": "missing"}, 400, "no such folder"),
        ({"lora_name": "a", "lora_path": "pickled"}, 400, "pickle files are refused"),
        ({"lora_name": "a", "lora_path": "wide"}, 400, "does not fit the served model"),
        ({"lora_name": "a", "lora_path": "good", "load_inplace": True}, 400,
         "unsupported field"),
        ({"lora_name": "a"}, 400, "lora_path"),
    ]
    for body, status, words in cases:
        r = post(base, "/v1/load_lora_adapter", body)
        assert r.status_code == status, (body, r.text)
        message = r.json()["error"]["message"]
        assert words in message and "\n" not in message, (body, message)
    assert post(base, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "good"},
                key=None).status_code == 401
    assert post(base, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "good"},
                key="wrong").status_code == 401
    assert "a" not in listed(base)  # nothing above loaded anything

    # a good one loads; its name again is refused; after unloading, requests for it are 404s
    r = post(base, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "good"})
    assert r.status_code == 200 and r.json()["status"] == "loaded", r.text
    assert post(base, "/v1/load_lora_adapter",
                {"lora_name": "a", "lora_path": "good"}).status_code == 400
    ask = {"model": "a", "prompt": "Hello there", "max_tokens": 0, "echo": True,
           "logprobs": 1}
    assert post(base, "/v1/completions", ask).json()["model"] == "a"
    assert post(base, "/v1/unload_lora_adapter", {"lora_name": "a"}).status_code == 200
    r = post(base, "/v1/unload_lora_adapter", {"lora_name": "a"})
    assert r.status_code == 404 and "not loaded" in r.json()["error"]["message"]
    assert post(base, "/v1/completions", ask).status_code == 404


def test_an_engine_without_runtime_adapters_says_why(tmp_path):
    with serving(load_model("fake", responses=["ok"]), "fake",
                 ServerLimits(lora_dir=str(tmp_path))) as base:
        r = post(base, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "x"}, None)
        assert r.status_code == 400
        assert "need the transformers backend" in r.json()["error"]["message"]
    with serving(load_model("fake", responses=["ok"]), "fake", ServerLimits()) as base:
        r = post(base, "/v1/unload_lora_adapter", {"lora_name": "a"}, None)
        assert r.status_code == 400 and "--lora-dir" in r.json()["error"]["message"]


def test_rollout_server_settings_are_checked():
    from pydantic import ValidationError

    from workbench.train.config import TrainConfig

    ok = TrainConfig(method="grpo", grpo={"rollout_server": {"url": "http://h:8000/v1"}})
    assert ok.grpo.rollout_server is not None and ok.grpo.rollout_server.lora_name == "grpo"
    for bad in ({"url": "h:8000"}, {"url": "http://h/v1", "lora_name": "../x"},
                {"url": "http://h/v1", "extra": 1}):
        with pytest.raises(ValidationError):
            TrainConfig(method="grpo", grpo={"rollout_server": bad})
    assert json.loads(ok.model_dump_json())["grpo"]["rollout_server"]["model"] is None


def test_the_recipe_publishes_beside_its_checkpoints_resumes_and_unloads(
        lora_server, tiny_model, monkeypatch):
    """The recipe over the server with a guided policy (the candidates scored by the server
    under the adapter's name): adapters go to `published/` in the checkpoints, a SIGTERM
    unloads the last one, the resumed run loads its own and finishes, and nothing is left
    on the server or on disk but the adapter and its rollouts."""
    import signal

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.train.grpo_recipe import train_grpo

    base, root = lora_server
    monkeypatch.setenv("WB_GRPO_TEST_KEY", KEY)
    out = root / "recipe" / "adapter"  # the server reads adapters under root
    cfg = config(max_steps=2, grpo={"rollout_server": {
        "url": base + "/v1", "model": "tiny", "api_key_env": "WB_GRPO_TEST_KEY"}})
    logs: list[str] = []

    def run(on_step=None):
        return train_grpo(cfg, model=AutoModelForCausalLM.from_pretrained(tiny_model),
                          tokenizer=AutoTokenizer.from_pretrained(tiny_model),
                          tasks=tasks(4), agent_setup=guided_setup, reward=prefers_yes,
                          output=out, on_step=on_step, log=logs.append)

    def term(step, row):
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit):
        run(term)
    published = root / "recipe" / ".adapter.checkpoints" / "published"
    assert [p.name[:13] for p in published.iterdir() if p.is_dir()] == ["grpo-s000000-"]
    assert not {n for n in listed(base) if n.startswith("grpo")}  # unloaded on the way out
    res = run()
    assert any("resuming from checkpoint-1" in x for x in logs) and res.steps == 2
    assert (out / "adapter_model.safetensors").is_file()
    assert not (root / "recipe" / ".adapter.checkpoints").exists()
    assert not {n for n in listed(base) if n.startswith("grpo")}


def test_base_and_adapter_requests_at_once_each_get_their_own_model(lora_server, tiny_model):
    """Requests for the base and for an adapter, in flight together (scoring, and greedy
    chat, which the server batches per model), each answer as they do alone."""
    from concurrent.futures import ThreadPoolExecutor

    base, root = lora_server
    _adapter(root / "together", tiny_model)
    assert post(base, "/v1/load_lora_adapter",
                {"lora_name": "together", "lora_path": "together"}).status_code == 200
    try:
        def score(name):
            return post(base, "/v1/completions", {
                "model": name, "prompt": "The pump runs at 40 kW.", "max_tokens": 0,
                "echo": True, "logprobs": 1}).json()["choices"][0]["logprobs"][
                    "token_logprobs"][1:]

        def chat(name):
            return post(base, "/v1/chat/completions", {
                "model": name, "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 6, "temperature": 0}).json()["choices"][0]["message"]["content"]

        alone = {(f.__name__, n): f(n) for f in (score, chat) for n in ("tiny", "together")}
        assert alone["score", "tiny"] != alone["score", "together"]
        jobs = [(f, n) for _ in range(4) for f in (score, chat) for n in ("tiny", "together")]
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda fn: fn[0](fn[1]), jobs))
        for (f, n), value in zip(jobs, got, strict=True):
            if f is score:
                assert value == pytest.approx(alone["score", n], abs=1e-4), n
            else:
                assert value == alone["chat", n], n
    finally:
        post(base, "/v1/unload_lora_adapter", {"lora_name": "together"})
