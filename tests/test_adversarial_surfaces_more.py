"""The adversarial round (docs/reliability.md, "adversarial round"), continued: the chat REPL
fed binary, endless or closed stdin and interrupted mid-answer (the scripted `fake` model),
exports aimed at a user's folder, a link or a device, hostile schemas, regexes and grammars
given to constrained decoding outside the server, and a profile whose column roles were edited
into nonsense. Each ends in one line naming the file or field, writes nothing outside what was
named, and never shows a traceback."""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_in_process

from workbench.errors import DataError, WorkbenchError

# --- chat REPL -----------------------------------------------------------------------------


def test_chat_takes_undecodable_and_endless_stdin_in_one_line(cli, tmp_path):
    """Piped stdin that is not UTF-8 (as Python reads it: lone surrogates) is asked and can
    be rated (before: /good raised PydanticSerializationError with a traceback, exit 1);
    64 KB+ without a newline (/dev/zero) stops with one line (before: read whole, without
    bound); a /bad correction with such bytes is stored as UTF-8."""
    ws = tmp_path / "ws"
    r = cli("chat", "--model", "fake", "--workspace", str(ws),
            stdin="hello\n\udcff\udcfe\x00bad\n/good\n/bad 1 fix \udcff\n")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "echo: \ufffd\ufffd\x00bad" in r.stdout and "kept (2 ratings)" in r.stdout
    rows = [json.loads(x) for x in (ws / "chat" / "ratings.jsonl").read_text("utf-8")
            .splitlines()]
    assert rows[0]["question"] == "\ufffd\ufffd\x00bad" and rows[1]["correction"] == "fix \ufffd"
    t0 = time.monotonic()
    r = cli("chat", "--model", "fake", "--workspace", str(ws), stdin="\x00" * 200_000)
    assert r.returncode == 3 and time.monotonic() - t0 < 5
    assert r.stderr.strip() == ("error: stdin: a line of over 65,536 characters (binary "
                                "input?); stopped")
    r = cli("chat", "--model", "fake", "--workspace", str(ws), "-q", "\udcff hi")
    assert r.returncode == 0 and "echo: \ufffd hi" in r.stdout


def test_chat_with_stdin_closed_says_so_and_exits(tmp_path, monkeypatch):
    """`workbench chat <&-`: Python sets sys.stdin to None (before: AttributeError with a
    traceback, exit 1); now one line and exit 0, as with an empty stdin."""
    from workbench.cli.main import main

    monkeypatch.setattr(sys, "stdin", None)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["chat", "--model", "fake", "--workspace", str(tmp_path / "ws")]) == 0
    assert err.getvalue().strip() == "no questions: stdin is closed"


class _Slow:
    """A model whose answer streams word by word; it sends this process SIGINT after the
    third word, as Ctrl-C in a terminal would."""

    def __init__(self):
        self.pieces = 0

    def stream(self, prompt, params):
        for i in range(2000):
            self.pieces += 1
            if i == 3:
                os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.001)
            yield f"w{i} "

    def close(self):
        pass


def test_sigint_mid_answer_stops_that_answer_and_the_repl_goes_on(tmp_path, monkeypatch):
    from workbench.chat import ChatSession
    from workbench.cli.chat import _repl

    model = _Slow()
    session = ChatSession([{"model": "slow"}], loader=lambda *a, **k: model)
    monkeypatch.setattr(sys, "stdin", io.StringIO("a long one\n/good\nagain\n"))
    out = io.StringIO()
    t0 = time.monotonic()
    _repl(session, tmp_path / "ws", out, interactive=False)
    text = out.getvalue()
    assert text.count("[stopped]") == 2 and "kept (1 ratings)" in text
    assert model.pieces < 40 and time.monotonic() - t0 < 5
    assert [a.finish for a in session.answers] == ["stopped", "stopped"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# --- exports -------------------------------------------------------------------------------

def _bench(path: Path) -> Path:
    path.write_text("".join(json.dumps({"question": f"q{i}", "choices": ["a", "b", "c", "d"],
                                        "answer": i % 4}) + "\n" for i in range(3)))
    return path


def _tree(root: Path) -> dict[str, tuple]:
    return {str(p.relative_to(root)): (p.is_symlink(), p.lstat().st_mtime_ns,
                                       p.read_bytes() if p.is_file() and not p.is_symlink()
                                       else None)
            for p in sorted(root.rglob("*"))}


def test_lm_eval_export_writes_only_what_was_named(cli, tmp_path):
    """`eval export-lm-eval -o` a folder of the user's files, a link to a folder, a file, or
    a name with `../`: refused or kept inside, nothing outside written (these held); into an
    earlier export whose items file is now a link to a file outside: the link is replaced by
    the new file, the outside file untouched."""
    bench = _bench(tmp_path / "bench.jsonl")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    (tmp_path / "afile").write_text("a file")
    (tmp_path / "link").symlink_to(mine)
    before = _tree(tmp_path)
    for target in ("mine", "link", "afile"):
        r = cli("eval", "export-lm-eval", str(bench), "-o", str(tmp_path / target))
        assert r.returncode == 1 and "refusing to replace it" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert _tree(tmp_path) == before
    out = tmp_path / "tasks"
    r = cli("eval", "export-lm-eval", str(bench), "-o", str(out), "--name", "../../x")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "export.json", "x.jsonl", "x.yaml", "x_cloze.yaml", "x_letter.yaml", "x_utils.py"]
    outside = tmp_path / "outside.jsonl"
    outside.write_text("keep me")
    (out / "x.jsonl").unlink()
    (out / "x.jsonl").symlink_to(outside)
    r = cli("eval", "export-lm-eval", str(bench), "-o", str(out), "--name", "x")
    assert r.returncode == 0, r.stderr
    assert outside.read_text() == "keep me" and not (out / "x.jsonl").is_symlink()
    assert len((out / "x.jsonl").read_text().splitlines()) == 3


def test_gguf_export_refuses_what_is_not_a_file_before_any_work(cli, tmp_path):
    """`train export-gguf -o` a folder, a FIFO, a link to a FIFO or a device: one line naming
    it before the adapter is even looked at (these held)."""
    os.mkfifo(tmp_path / "pipe.gguf")
    (tmp_path / "dir.gguf").mkdir()
    (tmp_path / "topipe.gguf").symlink_to(tmp_path / "pipe.gguf")
    (tmp_path / "null.gguf").symlink_to("/dev/null")
    for name, kind in [("dir.gguf", "a folder"), ("pipe.gguf", "a FIFO"),
                       ("topipe.gguf", "a FIFO"), ("null.gguf", "a device")]:
        for extra in ([], ["--lora"]):
            r = cli("train", "export-gguf", str(tmp_path / "no-adapter"), "-o",
                    str(tmp_path / name), *extra)
            assert r.returncode == 3, (name, r.stderr)
            assert r.stderr.strip() == f"error: {tmp_path / name}: is {kind}, not a regular " \
                                       "file; nothing written"
    assert (tmp_path / "dir.gguf").is_dir() and not any((tmp_path / "dir.gguf").iterdir())


def test_a_gguf_written_over_a_link_replaces_the_link_not_its_target(tmp_path):
    import gguf
    import numpy as np

    from workbench.models.gguf_file import write_gguf

    base = tmp_path / "base.gguf"
    w = gguf.GGUFWriter(str(base), "llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    outside = tmp_path / "users_model.gguf"
    outside.write_bytes(b"the user's own file")
    out = tmp_path / "out" / "merged.gguf"
    out.parent.mkdir()
    out.symlink_to(outside)
    write_gguf(out, gguf.GGUFReader(str(base)), "llama",
               {"token_embd.weight": np.ones((4, 4), dtype=np.float32)}, out_type="f32",
               name="x")
    assert outside.read_bytes() == b"the user's own file"
    assert not out.is_symlink() and gguf.GGUFReader(str(out)).tensors[0].data.sum() == 16
    assert sorted(p.name for p in out.parent.iterdir()) == ["merged.gguf"]


# --- constrained decoding outside the server -----------------------------------------------

def _deep(n: int) -> dict:
    s: dict = {"type": "string"}
    for _ in range(n):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


def test_hostile_schemas_regexes_and_grammars_are_one_line_before_compiling():
    """What an agent's tool definitions or a library caller hand to constrained decoding: a
    tool schema 2,000 levels deep (before: RecursionError out of the forced tool call's
    grammar), a schema, a regex 3,000 brackets deep, a grammar of 2,000 alternatives and
    5,000 choices: each a WorkbenchError naming the bound, within 1 s; at the limits, built."""
    from workbench.models.bounds import MAX_SCHEMA_DEPTH
    from workbench.models.constrain import Constraint, tool_call_constraint

    tool = {"type": "function", "function": {"name": "lookup", "parameters": _deep(2000)}}
    t0 = time.monotonic()
    cases = {
        "tool 'lookup' parameters": lambda: tool_call_constraint("hermes", None, [tool], None),
        "json_schema": lambda: Constraint.json_schema(_deep(2000)),
        "regex": lambda: Constraint.regex("(" * 3000 + "a" + ")" * 3000),
        "lark": lambda: Constraint.lark("start: " + " | ".join(f'"{i}"' for i in range(2000))),
        "choice": lambda: Constraint.choice([str(i) for i in range(5000)]),
    }
    for what, make in cases.items():
        with pytest.raises(WorkbenchError) as e:
            make()
        assert str(e.value).startswith(f"the {what} constraint is refused: the ") or \
            what == "choice", str(e.value)
        assert "limit" in str(e.value) and "\n" not in str(e.value)
    assert time.monotonic() - t0 < 1
    ok = {"type": "function", "function": {"name": "lookup",
                                           "parameters": _deep(MAX_SCHEMA_DEPTH // 2 - 1)}}
    assert "%json" in tool_call_constraint("hermes", None, [ok], None).value
    Constraint.regex("(" * MAX_SCHEMA_DEPTH + "a" + ")" * MAX_SCHEMA_DEPTH)


# --- profile roles edited by hand ----------------------------------------------------------

def _db(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE flights (flight_id INTEGER PRIMARY KEY, passengers INTEGER, "
                "carrier TEXT)")
    con.executemany("INSERT INTO flights VALUES (?, ?, ?)",
                    [(i, 80 + i % 7, "AB"[i % 2]) for i in range(30)])
    con.commit()
    con.close()
    return path


def _edit(path: Path, base: dict, change) -> None:
    data = json.loads(json.dumps(base))
    change(data["tables"][0]["columns"], data)
    path.write_text(json.dumps(data))


def test_a_profile_edited_into_nonsense_is_one_line_naming_the_file_and_field(tmp_path):
    """A role that is not one, of the wrong type, on a column the table lacks, a renamed
    column, a dropped column, a wrong type elsewhere, and a file that is not JSON: each one
    line naming the file and the field, through the CLI (`trajsynth profile`, exit 3) and the
    library; the file is left as the person wrote it (before: the first two and the last
    were profiled over in silence, losing every correction; the column cases were taken)."""
    from workbench.dataenv.env import DataEnvironment

    db, home = _db(tmp_path / "f.sqlite"), tmp_path / "home"
    DataEnvironment.open(db, cache_dir=home / "trajsynth")
    path = next(home.rglob("profile.json"))
    base = json.loads(path.read_text())
    cases = [
        (lambda c, d: c[1].update(role="wizard"),
         'tables[0].columns[1].role (flights.passengers): "wizard" is not a role'),
        (lambda c, d: c[1].update(role=5),
         "tables[0].columns[1].role (flights.passengers): 5 is not a role"),
        (lambda c, d: c.append({**c[1], "name": "ghost", "role": "amount"}),
         "tables[0].columns[3] 'ghost': table 'flights' has no such column"),
        (lambda c, d: c[1].update(name="passengerz"),
         "tables[0].columns[1] 'passengerz': table 'flights' has no such column"),
        (lambda c, d: c.pop(2), "tables[0] 'flights': column 'carrier' is missing"),
        (lambda c, d: c[1].update(is_unique="maybe"),
         ("not an environment profile: tables.0.columns.1.is_unique: Input should be a "
          "valid boolean")),
        (lambda c, d: d["tables"][0].update(name="planes"),
         "tables[0] 'planes': the data has no such table"),
    ]
    for change, want in cases:
        _edit(path, base, change)
        written = path.read_bytes()
        r = cli_in_process("trajsynth", "profile", str(db), env={"WB_HOME": str(home)})
        assert r.returncode == 3, (want, r.stdout[-500:], r.stderr)
        assert r.stderr.strip().startswith(f"error: {path}: {want}"), (want, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and path.read_bytes() == written
        with pytest.raises(DataError, match="fix it, or delete the file to profile again"):
            DataEnvironment.open(db, cache_dir=home / "trajsynth")
    path.write_text("{not json")
    with pytest.raises(DataError, match=r"profile.json: not a JSON profile \(Expecting"):
        DataEnvironment.open(db, cache_dir=home / "trajsynth")
    _edit(path, base, lambda c, d: c[1].update(role="amount"))  # a real correction is kept
    env = DataEnvironment.open(db, cache_dir=home / "trajsynth")
    assert env.profile.table("flights").column("passengers").role == "amount"
    path.unlink()  # deleted: profiled again
    assert DataEnvironment.open(db, cache_dir=home / "trajsynth").profile.table(
        "flights").column("passengers").role == "measurement"
