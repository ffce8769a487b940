"""Progress a person can see: the log lines of work in flight (unchanged) and the JSON snapshot
a background job keeps in its folder for the task centre."""

import itertools
import json
import re
import time

import pytest

from workbench import progress as P


@pytest.fixture(autouse=True)
def _no_file(monkeypatch):
    monkeypatch.delenv("WB_PROGRESS_FILE", raising=False)
    monkeypatch.setenv("WB_PROGRESS_FILE_SECONDS", "0.05")
    monkeypatch.setenv("TQDM_DISABLE", "1")  # bars off: pytest's stderr is no terminal anyway
    yield
    P.set_progress_file(None)


def _read(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _wait_for(check, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = check()
        if out:
            return out
        time.sleep(0.02)
    raise AssertionError("timed out")


LINE = re.compile(r"^\[progress\] outer > items: (\d+)/10 row \((\d+)%\), [0-9.e+-]+/s, "
                  r"\d+s, ETA \S+$")


def _ten_items_logged(monkeypatch, capsys) -> list[str]:
    """Ten items of 50 ms in a stage, reported every 0.1 s: the progress lines on stderr,
    each checked against LINE (there must be some)."""
    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.1")
    with P.stage("outer"):
        for _ in P.progress(range(10), desc="items", unit="row"):
            time.sleep(0.05)
    time.sleep(0.15)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[progress]")]
    assert lines and all(LINE.match(x) for x in lines), lines
    return lines


def test_log_lines_name_the_levels_and_the_counts(monkeypatch, capsys):
    """Without a terminal and without a progress file: one line per tick on stderr, as
    before the snapshot existed; no file is written anywhere."""
    lines = _ten_items_logged(monkeypatch, capsys)
    done = [int(LINE.match(x).group(1)) for x in lines]
    assert done == sorted(done) and 0 < done[-1] <= 10


def test_a_reporter_asleep_on_an_earlier_interval_wakes_for_new_work(monkeypatch, capsys):
    """Work that ends leaves the reporter asleep (up to 1 s at the default interval); work
    that starts before it wakes is reported at its own interval all the same (this was a
    flaky test when an earlier test's work had just ended)."""
    monkeypatch.delenv("WB_PROGRESS_SECONDS", raising=False)
    with P.stage("earlier"):
        for _ in P.progress(range(3), desc="x"):
            pass
    time.sleep(0.3)
    _ten_items_logged(monkeypatch, capsys)


def test_snapshot_of_a_real_loop(tmp_path, monkeypatch, capsys):
    """A progress file set: the ticker keeps the levels, done/total, rate, elapsed and ETA of
    the loop in flight in it (replaced whole, so every read parses), and says when no work
    is in flight any more."""
    from workbench.jobs import Job, job_progress

    monkeypatch.setenv("WB_PROGRESS_SECONDS", "100")  # no log line during this test
    folder = tmp_path / "jobs" / "j1"
    folder.mkdir(parents=True)
    f = folder / "progress.json"
    P.set_progress_file(f)
    job = Job(id="j1", kind="distill", workspace=str(tmp_path), config={})
    seen = []
    with P.stage("distill"):
        for i in P.progress(range(8), desc="model calls", unit="chunk"):
            time.sleep(0.12)
            if i == 5:
                snap = _wait_for(lambda: (s := job_progress(job)) and s.done and s.done >= 4
                                 and s)
                seen.append(snap)
    assert job.snapshot() is not None
    snap = seen[0]
    assert [(lv.desc, lv.total, lv.unit) for lv in snap.levels] == [
        ("distill", None, ""), ("model calls", 8, "chunk")]
    assert snap.total == 8 and 4 <= snap.done <= 6 and snap.unit == "chunk"
    assert snap.counted == 1 and snap.label == "distill > model calls"
    assert snap.rate > 0 and snap.eta is not None and snap.elapsed > 0
    assert abs(snap.updated_at - time.time()) < 30
    # the work ended: the file says nothing is in flight (no stale "5/8")
    idle = _wait_for(lambda: (s := job_progress(job)) is not None and not s.levels and s)
    assert idle.done is None and idle.total is None
    assert not [p for p in folder.iterdir() if p.name != "progress.json"]  # no temp left
    assert "[progress]" not in capsys.readouterr().err


def test_snapshot_is_kept_on_a_terminal_too(tmp_path, monkeypatch, capsys):
    """With bars on (a terminal), a set progress file is still written; the bars are drawn
    and no log line is printed. Without a file nothing is tracked, as before."""
    monkeypatch.setattr(P, "bars_enabled", lambda: True)
    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.05")
    for _ in P.progress(range(3), desc="quiet"):
        time.sleep(0.02)
    assert not P._ticker.stacks
    f = tmp_path / "p.json"
    monkeypatch.setenv("WB_PROGRESS_FILE", str(f))
    for i in P.progress(range(6), desc="bars", unit="batch"):
        time.sleep(0.1)
        if i == 3:
            snap = _wait_for(lambda: (s := _read(f)) and s["levels"] and s["done"] and s)
    assert snap["levels"][0]["desc"] == "bars" and snap["total"] == 6
    assert "[progress]" not in capsys.readouterr().err


def test_the_setter_wins_over_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("WB_PROGRESS_FILE", str(tmp_path / "env.json"))
    assert P.progress_file() == tmp_path / "env.json"
    P.set_progress_file(tmp_path / "set.json")
    assert P.progress_file() == tmp_path / "set.json"
    P.set_progress_file(None)
    monkeypatch.delenv("WB_PROGRESS_FILE")
    assert P.progress_file() is None and P.write_progress_file() is False


def test_snapshot_never_replaces_what_is_not_a_regular_file(tmp_path):
    import os

    target = tmp_path / "target.txt"
    target.write_text("keep")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    (tmp_path / "dir.json").mkdir()
    snap = P._ticker.snapshot()
    for p in (link, fifo, tmp_path / "dir.json"):
        assert P.write_snapshot(p, snap) is False
    assert link.is_symlink() and target.read_text() == "keep"
    assert fifo.is_fifo() and (tmp_path / "dir.json").is_dir()
    assert P.write_snapshot(tmp_path / "ok.json", snap) is True
    assert json.loads((tmp_path / "ok.json").read_text())["levels"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "fifo.json",
                                                          "link.json", "ok.json",
                                                          "target.txt"]


# --- figures that move (issue 46 item 2: "progress that says nothing") -----------------------

GEN_LINE = re.compile(r"^\[progress\] distill/distill > model calls > generating: "
                      r"(\d+)/3 reply \(\d+%\), (?:[0-9.e+-]+/s, )?(\d+) token "
                      r"\([0-9.e+-]+/s\), \d+s, ETA \S+$")


def test_a_slow_batch_of_replies_logs_a_figure_that_moves(monkeypatch, capsys):
    """A redirected distillation whose one chunk of model calls is a slow batch (the fake
    engine, 40 tokens a reply at 5 ms each): before, every line read "model calls 0/1 >
    generating: 0/3 reply (0%), 0/s, ETA ?" until a reply came back; now each line carries
    the tokens made so far, which grow from line to line, and no line says "0/1"."""
    from workbench.distill.write import Stats, _generate
    from workbench.models import load_model
    from workbench.models.base import GenerationParams

    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.1")
    model = load_model("fake", responses=[" ".join(["word"] * 40)], seconds_per_token=0.005)
    convs = [[{"role": "user", "content": f"question {i}"}] for i in range(3)]
    with P.stage("distill/distill"):
        gens = _generate(model, convs, GenerationParams(max_tokens=64), Stats())
    time.sleep(0.15)
    assert [g.completion_tokens for g in gens] == [40, 40, 40]
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[progress]")]
    if lines and not GEN_LINE.match(lines[0]):  # a reporter awake already may print at once
        assert re.fullmatch(r"\[progress\] distill/distill\b.*", lines[0]), lines
        lines = lines[1:]
    assert len(lines) >= 3, lines
    assert all(GEN_LINE.match(x) for x in lines), lines
    assert not any(re.search(r"\b0/1\b", x) for x in lines), lines
    tokens = [int(GEN_LINE.match(x).group(2)) for x in lines]
    assert all(b > a for a, b in itertools.pairwise(tokens)), tokens  # each line moves
    assert 0 < tokens[0] and tokens[-1] <= 120


def test_a_loop_of_one_item_says_it_is_under_way_not_0_of_1(monkeypatch, capsys):
    """One chunk with nothing counted inside it: "1 chunk under way" and the time, not
    "0/1 chunk (0%), 0/s, ETA ?"; a tally with a probe (an engine's count of tokens made so
    far) is read when a line is made, never goes back, and a probe that fails reads 0."""
    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.1")
    with P.stage("distill"):
        for _ in P.progress([1], desc="model calls", unit="chunk"):
            time.sleep(0.35)
    reads = [5, 50, 20, None, 80, RuntimeError("server gone")]
    calls = []

    def probe():
        calls.append(1)
        v = reads[min(len(calls), len(reads)) - 1]
        if isinstance(v, Exception):
            raise v
        return v

    with P.stage("serve"), P.tally("tokens", "token", probe=probe) as t:
        t.add(3)
        _wait_for(lambda: len(calls) >= 7)
    time.sleep(0.15)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[progress]")]
    one = [x for x in lines if "model calls" in x]
    assert one and all(re.fullmatch(r"\[progress\] distill > model calls: 1 chunk under way, "
                                    r"\d+s", x) for x in one), one
    counts = [int(m.group(1)) for x in lines if (m := re.fullmatch(
        r"\[progress\] serve: (\d+) token \([0-9.e+-]+/s\), \d+s", x))]
    assert counts[:6] == [8, 53, 53, 53, 83, 83] and counts == sorted(counts), lines
    assert t.added == 3


def test_a_tally_is_a_level_of_the_snapshot_and_costs_nothing_untracked(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("WB_PROGRESS_SECONDS", "100")
    P.set_progress_file(tmp_path / "p.json")
    with P.stage("distill"), P.tally("tokens", "token") as t:
        t.add(7)
        snap = P._ticker.snapshot()
    assert snap["label"] == "distill" and snap["levels"][-1] == {
        "desc": "tokens", "done": 7, "total": None, "unit": "token"}
    P.set_progress_file(None)
    monkeypatch.setattr(P, "bars_enabled", lambda: True)  # a terminal, no file: not tracked
    with P.tally("tokens", "token", probe=lambda: 1 / 0) as t:
        t.add(5)
        assert not t.live and not P._ticker.stacks


def test_the_local_backend_counts_tokens_as_each_step_makes_them(tiny_model, monkeypatch):
    """transformers' generation counts the tokens of a batch step by step (a stopping
    criterion that stops nothing), so a log's line moves inside a batch; the count is the
    replies' own token count and the replies are the same as without it."""
    import contextlib

    from workbench.models import load_model, local
    from workbench.models.base import GenerationParams

    steps = []

    class Recording(P.Tally):
        def add(self, n=1):
            steps.append(n)

    @contextlib.contextmanager
    def recording(desc, unit, **kw):
        yield Recording(P._Work(desc, None, unit, tally=True))

    model = load_model(tiny_model, batch_size=2)
    convs = [[{"role": "user", "content": f"Say something about filters, {i}."}]
             for i in range(3)]
    params = GenerationParams(max_tokens=12, temperature=1.0, seed=5)
    plain = model.generate(convs, params)
    monkeypatch.setattr(local, "tally", recording)
    counted = model.generate(convs, params)
    assert [g.text for g in counted] == [g.text for g in plain]
    assert sum(steps) == sum(g.completion_tokens for g in counted) > 0
    assert len(steps) >= 12 and max(steps) <= 2  # a step at a time, a batch of 2 rows


# --- long stages other than generation (issue 46: a 30,000-record library embedded for 30
# minutes with no progress line) ----------------------------------------------------------------

EMBED_LINE = re.compile(r"^\[progress\] (?P<names>.*)embedding: (?P<done>\d+)/(?P<total>\d+) "
                        r"text \(\d+%\), [0-9.e+-]+/s, \d+s, ETA \S+$")


class _SlowModel:
    """A sentence-transformers model as the PyTorch embedder calls it: `encode` takes 20 ms a
    batch and gives 4-dimensional vectors."""

    def __init__(self):
        self.calls = []

    def encode(self, texts, batch_size, **kw):
        import numpy as np

        self.calls.append(len(texts))
        time.sleep(0.02 * -(-len(texts) // batch_size))
        return np.ones((len(texts), 4), dtype=np.float32) / 2

    def get_sentence_embedding_dimension(self):
        return 4


def _embed_lines(capsys) -> list[str]:
    time.sleep(0.15)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[progress]")]
    got = [x for x in lines if EMBED_LINE.match(x)]
    assert got, lines
    return got


def test_a_long_embedding_logs_texts_done_of_all_with_rate_and_eta(monkeypatch, capsys):
    """The PyTorch embedder (a scripted model) counts texts, not blocks: each line says how
    many of the 320 texts are embedded, at what rate and how long is left, and the count
    grows; the vectors are the model's, in order."""
    from workbench.models.embed import PROGRESS_BATCHES, Embedder

    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.05")
    model = _SlowModel()
    emb = Embedder("scripted", model, batch_size=8)
    with P.stage("rag/index"):
        vecs = emb.embed([f"text {i}" for i in range(320)])
    assert vecs.shape == (320, 4) and vecs.dtype.name == "float32"
    assert model.calls == [8 * PROGRESS_BATCHES] * (320 // (8 * PROGRESS_BATCHES))
    lines = _embed_lines(capsys)
    done = [int(EMBED_LINE.match(x)["done"]) for x in lines]
    assert all(EMBED_LINE.match(x)["total"] == "320" for x in lines)
    assert all(EMBED_LINE.match(x)["names"] == "rag/index > " for x in lines), lines
    assert done == sorted(done) and 0 < done[-1] <= 320 and len(set(done)) > 1, lines
    # a query (one batch) counts nothing and starts no reporter's work
    emb.embed(["one query"])
    assert not P._ticker.stacks


def test_the_onnx_embedder_counts_texts_in_the_log_and_the_snapshot(tmp_path, monkeypatch,
                                                                    capsys):
    """ONNX Runtime's embedder (a scripted session and tokenizer) counts each batch's texts:
    in the log's lines and in a job's progress snapshot."""
    import numpy as np

    from workbench.models.embed import OnnxEmbedder

    class Tok:
        def __call__(self, texts, **kw):
            n = len(texts)
            return {"input_ids": np.ones((n, 3)), "attention_mask": np.ones((n, 3))}

    class Session:
        def run(self, names, feed, options=None):
            time.sleep(0.02)
            return [np.ones((len(feed["input_ids"]), 3, 4), dtype=np.float32)]

    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.05")
    monkeypatch.setattr("workbench.models.embed._release_arena", lambda: None)
    P.set_progress_file(tmp_path / "progress.json")
    seen = []
    emb = OnnxEmbedder("scripted", Session(), Tok(), 4, 16, batch_size=4,
                       inputs=["input_ids", "attention_mask"])
    real_run = Session.run

    def run_and_look(self, names, feed, options=None):
        seen.append(_read(tmp_path / "progress.json"))
        return real_run(self, names, feed, options)

    monkeypatch.setattr(Session, "run", run_and_look)
    vecs = emb.embed([f"t{i}" for i in range(60)])
    assert vecs.shape == (60, 4) and np.allclose(np.linalg.norm(vecs, axis=1), 1)
    lines = _embed_lines(capsys)
    assert all(EMBED_LINE.match(x)["total"] == "60" for x in lines)
    snaps = [s for s in seen if s and s["levels"]]
    assert snaps and all(s["label"] == "embedding" and s["unit"] == "text"
                         and s["total"] == 60 for s in snaps)
    assert max(s["done"] for s in snaps) > 0


def test_an_index_build_names_each_step_with_its_count(monkeypatch, capsys):
    """Building an index: chunking, keyword terms and embedding are counted, each line says
    which step of the build is under way."""
    from workbench.models.embed import Embedder
    from workbench.retrieval.index import RagConfig, RagIndex
    from workbench.retrieval.keyword import KeywordRetriever
    from workbench.records import Section

    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.05")
    slow = KeywordRetriever.make_scorer

    def slow_scorer(*a, **kw):
        time.sleep(0.15)
        return slow(*a, **kw)

    monkeypatch.setattr(KeywordRetriever, "make_scorer", staticmethod(slow_scorer))
    secs = [Section(id=f"s{i}", doc_id="d", source="x.md", heading_path=["x"],
                    text=f"Paragraph {i} about antennas and their gain.", content_hash="h",
                    order=i) for i in range(40)]
    idx = RagIndex.build(secs, config=RagConfig(chunk_size=96, chunk_overlap=16),
                         embedder=Embedder("scripted", _SlowModel(), batch_size=2))
    assert idx.manifest["n_chunks"] == 40
    time.sleep(0.15)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[progress]")]
    assert any(re.match(r"\[progress\] building the index > keyword index: running", x)
               for x in lines), lines
    emb = [x for x in lines if EMBED_LINE.match(x)]
    assert emb and all(EMBED_LINE.match(x)["names"] == "building the index > " and
                       EMBED_LINE.match(x)["total"] == "40" for x in emb), lines


def test_count_on_a_terminal_draws_a_bar_in_the_loops_own_unit(monkeypatch):
    """On a terminal, `count` is a tqdm bar that moves by each lump; nothing is tracked for
    the ticker unless a progress file is set."""
    import tqdm.auto

    made = []

    class Bar:
        def __init__(self, **kw):
            self.kw, self.n, self.closed = kw, 0, False
            made.append(self)

        def update(self, n):
            self.n += n

        def close(self):
            self.closed = True

    monkeypatch.setattr(P, "bars_enabled", lambda: True)
    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    with P.count("embedding", 100, "text") as c:
        c.add(40)
        c.add(0)
        c.add(60)
        assert not P._ticker.stacks
    assert made[0].n == 100 and made[0].closed
    assert made[0].kw["total"] == 100 and made[0].kw["unit"] == "text"
