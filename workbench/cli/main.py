"""`workbench` CLI. Each command parses input, calls one library function and prints.

Heavy libraries are imported inside the commands, so `--help` stays fast. User errors
(WorkbenchError) print one line and exit non-zero: 2 usage/config, 3 data, 1 other.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

import workbench.app as app_package
import workbench.io  # by module: tests replace run_child there
from workbench import plugins, registry
from workbench.cli.chat import chat_cmd
from workbench.cli_options import ConfigArg, SetOpt
from workbench.config import config_schema as experiment_config_schema
from workbench.config import dump_config, load_config
from workbench.corpus import ingest
from workbench.errors import DataError, WorkbenchError
from workbench.formats import (
    is_preference_row,
    read_dataset,
    validate_dataset,
    validate_preferences,
    write_dataset,
)
from workbench.io import write_jsonl
from workbench.jobs import (
    job_folder,
    job_row,
    job_rows,
    load_job,
    run_again,
    run_in_process,
    start_job,
    stop_job,
)
from workbench.models import load_model
from workbench.models.backends import backend_uses
from workbench.models.inventory import bundled_inventory
from workbench.models.resolve import resolve_chat_model
from workbench.models.templates import fingerprint_warning
from workbench.progress import quiet_libraries
from workbench.smoke import run_smoke
from workbench.workspace import streamlit_command, workspace_in

app = typer.Typer(
    name="workbench",
    help="Domain-Agent Workbench: distil domain knowledge into QTSA data, retrieval indexes "
         "and fine-tuned small models, and measure what each step buys.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
models_app = typer.Typer(help="List and resolve models (bundled, local, GGUF, hub cache, "
                              "OpenAI-compatible URL).", no_args_is_help=True)
data_app = typer.Typer(help="Validate, convert and ingest datasets (messages, ShareGPT, Alpaca; "
                            "corpus files to sections).", no_args_is_help=True)
config_app = typer.Typer(help="Experiment configs: the schema of every section, a config "
                              "with defaults filled in.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(data_app, name="data")
app.add_typer(config_app, name="config")


def echo_err(msg: str) -> None:
    typer.echo(msg, err=True)


# --- smoke --------------------------------------------------------------------------------

@app.command()
def smoke(config: ConfigArg = None, set_: SetOpt = None,
          json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """Load the default chat model and embedder, answer one question about a dataset file,
    print the answer and the timings."""
    quiet_libraries()
    cfg = load_config(config, set_)
    res = run_smoke(cfg)
    if json_out:
        typer.echo(json.dumps(res.__dict__, indent=2))
        return
    typer.echo(f"model     {res.model}\nembedder  {res.embedder}")
    typer.echo(f"context   {', '.join(res.context_sources)}")
    typer.echo(f"question  {res.question}\nanswer    {res.answer}")
    typer.echo("timings   " + "  ".join(f"{k}={v:.2f}" for k, v in res.timings.items()))


# --- models -------------------------------------------------------------------------------

@models_app.command("list")
def models_list(config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Experiment YAML whose models.chat to describe.")] = None,
        set_: SetOpt = None):
    """Show the bundled default models and where they resolve on this machine, then which
    backend serves the configured chat model for each use (generation, scoring); force one
    with -s models.chat.backend=transformers|ctranslate2."""
    for row in bundled_inventory():
        typer.echo(f"{row['name']:<24} {row['role']:<9} {row['status']:<14} {row['where']}")
    chat = load_config(config, set_).models.chat
    uses = backend_uses(chat.spec, chat.backend, chat.options)
    typer.echo(f"models.chat {chat.spec} ({chat.backend or 'auto'}): "
               + ", ".join(f"{use} -> {b}" for use, b in uses.items()))


@models_app.command("resolve")
def models_resolve(spec: Annotated[str, typer.Argument(help="Model spec to resolve.")]):
    """Say what a model spec points at (nothing is loaded or downloaded)."""
    typer.echo(resolve_chat_model(spec).describe())


# --- serve --------------------------------------------------------------------------------

@app.command()
def serve(
    model: Annotated[str, typer.Option(help="Model spec (default: the bundled chat model).")]
    = "default",
    adapter: Annotated[Path | None, typer.Option(help="PEFT LoRA adapter folder to "
                                                         "attach (safetensors only).")] = None,
    host: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 exposes the server "
                                           "to the network.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    name: Annotated[str | None, typer.Option(help="Model name clients send "
                                                     "(default: the spec).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    backend: Annotated[str | None, typer.Option(
        help="Engine: llamacpp, transformers or ctranslate2 (default: llama.cpp for a GGUF "
             "model where it is installed, else transformers; scoring stays on "
             "transformers).")] = None,
    api_key: Annotated[str | None, typer.Option(
        envvar="WB_API_KEY", show_envvar=True,
        help="Require `Authorization: Bearer <key>` on every route (401 otherwise).")] = None,
    docs: Annotated[bool, typer.Option(help="Serve /docs and /openapi.json.")] = False,
    max_body_mb: Annotated[float, typer.Option(help="Request bodies over this get 413.",
                                               min=0.001)] = 1.0,
    max_queue: Annotated[int, typer.Option(help="Requests that may wait while one "
                                                "generates; more get 429.", min=0)] = 16,
    lora_dir: Annotated[Path | None, typer.Option(
        help="Allow runtime LoRA adapters (vLLM's POST /v1/load_lora_adapter and "
             "/v1/unload_lora_adapter) from PEFT folders inside this folder; transformers "
             "backend only.")] = None,
    max_loras: Annotated[int, typer.Option(help="Runtime LoRA adapters loaded at once.",
                                           min=1, max=64)] = 8,
):
    """Serve a model over an OpenAI-compatible API: /v1/chat/completions (with tools and
    tool_calls), /v1/completions (text, and prompt scoring with echo + logprobs), /tokenize
    and /detokenize (vLLM's shape), /v1/models, /health.

    A forced tool_choice is generated under the tool's JSON schema (always a valid call);
    response_format (json_object, json_schema) and vLLM's guided_regex / guided_choice /
    guided_grammar constrain the reply the same way.

    Unsupported fields, and a prompt plus max_tokens longer than the model takes, get a 400
    in OpenAI's error shape; generation stops when the client disconnects; SIGTERM or
    Ctrl-C stops running requests (503) and the server within 10 s. Bind beyond 127.0.0.1
    only with --api-key."""
    from workbench.serve import ServerLimits
    from workbench.serve import serve as run_server

    quiet_libraries()
    opts = {"device": device}
    if adapter:
        opts["adapter"] = str(adapter)
    m = load_model(model, backend=backend, **opts)
    if adapter:
        # a backend without a transformers tokenizer (ctranslate2, llama.cpp) has none to compare
        tok = getattr(m, "tokenizer", None)
        if tok is not None and (w := fingerprint_warning(adapter, tok)):
            echo_err(w)
    served = name or ("smollm2-135m-instruct" if model == "default" else model)
    limits = ServerLimits(api_key=api_key or None, docs=docs,
                          max_body_bytes=int(max_body_mb * 1_000_000), max_queue=max_queue,
                          lora_dir=str(lora_dir) if lora_dir else None, max_loras=max_loras)
    if host not in ("127.0.0.1", "localhost", "::1") and not limits.api_key:
        echo_err(f"warning: serving on {host} without --api-key: anyone who can reach it "
                 "can use the model")
    echo_err(f"serving {m.identity} as {served!r} on http://{host}:{port}/v1"
             + (" (API key required)" if limits.api_key else "")
             + (f"; runtime LoRA adapters from {lora_dir}" if lora_dir else ""))
    run_server(m, served, host=host, port=port, limits=limits)


app.command("chat")(chat_cmd)


# --- data ---------------------------------------------------------------------------------

FormatOpt = Annotated[str, typer.Option("--format", "-f",
                                        help="messages, sharegpt, alpaca, preference (pairs) "
                                             "or auto.")]


@data_app.command("validate")
def data_validate(file: Annotated[Path, typer.Argument(help="JSONL dataset file.")],
                  fmt: FormatOpt = "auto",
                  show: Annotated[int, typer.Option(help="Problems to list.")] = 20):
    """Check every line of a dataset (SFT conversations, or preference pairs: prompt/chosen/
    rejected); list problems with their line numbers (exit 3 if any)."""
    from collections import Counter

    if fmt == "preference" or fmt == "auto" and _first_row_is_pair(file):
        good, problems = validate_preferences(file)
    else:
        good, problems = validate_dataset(file, fmt)
    for p in problems[:show]:
        echo_err(f"{p} [{p.code}]")
    if len(problems) > show:
        echo_err(f"... and {len(problems) - show} more")
    if good == 0 and not problems:
        echo_err(f"error: {file}: no records")
        raise typer.Exit(3)
    counts = Counter(p.code for p in problems)
    summary = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    typer.echo(f"{file}: {good} valid, {len(problems)} invalid" + (f" ({summary})" if summary
                                                                   else ""))
    if problems:
        raise typer.Exit(3)


def _first_row_is_pair(file: Path) -> bool:
    """Whether the first parseable line of `file` is a preference pair (read at most 8 MB)."""
    import json

    if not file.is_file():  # a folder, a device, a FIFO, absent: the validator names it
        return False
    with open(file, encoding="utf-8", errors="replace") as fh:
        while line := fh.readline(8 << 20):
            if len(line) >= 8 << 20:
                return False  # the validator reports the oversized line
            if line.strip():
                try:
                    return is_preference_row(json.loads(line))
                except ValueError:
                    return False
    return False


@data_app.command("convert")
def data_convert(src: Annotated[Path, typer.Argument(help="Input JSONL.")],
                 dst: Annotated[Path, typer.Argument(help="Output JSONL (written atomically).")],
                 from_: Annotated[str, typer.Option("--from", help="Input format or auto.")]
                 = "auto",
                 to: Annotated[str, typer.Option("--to", help="messages, sharegpt or alpaca.")]
                 = "messages"):
    """Convert a dataset between formats; nothing is written unless every line is valid."""
    if dst.is_dir():
        raise DataError("is a folder; name the file to write", path=str(dst))
    examples = read_dataset(src, from_)
    if not examples:  # never replace a file with an empty one
        raise DataError("no records; nothing written", path=str(src), code="empty")
    n = write_dataset(dst, examples, to)
    typer.echo(f"wrote {n} records to {dst} ({to})")


@data_app.command("ingest")
def data_ingest(corpus: Annotated[Path, typer.Argument(help="Folder or file: markdown, text, HTML, PDF, Word (docx), PowerPoint (pptx), "
    "Excel (xlsx), CSV or EPUB; a folder is read whole, and every file not read is named.")],
                out: Annotated[Path, typer.Option("--out", "-o", help="Section JSONL to "
                                                                     "write.")],
                on_error: Annotated[str, typer.Option(help="skip bad files (reported) or "
                                                           "fail.")] = "skip"):
    """Read a corpus into Section records that keep each heading path."""
    report = ingest(corpus, on_error=on_error)
    for f, why in report.skipped:
        echo_err(f"skipped {f}: {why}")
    if not report.sections:  # never write (or replace a file with) an empty corpus
        raise DataError("no sections found (no readable md, txt, html, pdf, docx, pptx, xlsx, "
                        "csv or epub file); nothing written", path=str(corpus), code="empty")
    n = write_jsonl(out, report.sections)
    typer.echo(f"{report.summary()}; wrote {n} sections to {out}")


# --- config -------------------------------------------------------------------------------

@config_app.command("schema")
def config_schema():
    """Print the JSON schema of the experiment config (every registered pipeline's section,
    with each field's description)."""
    typer.echo(json.dumps(experiment_config_schema(), indent=2))


@config_app.command("show")
def config_show(config: ConfigArg = None, set_: SetOpt = None):
    """Print a config with every default filled in and every override applied."""
    import yaml

    typer.echo(yaml.safe_dump(dump_config(load_config(config, set_)), sort_keys=False))


# --- pipelines (built from the registry) ---------------------------------------------------

def _run_command(name: str, help_text: str):
    def run(config: ConfigArg = None, set_: SetOpt = None,
            fresh: Annotated[bool, typer.Option(help="Ignore finished stages and checkpoints; "
                                                     "start over.")] = False):
        quiet_libraries()
        cfg = load_config(config, set_)
        result = run_in_process(name, cfg, log=echo_err, fresh=fresh)
        typer.echo(result.message)

    run.__doc__ = (f"{help_text}\n\nRuns in this process; stages whose inputs did not change "
                   "are skipped. `workbench jobs start " + name + " CONFIG` runs it in the "
                   "background.")
    return run


def add_pipeline_groups(root: typer.Typer) -> None:
    for p in registry.pipelines():
        group = typer.Typer(help=p.help, no_args_is_help=True)
        if p.cli:
            plugins.load(p.cli, what=f"pipeline {p.name!r}'s CLI")(group)
        if not any(c.name == "run" for c in group.registered_commands):
            group.command("run")(_run_command(p.name, p.help))
        root.add_typer(group, name=p.name)


# --- app and jobs -------------------------------------------------------------------------

@app.command("app")
def app_cmd(workspace: Annotated[Path | None, typer.Option(
                help="Project folder opened first (corpus, runs, jobs); it must lie inside "
                     "--root. Default: ROOT/workspace.")] = None,
            root: Annotated[Path | None, typer.Option(
                help="The folder every workspace of the app lives in: the projects page "
                     "opens or creates folders inside it only. Default: the folder holding "
                     "--workspace, else the current folder.")] = None,
            max_corpus_mb: Annotated[float | None, typer.Option(
                help="Cap on all documents of one corpus together, in MB (default 200).")]
            = None,
            port: Annotated[int, typer.Option(help="TCP port.")] = 8501,
            host: Annotated[str, typer.Option(help="Interface; 0.0.0.0 exposes the app to "
                                                   "the network.")] = "127.0.0.1"):
    """Start the Streamlit app for domain experts (XSRF protection on, uploads capped,
    workspaces confined to --root)."""
    import os

    script = Path(app_package.__file__).resolve().parent / "app.py"
    if not script.is_file():
        raise WorkbenchError(f"the app is missing from this installation ({script}); "
                             "reinstall the workbench")
    start = workspace.expanduser().resolve() if workspace is not None else None
    base = (root.expanduser() if root is not None
            else start.parent if start is not None else Path.cwd()).resolve()
    if base.exists() and not base.is_dir():
        raise WorkbenchError(f"{base}: the workspace root is not a folder")
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WorkbenchError(f"{base}: cannot use as the workspace root ({e.strerror or e})"
                             ) from None
    ws = workspace_in(base, start if start is not None else "workspace")
    env = dict(os.environ, WB_WORKSPACE=str(ws), WB_ROOT=str(base))
    if max_corpus_mb is not None:
        if max_corpus_mb <= 0:
            raise WorkbenchError(f"--max-corpus-mb must be positive, got {max_corpus_mb:g}")
        env["WB_MAX_CORPUS_MB"] = f"{max_corpus_mb:g}"
    cmd = streamlit_command(script, host=host, port=port)
    # at localhost Streamlit's lost-connection message asks whether the app still runs; at
    # 127.0.0.1 it asks about "the internet" (browser.serverAddress in the app's config)
    shown = "localhost" if host in ("127.0.0.1", "localhost") else host
    echo_err(f"workbench app on http://{shown}:{port} (workspace {ws}, root {base})")
    raise typer.Exit(workbench.io.run_child(cmd, env=env, cwd=script.parent))


jobs_app = typer.Typer(help="Background jobs of a workspace (shared with the app): start "
                            "them, watch them all in one table (`jobs list --watch`, the "
                            "task centre), stop them, run them again.",
                       no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")

JobsWorkspace = Annotated[Path, typer.Option(help="Workspace folder.")]


def _kinds_help() -> str:
    return "What to run: " + ", ".join(registry.names()) + "."


def jobs_start(kind: Annotated[str, typer.Argument(help="A registered pipeline or "
                                                        "experiment (see above).")],
               config: ConfigArg = None, set_: SetOpt = None,
               workspace: JobsWorkspace = Path("workspace")):
    job = start_job(workspace, kind, dump_config(load_config(config, set_)))
    typer.echo(f"{job.id} started (pid {job.pid}); `workbench jobs show {job.id}`")


jobs_start.__doc__ = ("Start long work in the background; returns at once with the job id. "
                      + _kinds_help())
jobs_app.command("start")(jobs_start)

JOB_COLUMNS = ("id", "kind", "state", "progress", "rate", "ETA", "elapsed", "run", "note")


def _job_cells(r) -> tuple[str, ...]:
    note = r.error or r.message or ""
    return (r.id, r.kind, r.state, r.progress_text(), r.rate_text(), r.eta_text(),
            r.elapsed_text(), r.run, note.splitlines()[0][:200] if note else "")


def _jobs_text(rows) -> str:
    """The task centre as plain text: one line per job under a header, columns aligned."""
    cells = [JOB_COLUMNS, *(_job_cells(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(JOB_COLUMNS) - 1)]
    return "\n".join(("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=False))
                      + "  " + c[-1]).rstrip() for c in cells)


def _jobs_rich(rows, title: str):
    from rich.markup import escape
    from rich.table import Table

    icons = {"running": "[yellow]", "completed": "[green]", "failed": "[red]",
             "stopped": "[magenta]", "unreadable": "[red]"}
    table = Table(title=escape(title), title_justify="left", expand=False)
    for c in JOB_COLUMNS:
        table.add_column(c, no_wrap=c in ("id", "state", "progress", "ETA", "elapsed"),
                         overflow="fold")
    for r in rows:
        cells = [escape(c) for c in _job_cells(r)]  # an error's "[Errno 2]" is not markup
        cells[2] = f"{icons.get(r.state, '')}{cells[2]}"
        table.add_row(*cells)
    return table


@jobs_app.command("list")
def jobs_list(workspace: JobsWorkspace = Path("workspace"),
              kind: Annotated[list[str] | None, typer.Option(
                  "--kind", "-k", help="Only the jobs of this pipeline (repeatable), e.g. "
                                       "--kind distill --kind train.")] = None,
              state: Annotated[list[str] | None, typer.Option(
                  "--state", help="Only the jobs in this state (repeatable): queued, "
                                  "running, completed, failed, stopped, unreadable.")] = None,
              watch: Annotated[bool, typer.Option(
                  "--watch", "-w", help="Keep the table up to date until Ctrl-C. On a "
                                        "terminal it is redrawn in place; otherwise a fresh "
                                        "table is printed every --interval seconds until no "
                                        "job is running.")] = False,
              interval: Annotated[float, typer.Option(
                  min=0.1, help="Seconds between refreshes with --watch.")] = 2.0,
              count: Annotated[int | None, typer.Option(
                  min=1, help="With --watch: stop after this many refreshes.")] = None):
    """The task centre: every job of the workspace, newest first, with its state, progress
    (done/total of the work in flight), rate, time left (ETA), elapsed time, run and its
    error or last message. `workbench jobs show ID` prints a job's log, `jobs stop ID` stops
    it, `jobs again ID` finishes a stopped or failed one."""
    import time

    def rows():
        return job_rows(workspace, kinds=kind, states=state, log_lines=0)

    def title(rs) -> str:
        busy = sum(r.state == "running" for r in rs)
        return (f"{len(rs)} job(s) in {workspace}, {busy} running  "
                f"({time.strftime('%H:%M:%S')})")

    if not watch:
        rs = rows()
        typer.echo(_jobs_text(rs) if rs else f"no jobs in {workspace}"
                   + (" match the filters" if kind or state else ""))
        return
    n = 0
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.live import Live

        try:
            rs = rows()
            with Live(_jobs_rich(rs, title(rs)), console=Console(), auto_refresh=False,
                      transient=False) as live:
                while count is None or n < count:
                    rs = rows()
                    live.update(_jobs_rich(rs, title(rs) + "  Ctrl-C to leave"),
                                refresh=True)
                    n += 1
                    if count is not None and n >= count:
                        break
                    time.sleep(interval)
        except KeyboardInterrupt:
            pass
        return
    try:
        while True:
            rs = rows()
            typer.echo(f"--- {title(rs)}")
            typer.echo(_jobs_text(rs) if rs else "no jobs")
            n += 1
            if (count is not None and n >= count) or not any(
                    r.state in ("queued", "running") for r in rs):
                return
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        pass


@jobs_app.command("show")
def jobs_show(job_id: str, workspace: JobsWorkspace = Path("workspace")):
    """A job's state, its progress while it runs, and the end of its log."""
    j = load_job(job_folder(workspace, job_id))
    typer.echo(f"{j.id}: {j.kind} {j.status}" + (f" - {j.error}" if j.error else ""))
    r = job_row(j, log_lines=0)
    if r.progress is not None and r.progress.levels:
        typer.echo(f"progress: {r.progress.label} {r.progress_text()}, {r.rate_text()}, "
                   f"ETA {r.eta_text()}, elapsed {r.elapsed_text()}")
    if j.peak_rss_mb is not None:
        typer.echo(f"peak memory of its work: {j.peak_rss_mb / 1024:.2f} GiB")
    typer.echo(j.log_text(40))


@jobs_app.command("stop")
def jobs_stop(job_id: str, workspace: JobsWorkspace = Path("workspace")):
    """Stop a running job (`workbench jobs again ID` finishes it later)."""
    job = load_job(job_folder(workspace, job_id))
    if stop_job(job):
        typer.echo(f"stop requested for {job_id}")
    else:
        typer.echo(f"{job_id} is not running ({job.status}); nothing to stop")


@jobs_app.command("again")
def jobs_again(job_id: str, workspace: JobsWorkspace = Path("workspace")):
    """Run a stopped or failed job again: a new job of the same kind and config that
    finishes the rest of its run (finished stages and cached model calls are skipped, as
    when the same work is started again). Refused while the job, or another job writing
    the same run, is still running."""
    new = run_again(load_job(job_folder(workspace, job_id)))
    typer.echo(f"{new.id} started (pid {new.pid}), running {job_id} again; "
               f"`workbench jobs show {new.id}`")


add_pipeline_groups(app)


# --- entry point --------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors end in one line and a documented exit code (2 usage or
    config, 3 data, 1 other, 130 interrupted, 143 stopped by SIGTERM). WB_DEBUG=1 shows
    tracebacks of OS errors too."""
    import os

    import click

    try:
        rc = app(args=argv, standalone_mode=False)
    except WorkbenchError as e:
        echo_err(f"error: {e}")
        return e.exit_code
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except click.exceptions.Abort:
        echo_err("aborted")
        return 130
    except KeyboardInterrupt:
        echo_err("interrupted")
        return 130
    except UnicodeDecodeError as e:  # a user's file that is not UTF-8 text
        echo_err(f"error: a file is not UTF-8 text (byte {e.start}: {e.reason})")
        return 3
    except OSError as e:  # a user's path: missing, a folder, no permission, disk full
        if os.environ.get("WB_DEBUG"):
            raise
        where = f"{e.filename}: " if e.filename else ""
        echo_err(f"error: {where}{e.strerror or e}")
        return 1
    return rc if isinstance(rc, int) else 0


def entry() -> None:
    sys.exit(main())
