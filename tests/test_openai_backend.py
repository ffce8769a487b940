"""The `openai` backend against real servers on loopback: `workbench serve` with the bundled
model (a real process), and a small flaky HTTP server for retry semantics."""

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import REPO, free_port, wait_http
from workbench.errors import BackendError
from workbench.models import GenerationParams, ScoreRequest, load_model


@pytest.fixture(scope="module")
def server(server_process):
    port = free_port()
    env = dict(os.environ, OPENAI_API_KEY="sk-test-SECRET-123")
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "serve", "--port", str(port)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=180, proc=proc)
        yield f"http://127.0.0.1:{port}/v1", proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_round_trip_against_workbench_serve(server, bundled_model, bundled_llamacpp,
                                            monkeypatch):
    url, proc = server
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET-123")
    remote = load_model(url, concurrency=3)
    assert remote.model_name == "smollm2-135m-instruct"
    assert "SECRET" not in repr(remote) and "SECRET" not in remote.identity
    convs = [[{"role": "user", "content": "What is the capital of France?"}],
             [{"role": "user", "content": "Say hello."}]]
    p = GenerationParams(max_tokens=12)
    got = remote.generate(convs, p)
    # the server generates on the engine a GGUF gets by default (llama.cpp) and scores on
    # transformers: each is compared with the same engine in this process
    want = bundled_llamacpp.generate(convs, p)
    assert [g.text for g in got] == [g.text for g in want]
    assert got[0].completion_tokens > 0 and got[0].prompt_tokens > 0
    streamed = "".join(remote.stream(convs[0], p))
    assert streamed.strip() == want[0].text.strip()
    # log-likelihood scoring over HTTP equals local scoring
    req = [ScoreRequest("The capital of France is", [" Paris", " London"])]
    remote_scores = remote.score(req)[0]
    local_scores = bundled_model.score(req)[0]
    for r, lo in zip(remote_scores, local_scores):
        assert abs(r.logprob - lo.logprob) < 1e-4 and r.n_tokens == lo.n_tokens


def test_server_rejects_unknown_model_and_bad_request(server):
    import httpx

    url, _ = server
    r = httpx.post(f"{url}/chat/completions", json={"model": "nope", "messages": [
        {"role": "user", "content": "x"}]}, timeout=30)
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/chat/completions", json={"messages": []}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(f"{url}/chat/completions", json={"messages": [
        {"role": "user", "content": "x"}], "presence_penalty": 1}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "presence_penalty"
    assert httpx.get(f"{url}/models", timeout=5).json()["data"][0]["id"] == \
        "smollm2-135m-instruct"


class Flaky(BaseHTTPRequestHandler):
    plan: list[int] = []  # status codes to answer, in order; then 200
    seen: list[dict] = []
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"data": [{"id": "flaky"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with Flaky.lock:
            Flaky.seen.append({"auth": self.headers.get("Authorization"), **body})
            code = Flaky.plan.pop(0) if Flaky.plan else 200
        if code != 200:
            return self._send(code, {"error": {"message": f"status {code}"}})
        if self.path.endswith("/completions") and "messages" not in body:
            return self._send(200, {"choices": [{}]})  # no logprobs offered
        self._send(200, {"choices": [{"message": {"content": "ok " + body["messages"][-1]
                                                  ["content"]}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 2}})


@pytest.fixture()
def flaky():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    Flaky.plan, Flaky.seen = [], []
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


def test_retries_with_exponential_backoff(flaky, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-abc")
    Flaky.plan = [429, 503, 500]
    m = load_model(flaky + "#flaky", backoff_s=0.05, max_retries=5, api_key_env="MY_KEY",
                   concurrency=1)
    g = m.generate([[{"role": "user", "content": "hi"}]])[0]
    assert g.ok and g.text == "ok hi"
    assert len(m.sleeps) == 3
    assert m.sleeps[1] > 1.8 * m.sleeps[0] * 0.9 and m.sleeps[2] > 1.8 * m.sleeps[1] * 0.9
    assert Flaky.seen[-1]["auth"] == "Bearer sk-abc"


def test_permanent_failure_is_an_error_generation_and_4xx_not_retried(flaky):
    Flaky.plan = [503] * 10
    m = load_model(flaky + "#flaky", backoff_s=0.01, max_retries=2)
    g = m.generate([[{"role": "user", "content": "hi"}]])[0]
    assert not g.ok and "gave up after 2 retries" in g.error
    Flaky.plan, Flaky.seen = [400], []
    g = m.generate([[{"role": "user", "content": "hi"}]])[0]
    assert not g.ok and "HTTP 400" in g.error and len(Flaky.seen) == 1


def test_twenty_percent_transient_errors_all_succeed(flaky):
    Flaky.plan = [429 if i % 5 == 0 else 200 for i in range(50)]
    m = load_model(flaky + "#flaky", backoff_s=0.01, concurrency=4)
    convs = [[{"role": "user", "content": f"q{i}"}] for i in range(40)]
    gens = m.generate(convs)
    assert all(g.ok for g in gens) and [g.text for g in gens] == [f"ok q{i}" for i in range(40)]


def test_scoring_without_logprobs_is_a_clear_error(flaky):
    m = load_model(flaky + "#flaky")
    with pytest.raises(BackendError, match="does not return prompt logprobs"):
        m.score([ScoreRequest("a", ["b"])])


def test_unreachable_server_is_one_line():
    port = free_port()
    with pytest.raises(BackendError, match="cannot reach"):
        load_model(f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_s=0.01)
