"""Chat (issue 29, item 1): setups side by side, streaming, retrieval with sources, stopping,
ratings kept as the training core's SFT rows and preference pairs, and the REPL."""

from __future__ import annotations

import json
import threading

import pytest

from workbench.chat import ChatSession, ChatSetup, rate, read_ratings, training_rows
from workbench.errors import WorkbenchError
from workbench.formats import read_dataset, read_preferences

FAKE = {"model": "fake", "options": {"responses": ["The VSWR is 1.5.", "It is 2.0."]}}


def test_setups_are_checked():
    with pytest.raises(WorkbenchError, match="at most 3"):
        ChatSession([FAKE] * 4)
    with pytest.raises(WorkbenchError, match="no setup"):
        ChatSession([])
    with pytest.raises(ValueError, match="retriever 'bm42'"):
        ChatSetup(retriever="bm42")
    assert ChatSetup(adapter="runs/rf/train/adapter", index="runs/rf/rag", k=5).label == \
        "base + adapter rf + hybrid k=5"


def test_real_tokens_stream_and_stop_within_a_token(tiny_model):
    """A tiny random-init Llama through the local backend: pieces arrive one by one; a stop
    event set after the third piece ends the answer there (not at max_tokens), and the model
    is free for the next question at once."""
    s = ChatSession([{"model": tiny_model, "max_tokens": 64, "system": ""}])
    pieces = []
    full = s.answer(0, "hello there", on_piece=pieces.append)
    assert full.finish == "stop" and len(pieces) > 3 and "".join(pieces) == full.text
    stop = threading.Event()
    got = []

    def on_piece(p):
        got.append(p)
        if len(got) == 3:
            stop.set()

    cut = s.answer(0, "hello there", stop=stop, on_piece=on_piece)
    assert cut.finish == "stopped" and len(got) == 3 and cut.text == "".join(got)
    # a consumer that leaves (the app's rerun closes the generator) stops generation too
    gen = s.stream(0, "and again")
    next(gen)
    gen.close()
    assert s.answers[-1].finish == "stopped"
    again = s.answer(0, "hello there")  # the lock was released: this does not hang
    assert again.finish == "stop"
    # history: each finished answer joins its setup's conversation
    assert [m["role"] for m in s.prompt(0, "next", "")][:2] == ["user", "assistant"]


def test_retrieval_passages_and_history_per_setup(rf_index):
    seen = []

    def reply(conv):
        seen.append(conv)
        return "Answer " + str(len(seen))

    s = ChatSession([{"model": "fake", "options": {"script": reply}},
                     {"model": "fake", "options": {"script": reply}, "index": str(rf_index),
                      "retriever": "keyword", "k": 2}])
    a, b = s.ask("What does a quarter-wave transformer match?")
    assert a.passages == [] and len(b.passages) == 2
    assert all(p.cite and p.source and p.text for p in b.passages)
    # the retrieved passages are in setup 2's prompt only, cited as in evaluation
    assert "Reference passages" not in seen[0][-1]["content"]
    assert "Reference passages" in seen[1][-1]["content"]
    assert b.passages[0].cite in seen[1][-1]["content"]
    s.ask("And its bandwidth?")
    # each setup's history holds its own answer and the plain question (no old passages)
    assert [m["content"] for m in seen[2][1:]] == [
        "What does a quarter-wave transformer match?", "Answer 1", "And its bandwidth?"]
    assert seen[3][2]["content"] == "Answer 2"
    assert "Reference passages" not in seen[3][1]["content"]
    s.reset()
    s.ask("Fresh start")
    assert len(seen[4]) == 2  # system + question


def test_a_failing_setup_is_shown_and_the_others_answer():
    def boom(conv):
        raise RuntimeError("endpoint down")

    s = ChatSession([{"model": "fake", "options": {"script": boom}}, FAKE])
    a, b = s.ask("hi")
    assert a.finish == "error" and "endpoint down" in a.error and b.text == "The VSWR is 1.5."
    assert s.histories[0] == [] and len(s.histories[1]) == 2


def test_ratings_become_sft_rows_and_pairs_the_trainer_reads(tmp_path):
    ws = tmp_path / "ws"
    s = ChatSession([FAKE, FAKE])  # same prompt: a good answer of one is chosen over the other
    good, bad = s.ask("What is the VSWR?")
    rate(ws, good, "good")
    files = rate(ws, bad, "bad", "The VSWR is 1.5 (a 4% reflected power).")
    assert (files.ratings, files.sft, files.pairs) == (2, 2, 2)
    rows = read_dataset(ws / "chat" / "sft.jsonl")
    assert [r.messages[-1].content for r in rows] == [
        "The VSWR is 1.5.", "The VSWR is 1.5 (a 4% reflected power)."]
    assert rows[0].messages[0].role == "system" and rows[0].messages[1].content == \
        "What is the VSWR?"
    pairs = read_preferences(ws / "chat" / "pairs.jsonl")
    assert {p.chosen[0].content for p in pairs} == {"The VSWR is 1.5 (a 4% reflected power).",
                                                    "The VSWR is 1.5."}
    assert {p.rejected[0].content for p in pairs} == {"It is 2.0."}
    assert all(p.metadata["source"] == "chat" for p in pairs)
    # the files are what `workbench data validate` accepts
    from workbench.formats import validate_dataset, validate_preferences

    assert validate_dataset(ws / "chat" / "sft.jsonl") == (2, [])
    assert validate_preferences(ws / "chat" / "pairs.jsonl") == (2, [])
    # a person changes their mind: the last rating of an answer counts
    files = rate(ws, bad, "good")
    assert (files.ratings, files.sft, files.pairs) == (3, 2, 0)
    assert len(read_ratings(ws)) == 3


def test_a_pair_needs_the_same_prompt_and_a_bad_answer_without_text_is_refused(tmp_path,
                                                                              rf_index):
    s = ChatSession([FAKE, {**FAKE, "index": str(rf_index), "retriever": "keyword"}])
    plain, augmented = s.ask("What is the VSWR?")
    rate(tmp_path, plain, "good")
    files = rate(tmp_path, augmented, "bad")  # no correction, other prompt: nothing to pair
    assert (files.sft, files.pairs) == (1, 0)
    with pytest.raises(WorkbenchError, match="correction goes with a bad"):
        rate(tmp_path, plain, "good", "better text")
    err = ChatSession([{"model": "fake", "options": {"script": lambda c: 1 / 0}}])
    (broken,) = err.ask("hi")
    with pytest.raises(WorkbenchError, match="no text"):
        rate(tmp_path, broken, "good")


def test_ratings_are_written_only_into_a_chat_folder_we_made(tmp_path):
    (good,) = ChatSession([FAKE]).ask("q")
    ws = tmp_path / "ws"
    ws.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ws / "chat").symlink_to(elsewhere)
    with pytest.raises(WorkbenchError, match="not a folder the workbench made"):
        rate(ws, good, "good")
    assert list(elsewhere.iterdir()) == []
    (ws / "chat").unlink()
    (ws / "chat").mkdir()
    (ws / "chat" / "sft.jsonl").mkdir()  # a folder where a file goes: refused, kept
    with pytest.raises(WorkbenchError, match="not a regular file"):
        rate(ws, good, "good")
    assert (ws / "chat" / "sft.jsonl").is_dir()


def test_torn_ratings_line_is_skipped_and_a_bad_one_named(tmp_path):
    (good,) = ChatSession([FAKE]).ask("q")
    rate(tmp_path, good, "good")
    path = tmp_path / "chat" / "ratings.jsonl"
    with open(path, "a") as fh:
        fh.write('{"turn": "x", "setup"')  # an append cut short
    assert len(read_ratings(tmp_path)) == 1
    path.write_text(path.read_text().splitlines()[0] + "\n" + json.dumps({"turn": 1}) + "\n")
    with pytest.raises(WorkbenchError, match=r"ratings.jsonl:2:"):
        read_ratings(tmp_path)


def test_training_rows_keep_the_prompt_the_model_saw(rf_index):
    s = ChatSession([{**FAKE, "index": str(rf_index), "retriever": "keyword", "k": 1}])
    (a,) = s.ask("What limits bandwidth?")
    from workbench.chat import Rating

    sft, pairs = training_rows([Rating(turn=a.turn, setup=0, label=a.label, question=a.question,
                                       prompt=a.prompt, answer=a.text, verdict="bad",
                                       correction="Q of the match.")])
    assert "Reference passages" in sft[0].messages[-2].content
    assert pairs[0].prompt[-1].content == sft[0].messages[-2].content


def test_repl_answers_rates_and_exits(cli, tmp_path):
    ws = tmp_path / "ws"
    script = ("What is the VSWR?\n/good\nWhy?\n/bad 1 Because of the match.\n/bad 3\n"
              "/nonsense\n/setups\n/reset\n/quit\nnever read")
    r = cli("chat", "--model", "fake", "--workspace", str(ws), stdin=script)
    assert r.returncode == 0, r.stderr
    assert "echo: What is the VSWR?" in r.stdout and "echo: Why?" in r.stdout
    assert "kept (1 ratings): 1 SFT rows" in r.stdout
    assert "kept (2 ratings): 2 SFT rows" in r.stdout and "1 pairs" in r.stdout
    assert "setup 3: there are 1 answers" in r.stdout
    assert "unknown command /nonsense" in r.stdout
    assert "never read" not in r.stdout
    assert len(read_preferences(ws / "chat" / "pairs.jsonl")) == 1


def test_cli_side_by_side_with_sources(cli, rf_index, tmp_path):
    r = cli("chat", "--setup", "model=fake", "--setup",
            f"model=fake;index={rf_index};retriever=keyword;k=2;name=with passages",
            "-q", "What is a Smith chart?", "--workspace", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "── [1] fake" in r.stdout and "── [2] with passages" in r.stdout
    after = r.stdout.split("── [2] with passages")[1]
    assert after.count("   [") == 2 and " · " in after
    bad = cli("chat", "--setup", "model=fake;colour=blue", "-q", "x")
    assert bad.returncode != 0 and "colour" in bad.stderr and "Traceback" not in bad.stderr
    four = cli("chat", *["--setup", "model=fake"] * 4, "-q", "x")
    assert four.returncode != 0 and "at most 3" in four.stderr
