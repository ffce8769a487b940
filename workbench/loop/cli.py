"""`workbench loop plan|approve|run|decide|judge-check|history CONFIG`: the improvement loop
with a person at its two gates (the plan, and keep / continue / revert / deploy), or
unattended with `run --auto` (the guards decide); `judge-check` has a person rate the rubric
judge's decisions."""

from __future__ import annotations

from typing import Annotated

import typer

from workbench.cli_options import ConfigArg, SetOpt
from workbench.config import load_config
from workbench.jobs import run_in_process, run_lock
from workbench.loop.records import round_name
from workbench.progress import quiet_libraries

RoundOpt = Annotated[int | None, typer.Option("--round", "-r",
                                              help="The round (default: the latest).")]
ByOpt = Annotated[str, typer.Option("--by", help="Who approves or decides (recorded).")]


def _loop(config, set_, log=None):
    from workbench.loop.api import Loop

    quiet_libraries()
    return Loop(load_config(config, list(set_ or [])),
                log=log or (lambda m: typer.echo(m, err=True)))


def _locked(loop, what: str):
    """The run folder's lock while a command changes the loop (a job, the app or another
    command holding it makes this one refuse, in one line)."""
    import os

    return run_lock(loop.ctx.layout.root, f"`workbench loop {what}` (pid {os.getpid()})")


def _plan_text(r) -> str:
    p = r.plan
    lines = [f"round {r.index} ({r.status}): target {p.target}", f"  why: {p.rationale}",
             "  failure modes of the target: " + (", ".join(
                 f"{m} {n}" for m, n in sorted(p.modes.items())) or "none"),
             "  recipe: " + ", ".join(f"{k} {v}" for k, v in p.recipe.items()),
             f"  anchor weightings: {', '.join(f'{w:g}' for w in p.weightings)}",
             f"  candidate: {p.hyper.get('steps')} LoRA steps, lr {p.hyper.get('learning_rate')}",
             "  guards: " + "; ".join(f"{g.name} <= {g.limit:g}" for g in p.guards)]
    return "\n".join(lines)


def register(group: typer.Typer) -> None:
    @group.command("plan")
    def plan(config: ConfigArg = None, set_: SetOpt = None):
        """Evaluate the current model on every suite, mine its failures by mode and write
        the next round's plan (target subset, data recipe, guards) for approval."""
        loop = _loop(config, set_)
        with _locked(loop, "plan"):
            r = loop.plan()
        typer.echo(_plan_text(r))
        typer.echo("approve it with `workbench loop approve CONFIG --by NAME`")

    @group.command("approve")
    def approve(config: ConfigArg = None, set_: SetOpt = None, round_: RoundOpt = None,
                by: ByOpt = "",
                target: Annotated[str | None, typer.Option(
                    help="Change the plan's target subset.")] = None,
                weightings: Annotated[str | None, typer.Option(
                    help="Change the anchor weightings, e.g. 0.5,1,2.")] = None,
                data: Annotated[bool, typer.Option(
                    "--data", help="Approve the synthesised data of a round waiting for "
                                   "review (loop.review_data) instead of a plan.")] = False,
                reject: Annotated[str | None, typer.Option(
                    help="With --data: sample ids to drop, separated by commas.")] = None):
        """Approve the planned round (optionally editing its target or weightings), or with
        --data the synthesised data of a round that waits for review."""
        if data:
            review = {x.strip(): "reject" for x in (reject or "").split(",") if x.strip()}
            loop = _loop(config, set_)
            with _locked(loop, "approve --data"):
                r = loop.approve(round_, by=by, data=True, review=review)
            typer.echo(f"round {r.index}: data reviewed by {r.reviewed_by}; continue with "
                       "`workbench loop run CONFIG`")
            return
        edits: dict = {}
        if target:
            edits["target"] = target
        if weightings:
            try:
                edits["weightings"] = [float(x) for x in weightings.split(",") if x.strip()]
            except ValueError:
                raise typer.BadParameter(f"{weightings!r}: numbers separated by commas",
                                         param_hint="--weightings") from None
        loop = _loop(config, set_)
        with _locked(loop, "approve"):
            r = loop.approve(round_, by=by, edits=edits)
        typer.echo(_plan_text(r))

    @group.command("run")
    def run(config: ConfigArg = None, set_: SetOpt = None, round_: RoundOpt = None,
            auto: Annotated[bool, typer.Option(
                "--auto", help="Unattended: plan, approve, run and let the guards decide, "
                               "loop.rounds times.")] = False,
            fresh: Annotated[bool, typer.Option(help="Redo finished steps.")] = False):
        """Run the approved round: synthesis, quality gates, mixture search, the candidate
        LoRA, evaluation and guards; then wait for `decide` (or decide by the guards with
        --auto). A killed run re-run continues at the first unfinished step."""
        if auto:
            quiet_libraries()
            result = run_in_process("loop", load_config(config, [*(set_ or []),
                                                                  "loop.mode=auto"]),
                                    log=lambda m: typer.echo(m, err=True), fresh=fresh)
            typer.echo(result.message)
            return
        loop = _loop(config, set_)
        loop.ctx.fresh = fresh
        with _locked(loop, "run"):
            r = loop.run_round(round_)
        typer.echo(f"round {r.index}: {r.status}; the guards recommend {r.recommendation}")
        for g in r.flagged:
            typer.echo(f"  FLAG {g.guard.name}: {g.detail}")
        typer.echo(f"report: {loop.files.path('report', round_name(r.index))}")
        typer.echo("decide with `workbench loop decide CONFIG keep|continue|revert|deploy "
                   "--reason ... --by NAME`")

    @group.command("decide")
    def decide(choice: Annotated[str, typer.Argument(
                   help="keep, continue (keep and plan the next round), revert or deploy.")],
               config: ConfigArg = None, set_: SetOpt = None, round_: RoundOpt = None,
               by: ByOpt = "",
               reason: Annotated[str, typer.Option(help="Why (recorded).")] = ""):
        """Decide a finished round. Revert checks that the current adapter is, byte for
        byte, the one the round started from; a round that cannot finish (a step keeps
        failing) can be reverted while running, to abandon it."""
        if choice not in ("keep", "continue", "revert", "deploy"):
            raise typer.BadParameter(f"{choice!r}: keep, continue, revert or deploy",
                                     param_hint="CHOICE")
        loop = _loop(config, set_)
        with _locked(loop, "decide"):
            r = loop.decide(round_, choice, reason=reason, by=by)
        d = r.decision
        typer.echo(f"round {r.index}: {d.choice}; current adapter "
                   f"{(d.adapter_after or 'base model')[:12]}")

    @group.command("judge-check")
    def judge_check_cmd(config: ConfigArg = None, set_: SetOpt = None, by: ByOpt = "",
                        rate: Annotated[bool, typer.Option(
                            help="Rate the next judged items here (y: the answer meets the "
                                 "criterion, n: it does not, s: skip, q: stop).")] = False):
        """The rubric judge checked against a person: judge-person agreement (Cohen's kappa
        with its 95% interval and the confusion table) on a sample of the judge's decisions,
        and whether the open questions' rubric delta can be trusted. With --rate, show the
        next unrated items (the judge's verdict hidden) and keep your verdicts."""
        from workbench.evaluate.agreement import agreement_lines, ask_in_terminal
        from workbench.loop.agreement import JudgeCheck, judge_check, judge_guard, rate_item
        from workbench.loop.decide import refresh_round_guard

        loop = _loop(config, set_)
        check = judge_check(loop)
        if not check.sample:
            typer.echo("no judged open answers yet: plan or run a round first")
            return
        if rate:
            if not by.strip():
                raise typer.BadParameter("--rate needs --by NAME (recorded)", param_hint="--by")
            def show(item, c) -> None:
                done = len([i for i in c.sample if i.key in c.rated])
                typer.echo(f"\n[{done + 1}/{len(c.sample)}] {item.question}\n\nanswer: "
                           f"{item.answer}\n\ncriterion ({item.points:+g} points): "
                           f"{item.criterion}")

            def keep(key: str, verdict: bool | None) -> JudgeCheck:
                with _locked(loop, "judge-check"):  # a skip is kept: another item replaces it
                    return rate_item(loop, key, verdict, by=by)

            check = ask_in_terminal(
                check, keep, question="meets it?", show=show,
                prompt=lambda text: typer.prompt(text, default="s"), stop_on=(typer.Abort,))
            with _locked(loop, "judge-check"):
                refresh_round_guard(loop.store, loop.evaluator)
        a = check.agreement
        g = judge_guard(check, loop.lc.guards)
        typer.echo(f"judge {check.judge or '-'}: {a.n if a else 0} of {len(check.sample)} "
                   "sampled decisions rated by a person")
        if a is not None:
            for line in agreement_lines(a, machine=("judge met", "judge not met"),
                                        person=("person met", "person not met")):
                typer.echo(line)
        typer.echo(f"guard: {'passed' if g.passed else 'FLAGGED'}: {g.detail}")

    @group.command("history")
    def history(config: ConfigArg = None, set_: SetOpt = None):
        """Kept and reverted interventions with their per-subset deltas (table; the plot is
        history.png next to it)."""
        from workbench.loop.report import write_history

        loop = _loop(config, set_)
        if not loop.rounds():
            typer.echo("no rounds yet")
            return
        path = write_history(loop.store)
        typer.echo(path.read_text())
        typer.echo(f"plot: {loop.files.path('history_plot')}")
