"""`workbench trajsynth ...`: profile an environment, build its task pool, search, export."""

from __future__ import annotations

from typing import Annotated

import typer

from workbench.cli_options import ConfigArg, ConfigOpt, OutOpt, SetOpt, load
from workbench.datatasks.poolfiles import format_summary, load_pool
from workbench.progress import quiet_libraries
from workbench.runs import outputs_at
from workbench.text import percent, percent_interval
from workbench.trajsynth.downstream import DownstreamConfig, format_downstream, run_downstream

EnvArg = Annotated[str, typer.Argument(help="A SQLite file, a folder of CSV/TSV/Parquet files, "
                                            "or a shipped sample (chinook, sklearn_classic).")]


def _cfg(config, config_opt, set_):
    return load(config, config_opt, set_)


def register(group: typer.Typer) -> None:
    @group.command("profile")
    def profile(env: EnvArg, digest: Annotated[bool, typer.Option(
            help="Print the prompt digest instead of the JSON profile.")] = True):
        """Profile an environment (tables, typed columns, keys, joins, value dictionaries);
        cached by content hash."""
        from workbench.trajsynth.api import open_env

        e = open_env(env)
        typer.echo(e.profile.digest() if digest else e.profile.model_dump_json(indent=1))

    @group.command("tasks")
    def tasks(env: EnvArg, out: OutOpt, config: ConfigArg = None,
              config_opt: ConfigOpt = None, set_: SetOpt = None):
        """Synthesise and verify the task pool: OUT/tasks.jsonl and tasks.summary.json."""
        from workbench.trajsynth.api import make_task_pool, open_env

        tc = _cfg(config, config_opt, set_).trajsynth  # a bad config fails before any profiling
        pool = make_task_pool(open_env(env), tc.pool, out)
        typer.echo(format_summary(pool.summary))
        typer.echo(f"wrote {outputs_at('trajsynth', out).path('tasks')}")

    @group.command("explore")
    def explore(env: EnvArg, out: OutOpt, config: ConfigArg = None,
                config_opt: ConfigOpt = None, set_: SetOpt = None):
        """Search OUT/tasks.jsonl with MCTS (one tree per task under OUT/trees; a re-run only
        searches what is missing) and export SFT, ICL and preference data."""
        from workbench.trajsynth.api import explore_folder, open_env

        quiet_libraries()
        s, ex = explore_folder(_cfg(config, config_opt, set_), open_env(env), out,
                               log=lambda m: typer.echo(m, err=True))
        lo, hi = s["yield_ci95"]
        typer.echo(f"{s['tasks_verified']}/{s['tasks']} tasks verified "
                   f"({percent_interval(s['yield'], lo, hi)}); "
                   f"{s['ledger']['executions']} executions, "
                   f"prefix hit rate {percent(s['prefix_hit_rate'])}, "
                   f"{s['ledger']['model_calls']} model calls; {ex['sft']} SFT, "
                   f"{ex['preferences']} preference pairs in {out}")

    @group.command("export")
    def export_cmd(env: EnvArg, out: OutOpt, config: ConfigArg = None,
                   config_opt: ConfigOpt = None, set_: SetOpt = None):
        """Write OUT/sft.messages.jsonl, icl_bank.jsonl and preferences.jsonl from the saved
        trees (no search)."""
        from workbench.trajsynth.api import export, folder_tasks, open_env

        ex = export(out, folder_tasks(_cfg(config, config_opt, set_), out), open_env(env),
                    log=lambda m: typer.echo(m, err=True))
        typer.echo(f"{ex['sft']} SFT conversations, {ex['icl']} ICL entries, "
                   f"{ex['preferences']} preference pairs in {out}")

    @group.command("report")
    def report(env: EnvArg, out: OutOpt,
               conditions: Annotated[str, typer.Option(
                   help="Comma-separated: zero_shot, icl, sft, sft_dpo.")] = "zero_shot,icl,sft",
               k: Annotated[int, typer.Option(help="icl: demonstrations per question.")] = 3,
               max_tasks: Annotated[int | None, typer.Option(
                   help="Held-out tasks scored at most.")] = None,
               sft_steps: Annotated[int, typer.Option(help="sft: LoRA steps.")] = 60,
               dpo_steps: Annotated[int, typer.Option(
                   help="sft_dpo: DPO steps after SFT, on OUT/preferences.jsonl.")] = 30,
               max_length: Annotated[int, typer.Option(
                   min=64, help="sft, sft_dpo: longest trajectory or pair side trained, in tokens "
                        "(a longer one is refused before training, named).")] = 2048,
               dpo_pairs: Annotated[str, typer.Option(
                   help="sft_dpo's pairs: preferences (OUT/preferences.jsonl) or steps "
                        "(step-level pairs from OUT/sft.messages.jsonl).")] = "preferences",
               model: Annotated[str, typer.Option(help="The agent's model spec.")] = "default"):
        """The downstream check on the held-out tasks of OUT/tasks.jsonl: execution accuracy
        of a one-step SQL agent zero-shot, with k retrieved ICL demonstrations, and after LoRA
        SFT on OUT/sft.messages.jsonl, and (sft_dpo) after DPO from that adapter on
        OUT/preferences.jsonl; intervals, outcomes, McNemar vs zero-shot (and sft_dpo vs
        sft). Each adapter and condition is a stage: a re-run skips what is done."""
        from workbench.trajsynth.api import open_env

        quiet_libraries()
        cfg = DownstreamConfig.checked(
            conditions=[c.strip() for c in conditions.split(",") if c.strip()], k=k,
            max_tasks=max_tasks, sft_steps=sft_steps, dpo_steps=dpo_steps, dpo_pairs=dpo_pairs,
            sft_max_length=max_length)
        pool = load_pool(outputs_at("trajsynth", out).path("tasks"))
        res = run_downstream(open_env(env), pool.split("held_out"), out, cfg, model_spec=model,
                             log=lambda m: typer.echo(m, err=True))
        typer.echo(format_downstream(res))
        typer.echo(f"wrote {outputs_at('trajsynth', out).path('downstream_report')}")
