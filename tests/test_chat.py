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
    assert ChatSetup(adapter="runs/rf/adapter", index="runs/rf/index", k=5).label == \
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


class Terminal:
    """A child process on a pseudo-terminal: what a person's terminal would show it."""

    def __init__(self, argv: list[str], cwd, env: dict):
        import os
        import pty
        import subprocess

        import fcntl
        import termios

        self.master, slave = pty.openpty()

        def controlling_terminal():  # in the child, after setsid: Ctrl-C reaches it as SIGINT
            import signal

            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            # started as a shell script's background job would start it: SIGINT ignored (it
            # is inherited through exec; the REPL must take Ctrl-C all the same)
            signal.signal(signal.SIGINT, signal.SIG_IGN)

        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd,
                                     env=env, start_new_session=True, close_fds=True,
                                     preexec_fn=controlling_terminal)
        os.close(slave)
        self.seen = ""

    def expect(self, text: str, timeout: float = 120) -> str:
        """Wait until `text` appears after what the last `expect` matched."""
        import os
        import select
        import time

        deadline = time.monotonic() + timeout
        start = getattr(self, "mark", 0)
        while text not in self.seen[start:]:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {text!r}; the terminal shows:\n{self.seen[-3000:]}"
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                try:
                    self.seen += os.read(self.master, 65536).decode(errors="replace")
                except OSError:  # the child closed the terminal
                    assert text in self.seen[start:], self.seen[-3000:]
        self.mark = self.seen.index(text, start) + len(text)
        return self.seen

    def expect_more(self, chars: int, timeout: float = 120) -> str:
        """Wait until `chars` more characters have come after what `expect` matched (the
        first words of an answer: a fixed sleep fails on a loaded machine)."""
        import os
        import select
        import time

        deadline = time.monotonic() + timeout
        start = getattr(self, "mark", 0)
        while len(self.seen) - start < chars:
            left = deadline - time.monotonic()
            assert left > 0, f"no {chars} characters came; the terminal shows:\n" \
                             f"{self.seen[-3000:]}"
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                self.seen += os.read(self.master, 65536).decode(errors="replace")
        return self.seen

    def send(self, text: str) -> None:
        import os

        os.write(self.master, text.encode())

    def close(self) -> int:
        import os

        try:
            return self.proc.wait(timeout=60)
        finally:
            os.close(self.master)


def test_chat_in_a_terminal(cli_process, tmp_path):
    """`workbench chat` on a pseudo-terminal with the bundled model: the prompt, a streamed
    answer, Ctrl-C stops a long answer and the REPL goes on, Ctrl-C at the prompt does not
    leave, /bad asks what it should have said, /quit leaves with exit 0 and the history is
    kept for the next session."""
    import os
    import sys

    from conftest import REPO

    ws = tmp_path / "ws"
    env = dict(os.environ, TQDM_DISABLE="1", TERM="dumb")
    t = Terminal([sys.executable, "-m", "workbench", "chat", "--max-tokens", "2000",
                  "--temperature", "0.8", "--workspace", str(ws)], REPO, env)
    try:
        t.expect("you> ", timeout=300)
        t.send("Write a very long story about a radio engineer.\r")
        t.expect("radio engineer.")
        import time

        # some of the 2,000 tokens are out (however loaded the machine), most are not
        t.expect_more(40, timeout=300)
        t.send("\x03")  # Ctrl-C, as the terminal sends it
        t.expect("[stopped]", timeout=60)
        t.expect("you> ", timeout=60)
        for attempt in range(3):  # at the prompt: a fresh line, not the end
            time.sleep(0.5)  # a signal in the instant before readline waits is seen late
            t.send("\x03")
            try:
                t.expect("/quit or Ctrl-D to leave", timeout=20)
                break
            except AssertionError:
                if attempt == 2:
                    raise
        t.send("/bad\r")
        t.expect("what should it have said")
        t.send("A greeting back.\r")
        t.expect("kept (1 ratings): 1 SFT rows")
        t.send("/quit\r")
        rc = t.close()
        assert rc == 0, t.seen[-2000:]
    finally:
        if t.proc.poll() is None:
            t.proc.kill()
    assert "Traceback" not in t.seen
    pairs = read_preferences(ws / "chat" / "pairs.jsonl")
    assert pairs[0].chosen[0].content == "A greeting back."
    assert "radio engineer" in (ws / "chat" / "history").read_text()
    assert pairs[0].rejected[0].content.strip()  # the words written before Ctrl-C
