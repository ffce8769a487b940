"""`workbench chat`: a terminal REPL over `workbench.chat` (history, streaming, ratings)."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from workbench.chat import DEFAULT_SYSTEM, ChatSession, ChatSetup, chat_folder, rate, valid_text
from workbench.errors import ConfigError, DataError, WorkbenchError
from workbench.progress import quiet_libraries

HELP = """Commands (anything else is a question for every setup):
  /good [N]              the last answer of setup N (default 1) was good
  /bad [N] [text]        it was bad; text (or the next line you type) is what it should
                         have said (leave it empty to rate without a correction)
  /reset                 forget the conversation (models and indexes stay loaded)
  /setups                list the setups
  /help                  this list
  /quit                  leave (Ctrl-D too); Ctrl-C stops an answer being written"""

SETUP_KEYS = ("name", "model", "adapter", "index", "retriever", "k", "system", "max_tokens",
              "temperature")


def parse_setup(text: str, defaults: dict) -> dict:
    """`model=default;index=runs/x/index;k=5` (`;` or `,` between pairs) as a setup dict."""
    out = dict(defaults)
    for part in (p for p in text.replace(",", ";").split(";") if p.strip()):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in SETUP_KEYS:
            raise ConfigError([f"--setup {text!r}: {part.strip()!r} is not key=value with a "
                               f"key of {', '.join(SETUP_KEYS)}"])
        out[key] = value.strip()
    return out


def chat_cmd(
    model: Annotated[str | None, typer.Option(
        help="Model spec: the bundled model (`default`), a local folder, a .gguf, or an "
             "OpenAI-compatible URL (URL#model). Default: the adapter's base model (from its "
             "manifest), else the bundled model.", show_default=False)] = None,
    adapter: Annotated[Path | None, typer.Option(help="A LoRA adapter folder to attach "
                                                         "(e.g. runs/NAME/adapter).")]
    = None,
    index: Annotated[Path | None, typer.Option(help="A retrieval index folder (e.g. "
                                                       "runs/NAME/index): answers use its "
                                                       "passages.")] = None,
    k: Annotated[int, typer.Option("-k", help="Passages retrieved per question.", min=1,
                                   max=20)] = 3,
    retriever: Annotated[str, typer.Option(help="hybrid, semantic or keyword.")] = "hybrid",
    setup: Annotated[list[str] | None, typer.Option(
        "--setup", help="A setup side by side with the others (up to 3), as key=value pairs "
                        "separated by ';': model, adapter, index, retriever, k, name, system, "
                        "max_tokens, temperature. Unset keys take the options above. "
                        "Example: --setup 'model=default' --setup "
                        "'adapter=runs/rf/adapter;index=runs/rf/index'.")] = None,
    question: Annotated[list[str] | None, typer.Option(
        "--question", "-q", help="Ask this and exit (repeatable: one conversation).")] = None,
    workspace: Annotated[Path, typer.Option(help="Where ratings and the REPL's history are "
                                                 "kept (WORKSPACE/chat).")] = Path("workspace"),
    max_tokens: Annotated[int, typer.Option(help="Longest answer, in tokens.", min=1)] = 256,
    temperature: Annotated[float, typer.Option(help="0 is greedy.", min=0.0, max=2.0)] = 0.0,
    system: Annotated[str | None, typer.Option(help="System prompt.")] = None,
):
    """Talk to a model, an adapter or a retrieval-augmented setup, up to three side by side:
    type once, read each answer as it is written, with the passages each index retrieved
    and their sources under it.

    Rate an answer with /good or /bad (and what it should have said): ratings go to
    WORKSPACE/chat/ratings.jsonl and become training data the training core reads,
    WORKSPACE/chat/sft.jsonl (messages rows) and WORKSPACE/chat/pairs.jsonl (preference
    pairs: `workbench train run ... -s train.method=dpo -s train.data=...`). /help lists the
    commands. With --question, or with questions piped on stdin, it answers and exits."""
    quiet_libraries()
    defaults = {"model": model, "adapter": str(adapter) if adapter else None,
                "index": str(index) if index else None, "k": k, "retriever": retriever,
                "max_tokens": max_tokens, "temperature": temperature,
                "system": DEFAULT_SYSTEM if system is None else system}
    raw = [parse_setup(s, defaults) for s in setup] if setup else [defaults]
    setups = [_setup(r, n, len(raw)) for n, r in enumerate(raw, start=1)]
    if not question and sys.stdin is None:  # started with stdin closed (`<&-`)
        typer.echo("no questions: stdin is closed", err=True)
        return
    session = ChatSession(setups)
    out = sys.stdout
    try:
        session.prepare()  # a bad model, adapter or index is named before the first question
        if question:
            for q in question:
                _turn(session, q, out)
            return
        _repl(session, workspace, out, interactive=sys.stdin.isatty())
    finally:
        session.close()


def _setup(raw: dict, n: int, of: int):
    from pydantic import ValidationError

    try:
        return ChatSetup.model_validate(raw)
    except ValidationError as e:
        where = f"--setup {n}: " if of > 1 else ""
        raise ConfigError([f"{where}{'.'.join(map(str, err['loc'])) or 'setup'}: "
                           f"{err['msg']}" for err in e.errors()]) from None


def _turn(session, q: str, out, stop: threading.Event | None = None) -> list:
    answers = []
    turn = session.new_turn()
    for i, s in enumerate(session.setups):
        if len(session.setups) > 1:
            out.write(f"\n── [{i + 1}] {s.label}\n")
        out.flush()
        a = session.answer(i, q, turn=turn, stop=stop,
                           on_piece=lambda p: (out.write(p), out.flush()))
        if a.error:
            out.write(f"[error: {a.error}]")
        elif a.finish == "stopped":
            out.write(" [stopped]")
        out.write("\n")
        for p in a.passages:
            out.write(f"   [{p.rank}] {p.cite} · {p.source}\n")
        answers.append(a)
    out.flush()
    return answers


def _repl(session, workspace: Path, out, *, interactive: bool) -> None:
    history = None
    if interactive:
        try:
            import readline

            history = chat_folder(workspace) / "history"
            if history.is_file():
                readline.read_history_file(history)
        except (ImportError, OSError):
            history = None
        out.write(f"chatting with {len(session.setups)} setup(s): "
                  + "; ".join(f"[{i + 1}] {s.label}" for i, s in enumerate(session.setups))
                  + "\n/help for commands, /quit to leave\n")
    last: list = []
    prompt = "you> " if interactive else ""
    # Ctrl-C at the prompt gives a fresh line even when SIGINT came in ignored (a shell
    # script's background job, some launchers): the disposition is inherited through exec
    old_int = None
    if interactive and threading.current_thread() is threading.main_thread():
        old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        while True:
            try:
                line = _read_line(prompt, interactive)
            except EOFError:
                break
            except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh line, as a shell does
                out.write("\n(/quit or Ctrl-D to leave)\n")
                continue
            line = line.strip()
            if not line:
                continue
            if line in ("/quit", "/exit"):
                break
            if line == "/help":
                out.write(HELP + "\n")
            elif line == "/reset":
                session.reset()
                out.write("conversation forgotten\n")
            elif line == "/setups":
                for i, s in enumerate(session.setups):
                    out.write(f"[{i + 1}] {s.label}\n")
            elif line.split()[0] in ("/good", "/bad"):
                try:
                    _rate(line, last, workspace, rate, interactive, out)
                except WorkbenchError as e:
                    out.write(f"error: {e}\n")
            elif line.startswith("/"):
                out.write(f"unknown command {line.split()[0]}; /help lists them\n")
            else:
                last = _answer_interruptibly(session, line, out)
    finally:
        if old_int is not None:
            signal.signal(signal.SIGINT, old_int)
        if history is not None:
            import contextlib
            import readline

            with contextlib.suppress(OSError):
                readline.write_history_file(history)


MAX_LINE = 64 * 1024  # characters of one line read from a pipe or file


def _read_line(prompt: str, interactive: bool) -> str:
    """The next line: from the terminal through `input` (readline's editing and history),
    else from stdin at most `MAX_LINE` characters at a time, bytes that are not UTF-8 read
    as U+FFFD (piped binary is text with replacement marks, never a crash at the rating
    that stores it); a longer line (binary input, /dev/zero) stops the REPL with one line."""
    if interactive:
        return valid_text(input(prompt))
    raw = getattr(sys.stdin, "buffer", None)
    line = raw.readline(MAX_LINE + 1).decode("utf-8", "replace") if raw is not None else \
        valid_text(sys.stdin.readline(MAX_LINE + 1))
    if not line:
        raise EOFError
    if len(line.rstrip("\r\n")) > MAX_LINE:
        raise DataError(f"a line of over {MAX_LINE:,} characters (binary input?); stopped",
                        path="stdin", code="too_large")
    return line


def _answer_interruptibly(session, q: str, out) -> list:
    """Ctrl-C while an answer is written stops that turn's answers, not the REPL."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return _turn(session, q, out, stop)

    def on_int(_sig, _frame):
        stop.set()

    old = signal.signal(signal.SIGINT, on_int)
    try:
        return _turn(session, q, out, stop)
    finally:
        signal.signal(signal.SIGINT, old)


def _rate(line: str, last: list, workspace: Path, rate, interactive: bool, out) -> None:
    cmd, *rest = line.split(maxsplit=2)
    n = 1
    if rest and rest[0].isdigit():
        n = int(rest.pop(0))
    correction = " ".join(rest).strip() or None
    if not last:
        raise WorkbenchError("no answer to rate yet")
    if not 1 <= n <= len(last):
        raise WorkbenchError(f"setup {n}: there are {len(last)} answers (1..{len(last)})")
    if cmd == "/bad" and correction is None and interactive:
        correction = input("what should it have said (empty: no correction)> ").strip() or None
    files = rate(workspace, last[n - 1], cmd[1:], correction)
    out.write(f"kept ({files.ratings} ratings): {files.sft} SFT rows in "
              f"{files.folder / 'sft.jsonl'}, {files.pairs} pairs in "
              f"{files.folder / 'pairs.jsonl'}\n")
