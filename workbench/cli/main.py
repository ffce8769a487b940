"""`workbench` CLI. Each command parses input, calls one library function and prints.

Heavy libraries are imported inside the commands, so `--help` stays fast. User errors
(WorkbenchError) print one line and exit non-zero: 2 usage/config, 3 data, 1 other.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(
    name="workbench",
    help="Domain-Agent Workbench: distil domain knowledge into QTSA data, retrieval indexes "
         "and fine-tuned small models, and measure what each step buys.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
models_app = typer.Typer(help="List and resolve models (bundled, local, GGUF, hub cache, "
                              "OpenAI-compatible URL).", no_args_is_help=True)
data_app = typer.Typer(help="Validate and convert SFT datasets (messages, ShareGPT, Alpaca).",
                       no_args_is_help=True)
rag_app = typer.Typer(help="Retrieval: build keyword/semantic/hybrid indexes, query them, "
                           "evaluate them against qrels.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(data_app, name="data")
distill_app = typer.Typer(help="QTSA distillation: corpus sections to question-thinking-"
                               "solution-answer training data and an MC benchmark.",
                          no_args_is_help=True)
train_app = typer.Typer(help="LoRA SFT: train, preview the trained spans, merge.",
                        no_args_is_help=True)
pipeline_app = typer.Typer(help="The main job: distil, index, evaluate base and RAG, train, "
                                "evaluate SFT, report.", no_args_is_help=True)
app.add_typer(rag_app, name="rag")
app.add_typer(distill_app, name="distill")
app.add_typer(train_app, name="train")
app.add_typer(pipeline_app, name="pipeline")

ConfigArg = Annotated[Optional[Path], typer.Argument(help="Experiment YAML config.",
                                                     show_default=False)]
SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", "-s", help="Override a config key, e.g. -s models.chat.spec=/models/qwen "
                        "(repeatable).")]


def echo_err(msg: str) -> None:
    typer.echo(msg, err=True)


# --- smoke --------------------------------------------------------------------------------

@app.command()
def smoke(config: ConfigArg = None, set_: SetOpt = None,
          json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """Load the default chat model and embedder, answer one question about a dataset file,
    print the answer and the timings."""
    from workbench.config import load_config
    from workbench.progress import quiet_libraries
    from workbench.smoke import run_smoke

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
def models_list():
    """Show the bundled default models and where they resolve on this machine."""
    from workbench.models.inventory import bundled_inventory

    for row in bundled_inventory():
        typer.echo(f"{row['name']:<24} {row['role']:<9} {row['status']:<14} {row['where']}")


@models_app.command("resolve")
def models_resolve(spec: Annotated[str, typer.Argument(help="Model spec to resolve.")]):
    """Say what a model spec points at (nothing is loaded or downloaded)."""
    from workbench.models.resolve import resolve_chat_model

    typer.echo(resolve_chat_model(spec).describe())


# --- serve --------------------------------------------------------------------------------

@app.command()
def serve(
    model: Annotated[str, typer.Option(help="Model spec (default: the bundled chat model).")]
    = "default",
    adapter: Annotated[Optional[Path], typer.Option(help="PEFT LoRA adapter folder to "
                                                         "attach (safetensors only).")] = None,
    host: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 exposes the server "
                                           "to the network.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    name: Annotated[Optional[str], typer.Option(help="Model name clients send "
                                                     "(default: the spec).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
):
    """Serve a model over an OpenAI-compatible API (/v1/chat/completions, /v1/models,
    /health, and /v1/completions for prompt scoring)."""
    from workbench.models import load_model
    from workbench.progress import quiet_libraries
    from workbench.serve import serve as run_server

    quiet_libraries()
    opts = {"device": device}
    if adapter:
        opts["adapter"] = str(adapter)
    m = load_model(model, **opts)
    if adapter:
        from workbench.train.recipe import fingerprint_warning

        if w := fingerprint_warning(adapter, m.tokenizer):
            echo_err(w)
    served = name or ("smollm2-135m-instruct" if model == "default" else model)
    echo_err(f"serving {m.identity} as {served!r} on http://{host}:{port}/v1")
    run_server(m, served, host=host, port=port)


# --- data ---------------------------------------------------------------------------------

FormatOpt = Annotated[str, typer.Option("--format", "-f",
                                        help="messages, sharegpt, alpaca or auto.")]


@data_app.command("validate")
def data_validate(file: Annotated[Path, typer.Argument(help="JSONL dataset file.")],
                  fmt: FormatOpt = "auto",
                  show: Annotated[int, typer.Option(help="Problems to list.")] = 20):
    """Check every line of a dataset; list problems with their line numbers (exit 3 if any)."""
    from collections import Counter

    from workbench.formats import validate_dataset

    good, problems = validate_dataset(file, fmt)
    for p in problems[:show]:
        echo_err(f"{p} [{p.code}]")
    if len(problems) > show:
        echo_err(f"... and {len(problems) - show} more")
    counts = Counter(p.code for p in problems)
    summary = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    typer.echo(f"{file}: {good} valid, {len(problems)} invalid" + (f" ({summary})" if summary
                                                                   else ""))
    if problems:
        raise typer.Exit(3)


@data_app.command("convert")
def data_convert(src: Annotated[Path, typer.Argument(help="Input JSONL.")],
                 dst: Annotated[Path, typer.Argument(help="Output JSONL (written atomically).")],
                 from_: Annotated[str, typer.Option("--from", help="Input format or auto.")]
                 = "auto",
                 to: Annotated[str, typer.Option("--to", help="messages, sharegpt or alpaca.")]
                 = "messages"):
    """Convert a dataset between formats; nothing is written unless every line is valid."""
    from workbench.formats import read_dataset, write_dataset

    examples = read_dataset(src, from_)
    n = write_dataset(dst, examples, to)
    typer.echo(f"wrote {n} records to {dst} ({to})")


@data_app.command("ingest")
def data_ingest(corpus: Annotated[Path, typer.Argument(help="Folder or file (md, txt, html, "
                                                            "pdf).")],
                out: Annotated[Path, typer.Option("--out", "-o", help="Section JSONL to "
                                                                     "write.")],
                on_error: Annotated[str, typer.Option(help="skip bad files (reported) or "
                                                           "fail.")] = "skip"):
    """Read a corpus into Section records that keep each heading path."""
    from workbench.io import write_jsonl
    from workbench.rag.ingest import ingest

    report = ingest(corpus, on_error=on_error)
    for f, why in report.skipped:
        echo_err(f"skipped {f}: {why}")
    n = write_jsonl(out, report.sections)
    typer.echo(f"{report.summary()}; wrote {n} sections to {out}")


# --- rag ----------------------------------------------------------------------------------

RetrieverOpt = Annotated[str, typer.Option("--retriever", "-r",
                                           help="keyword, semantic or hybrid.")]


@rag_app.command("build")
def rag_build(corpus: Annotated[Path, typer.Argument(help="Corpus folder/file, or Section "
                                                          "JSONL.")],
              out: Annotated[Path, typer.Option("--out", "-o", help="Index folder to write.")],
              config: Annotated[Optional[Path], typer.Option(
                  "--config", "-c", help="Experiment YAML with a `rag:` section.")] = None,
              set_: SetOpt = None):
    """Chunk a corpus and build the keyword (BM25), semantic (FAISS) and hybrid indexes."""
    from workbench.progress import quiet_libraries
    from workbench.rag.api import build_index

    quiet_libraries()
    cfg = _rag_config(config, set_)
    index, _ = build_index(corpus, out, cfg, log=echo_err)
    m = index.manifest
    typer.echo(f"built {out}: {m['n_chunks']} chunks from {m['n_sections']} sections, "
               f"embedder {m['embedder']['identity']}, corpus {m['corpus_hash']}")


def _rag_config(config, overrides):
    from workbench.config import load_config
    from workbench.rag.index import RagConfig

    return load_config(config, overrides).rag if (config or overrides) else RagConfig()


@rag_app.command("query")
def rag_query(index: Annotated[Path, typer.Argument(help="Index folder.")],
              text: Annotated[str, typer.Argument(help="The query.")],
              retriever: RetrieverOpt = "hybrid",
              k: Annotated[int, typer.Option("-k", help="Hits to return.")] = 10,
              doc: Annotated[Optional[list[str]], typer.Option(
                  help="Only these documents (id or source path; repeatable).")] = None,
              heading: Annotated[Optional[str], typer.Option(
                  help="Only under this heading path, e.g. 'Reflection > VSWR'.")] = None,
              json_out: Annotated[bool, typer.Option("--json", help="One JSON object per "
                                                                    "hit.")] = False):
    """Query an index; prints rank, score, chunk, section, document and heading path."""
    from workbench.progress import quiet_libraries
    from workbench.rag.api import query_index

    quiet_libraries()
    prefix = tuple(h.strip() for h in heading.split(">")) if heading else ()
    hits = query_index(index, text, retriever=retriever, k=k, documents=tuple(doc or ()),
                       heading_prefix=prefix)
    for h in hits:
        if json_out:
            typer.echo(json.dumps({"rank": h.rank, "chunk_id": h.chunk_id, "score": h.score,
                                   "section_id": h.section_id, "document": h.doc_id,
                                   "heading_path": h.heading_path}))
        else:
            typer.echo(f"{h.rank:>3} {h.score:9.4f}  {' > '.join(h.heading_path)}  "
                       f"[{h.chunk_id}]")


@rag_app.command("eval")
def rag_eval(index: Annotated[Path, typer.Argument(help="Index folder.")],
             qrels: Annotated[Path, typer.Option(help="Qrels: JSONL, or TREC with --queries.")],
             queries: Annotated[Optional[Path], typer.Option(
                 help="Query texts for TREC qrels (TSV id<TAB>text or JSONL).")] = None,
             level: Annotated[str, typer.Option(help="Relevance level: chunk, section or "
                                                     "doc.")] = "chunk",
             out: Annotated[Optional[Path], typer.Option(help="Write summary and per-query "
                                                              "JSON here.")] = None):
    """Hit@k, Recall@k, MRR and nDCG@k of the three retrievers side by side."""
    from workbench.io import atomic_write_json
    from workbench.progress import quiet_libraries
    from workbench.rag.evaluate import evaluate_retrievers, format_table, read_qrels
    from workbench.rag.index import RagIndex

    quiet_libraries()
    qs = read_qrels(qrels, queries)
    idx = RagIndex.load(index)
    summary = evaluate_retrievers({n: idx.retriever(n) for n in ("keyword", "semantic",
                                                                  "hybrid")}, qs, level=level)
    typer.echo(f"{len(qs)} queries, relevance at {level} level\n" + format_table(summary))
    if out:
        atomic_write_json(out, summary)


# --- distill ------------------------------------------------------------------------------

@distill_app.command("run")
def distill_run(config: ConfigArg = None, set_: SetOpt = None):
    """Distil the configured corpus; writes samples, benchmark, SFT exports and report.md
    into <output_dir>/<name>/distill. Re-running resumes from the call cache."""
    from workbench.config import load_config
    from workbench.distill.api import distill_from_config
    from workbench.progress import quiet_libraries

    quiet_libraries()
    cfg = load_config(config, set_)
    res = distill_from_config(cfg, progress=echo_err)
    a = res.report["accepted"]
    typer.echo(f"{res.run_dir}: {a['total']} samples accepted ({a['mc']} mc, {a['nd']} nd), "
               f"{a['benchmark_items']} benchmark items; see {res.run_dir / 'report.md'}")


@distill_app.command("export")
def distill_export(run: Annotated[Path, typer.Argument(help="Run folder (or its distill/).")],
                   out: Annotated[Path, typer.Option("--out", "-o", help="JSONL to write.")],
                   fmt: Annotated[str, typer.Option("--format", "-f", help="messages, "
                                                    "sharegpt or alpaca.")] = "messages",
                   style: Annotated[str, typer.Option(help="instruct (one turn) or thinking "
                                                           "(reasoning channel).")]
                   = "instruct",
                   kinds: Annotated[str, typer.Option(help="mc, nd or mc,nd (mixed).")]
                   = "mc,nd"):
    """Export training-split samples as an SFT dataset (benchmark sections never included)."""
    from workbench.distill.api import export_run

    n = export_run(run, out, fmt=fmt, style=style, kinds=tuple(k.strip() for k in
                                                               kinds.split(",")))
    typer.echo(f"wrote {n} examples to {out} ({fmt}, {style})")


@distill_app.command("report")
def distill_report(run: Annotated[Path, typer.Argument(help="Run folder (or its distill/).")],
                   json_out: Annotated[bool, typer.Option("--json")] = False):
    """Print a distillation run's report."""
    from workbench.distill.api import read_report

    report, md = read_report(run)
    typer.echo(json.dumps(report, indent=2) if json_out else md)


# --- train --------------------------------------------------------------------------------

@train_app.command("run")
def train_run(config: ConfigArg = None, set_: SetOpt = None,
              fresh: Annotated[bool, typer.Option(help="Ignore checkpoints; start over.")]
              = False):
    """LoRA SFT of models.chat on train.data; resumes from the last complete checkpoint.
    Several GPUs: `torchrun --nproc_per_node N -m workbench train run CONFIG`."""
    from pathlib import Path as _P

    from workbench.config import load_config
    from workbench.progress import quiet_libraries
    from workbench.train.recipe import train

    quiet_libraries()
    cfg = load_config(config, set_)
    out = _P(cfg.train.output) if cfg.train.output else cfg.run_dir / "adapter"
    res = train(cfg.train, model_spec=cfg.models.chat.spec, output=out, seed=cfg.seed,
                resume=not fresh, log=echo_err)
    typer.echo(f"adapter written to {res.output} ({res.steps} steps)")


@train_app.command("preview")
def train_preview(config: ConfigArg = None, set_: SetOpt = None,
                  index: Annotated[int, typer.Option(help="Which example.")] = 0):
    """Print one training example as the model sees it, trained spans in [[ ]]."""
    from transformers import AutoTokenizer

    from workbench.config import load_config
    from workbench.models.local import model_folder
    from workbench.models.resolve import resolve_chat_model
    from workbench.train.data import preview
    from workbench.train.recipe import load_examples

    cfg = load_config(config, set_)
    tok = AutoTokenizer.from_pretrained(model_folder(resolve_chat_model(cfg.models.chat.spec)))
    if cfg.train.chat_template:
        tok.chat_template = cfg.train.chat_template
    _, examples = load_examples(cfg.train)
    typer.echo(preview(tok, examples[index]))


@train_app.command("merge")
def train_merge(adapter: Annotated[Path, typer.Argument(help="Adapter folder.")],
                out: Annotated[Path, typer.Option("--out", "-o", help="Merged model folder.")],
                base: Annotated[str, typer.Option(help="Base model spec.")] = "default"):
    """Merge an adapter into its base model; refuses unless logits match within 1e-4."""
    from workbench.progress import quiet_libraries
    from workbench.train.merge import merge_adapter

    quiet_libraries()
    rep = merge_adapter(base, adapter, out)
    typer.echo(f"merged into {out}; max |logit diff| {rep['max_abs_logit_diff']:.2e}")


# --- eval ---------------------------------------------------------------------------------

@app.command("eval")
def eval_cmd(config: ConfigArg = None, set_: SetOpt = None):
    """Score models.chat (+ eval.adapter) on the MC benchmark under each eval.condition
    (none, semantic, keyword, hybrid); writes results.jsonl, summary.json and a plot."""
    from workbench.config import load_config
    from workbench.evaluate.run import format_summary, run_eval
    from workbench.progress import quiet_libraries

    quiet_libraries()
    out = run_eval(load_config(config, set_), log=echo_err)
    typer.echo(format_summary(out["conditions"]))
    typer.echo(f"results in {out['output']}")


# --- pipeline -----------------------------------------------------------------------------

@pipeline_app.command("run")
def pipeline_run(config: ConfigArg = None, set_: SetOpt = None):
    """Run the main job; stages whose inputs did not change are skipped."""
    from workbench.config import load_config
    from workbench.pipeline import run_pipeline
    from workbench.progress import quiet_libraries

    quiet_libraries()
    cfg = load_config(config, set_)
    report = run_pipeline(cfg, log=echo_err)
    for row in report["table"]:
        acc = row["acc_loglik"]
        gen = row["acc_generate"]
        typer.echo(f"{row['name']:<28} loglik {acc if acc is None else f'{acc:.1%}':>7}   "
                   f"generate {gen if gen is None else f'{gen:.1%}':>7}")
    typer.echo(f"report: {cfg.run_dir / 'report.md'}")


# --- app and jobs -------------------------------------------------------------------------

@app.command("app")
def app_cmd(workspace: Annotated[Path, typer.Option(help="Project folder (corpus, runs, "
                                                         "jobs).")] = Path("workspace"),
            port: Annotated[int, typer.Option(help="TCP port.")] = 8501,
            host: Annotated[str, typer.Option(help="Interface; 0.0.0.0 exposes the app to "
                                                   "the network.")] = "127.0.0.1"):
    """Start the Streamlit app for domain experts (XSRF protection on, uploads capped)."""
    import os
    import subprocess

    from workbench.errors import WorkbenchError
    from workbench.workspace import MAX_UPLOAD_MB, open_workspace

    script = Path(__file__).resolve().parents[2] / "apps" / "streamlit" / "app.py"
    if not script.exists():
        raise WorkbenchError(f"the app is not installed here ({script} missing); run from a "
                             "checkout of the workbench")
    ws = open_workspace(workspace)
    env = dict(os.environ, WB_WORKSPACE=str(ws))
    cmd = [sys.executable, "-m", "streamlit", "run", str(script), "--server.address", host,
           "--server.port", str(port), "--server.headless", "true",
           "--server.enableXsrfProtection", "true", "--server.enableCORS", "true",
           "--server.maxUploadSize", str(MAX_UPLOAD_MB), "--browser.gatherUsageStats",
           "false", "--global.developmentMode", "false"]
    echo_err(f"workbench app on http://{host}:{port} (workspace {ws})")
    raise typer.Exit(subprocess.call(cmd, env=env, cwd=script.parent))


jobs_app = typer.Typer(help="Background jobs of a workspace (shared with the app).",
                       no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")


@jobs_app.command("start")
def jobs_start(kind: Annotated[str, typer.Argument(help="distill, index, train, eval or "
                                                        "pipeline.")],
               config: ConfigArg = None, set_: SetOpt = None,
               workspace: Annotated[Path, typer.Option(help="Workspace folder.")]
               = Path("workspace")):
    """Start long work in the background; returns at once with the job id."""
    from workbench.config import dump_config, load_config
    from workbench.jobs import start_job

    job = start_job(workspace, kind, dump_config(load_config(config, set_)))
    typer.echo(f"{job.id} started (pid {job.pid}); `workbench jobs show {job.id}`")


@jobs_app.command("list")
def jobs_list(workspace: Annotated[Path, typer.Option(help="Workspace folder.")]
              = Path("workspace")):
    """Jobs, newest first."""
    from workbench.jobs import list_jobs

    for j in list_jobs(workspace):
        typer.echo(f"{j.id:<40} {j.kind:<9} {j.status:<10} {j.error or ''}")


@jobs_app.command("show")
def jobs_show(job_id: str, workspace: Annotated[Path, typer.Option(help="Workspace folder.")]
              = Path("workspace")):
    """A job's state and the end of its log."""
    from workbench.jobs import load_job

    j = load_job(Path(workspace) / "jobs" / job_id)
    typer.echo(f"{j.id}: {j.kind} {j.status}" + (f" - {j.error}" if j.error else ""))
    typer.echo(j.log_text(40))


@jobs_app.command("stop")
def jobs_stop(job_id: str, workspace: Annotated[Path, typer.Option(help="Workspace folder.")]
              = Path("workspace")):
    """Stop a running job (it can be resumed by starting it again)."""
    from workbench.jobs import load_job, stop_job

    stop_job(load_job(Path(workspace) / "jobs" / job_id))
    typer.echo(f"stop requested for {job_id}")


# --- entry point --------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    import click

    from workbench.errors import WorkbenchError

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
    return rc if isinstance(rc, int) else 0


def entry() -> None:
    sys.exit(main())
