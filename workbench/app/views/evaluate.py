import streamlit as st

from workbench.app.common import (
    COMPARE_SETTINGS,
    EVAL_SETTINGS,
    RAG_SETTINGS,
    TRAIN_SETTINGS,
    base_config,
    distill_settings,
    job_panel,
    not_ready,
    options_html,
    require_corpus,
    runs,
    sections_of,
    show_error,
    show_image,
    show_section,
    workspace,
)
from workbench.app.glossary import show_glossary
from workbench.evaluate.benchmark import load_benchmark
from workbench.evaluate.report import SCORING_LABELS, read_eval_results, read_eval_summary
from workbench.jobs import start_job
from workbench.text import accuracy, p_value, percent, points, points_interval
from workbench.workspace import save_benchmark

SCORINGS = ("letter", "cloze", "cloze_norm", "generate")

st.title("Evaluate and compare")
st.caption("How well does each model answer the benchmark's multiple-choice questions: the "
           "base model, with retrieval (RAG: passages from the index in the prompt) and "
           "fine-tuned (SFT: with the LoRA adapter from Train). Start a whole comparison or "
           "score a benchmark of your own below, then read the results of any run.")
show_glossary("MC", "ND", "perspective", "RAG", "hit@k", "recall@k", "MRR", "nDCG", "oracle",
              "SFT", "LoRA", "adapter", "MCF", "CF", "per-char norm.", "headline", "degenerate",
              "Wilson", "McNemar", "Holm", "bootstrap")
ws = workspace()
with st.expander("Run the whole comparison (distil, index, base vs RAG vs SFT)"):
    name = st.text_input("Run name", value="compare", key="e-name")
    persp = st.multiselect("Perspectives", ["concepts", "analysis", "design", "performance",
                                            "applications"], default=["concepts"], key="e-p")
    steps = st.number_input("Training steps", 1, 10000, 4, key="e-steps")
    items = st.number_input("Benchmark items to score", 1, 5000, 20, key="e-items")
    if st.button("Start comparison", key="e-start",
                 help="Starts one background job over the workspace's corpus: distil, build "
                      "the index, train the SFT adapter, then score base, base + RAG and SFT "
                      "on the held-out benchmark. Its progress shows here and in the Task "
                      "centre."):
        try:
            require_corpus(ws)
            if not persp:
                raise ValueError("pick at least one perspective")
            cfg = base_config(name, corpus=str(ws / "corpus"),
                              distill={**distill_settings("composed", "text"),
                                       "perspectives": persp, "kinds": ["mc", "nd"],
                                       "answer_source": "text"},
                              rag=dict(RAG_SETTINGS),
                              train={**TRAIN_SETTINGS, "max_steps": int(steps)},
                              eval=dict(EVAL_SETTINGS),
                              compare={**COMPARE_SETTINGS, "eval_items": int(items)})
            job = start_job(ws, "compare", cfg)
            st.success(f"Started job {job.id}")
        except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
            show_error(e)
    job_panel("compare", "compare")

with st.expander("Evaluate a benchmark of your own (MMLU/ARC-style JSONL, CSV, ours)"):
    st.caption("Upload it as it is: {question, choices, answer} with a letter or a 0-based "
               "index, {question, options, answer}, ARC's layout, or a CSV with option "
               "columns. Other field names: map them below.")
    up = st.file_uploader("Benchmark file", type=["jsonl", "json", "csv", "tsv"],
                          key="b-file")
    c1, c2, c3 = st.columns(3)
    qf = c1.text_input("question field", value="", key="b-q", placeholder="auto")
    cf = c2.text_input("choices field", value="", key="b-c", placeholder="auto")
    af = c3.text_input("answer field", value="", key="b-a", placeholder="auto")
    b_name = st.text_input("Run name", value="my-benchmark", key="b-name")
    b_items = st.number_input("Items to score (0: all)", 0, 100000, 50, key="b-items")
    with_rag = st.selectbox("Retrieval", ["none"] + [r.name for r in runs() if r.has_index],
                            key="b-rag", help="Also score with the index of this run.")
    if st.button("Check and start", key="b-start", disabled=up is None,
                 help="Reads the whole file first (a bad line is named here), then scores "
                      "the chat model on it as a background job."):
        assert up is not None  # the button is disabled without a file
        try:
            mapping = {k: v for k, v in (("question", qf), ("choices", cf), ("answer", af))
                       if v.strip()}
            path = save_benchmark(ws, up.name, up.getvalue())
            n = len(load_benchmark(path, mapping=mapping or None))
            ev = {"benchmark": str(path), "field_map": mapping or None, "conditions": ["none"],
                  "methods": ["loglik"], "max_items": int(b_items) or None}
            if with_rag != "none":
                lay = next(r for r in runs() if r.name == with_rag).layout
                ev.update(conditions=["none", "semantic", "keyword", "hybrid"],
                          index=str(lay.folder("rag")), hit_vs_miss=False)
            job = start_job(ws, "eval", base_config(b_name, eval=ev))
            st.success(f"{n} items read; started job {job.id}")
        except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
            show_error(e)
    job_panel("eval", "eval")

infos = [r for r in runs() if r.has_report or any(r.has_eval.values())]
if not infos:
    st.info("No comparison or evaluation yet.")
    st.stop()
by_name = {r.name: r for r in infos}
picked = st.multiselect("Runs", list(by_name), default=list(by_name)[-1:], key="e-runs")

EVALS = {"eval_base": ("compare", "eval_base", "base model, unseen benchmark"),
         "eval_sft": ("compare", "eval_sft", "SFT model, unseen benchmark"),
         "eval_base_seen": ("compare", "eval_base_seen", "base model, seen benchmark"),
         "eval_sft_seen": ("compare", "eval_sft_seen", "SFT model, seen benchmark"),
         "eval": ("eval", "summary", "evaluation")}
BENCHMARK_OF = {"eval_base_seen": "benchmark_seen", "eval_sft_seen": "benchmark_seen"}
BENCHMARK_WORDS = {
    "unseen": "Questions about sections the model was never trained on: does what it learnt "
              "carry over to new text?",
    "seen": "New questions about facts the training data taught (the questions themselves "
            "were never trained on): did training teach the facts?",
}


def eval_folder(lay, which: str):
    pipe, art, _ = EVALS[which]
    return lay.artifact(pipe, art).parent


def label(k: str | None) -> str:
    """A scoring's name as every table of the page writes it ("cloze, per-char norm. (CF)",
    never the key "cloze_norm")."""
    return SCORING_LABELS.get(k, k) if k else ""


def scoring_cell(acc, degenerate: bool, headline: bool) -> str:
    """An accuracy cell with its marks first ("★ 71.0% [53.4, 83.9]"), so a narrow column
    cuts the interval, never the mark."""
    return ("★ " if headline else "") + ("⚠ " if degenerate else "") + accuracy(acc)


def comparison_table(report, rows, key: str) -> None:
    # every scoring any row has is a column, the same for every row (the headline's star
    # goes in its cell); a row not scored that way has an empty cell, not "None"
    scored = [k for k in SCORINGS if any(k in row.scorings for row in rows)]
    st.dataframe([
        {"configuration": row.name,
         "items": f"{row.n} ({acc.clusters} clusters)"
         if (acc := row.headline_accuracy) and acc.clusters else str(row.n),
         **{label(k): scoring_cell(row.scorings[k], k in row.degenerate, k == row.headline)
            if k in row.scorings else "" for k in scored},
         "headline": label(row.headline) or "none (all degenerate)",
         "degenerate": ", ".join(label(k) for k in row.degenerate) or "-",
         "s/item": round(row.seconds_per_item, 2)} for row in rows],
        hide_index=True, key=key)
    why = [f"{row.name} / {label(k)}: {w}" for row in rows for k, w in row.degenerate.items()]
    st.caption("Accuracy with its Wilson 95% interval (at the effective sample size where "
               "items form clusters: items asked for one sentence share their correct option); "
               "★ the headline scoring, ⚠ degenerate, empty: not scored that way; s/item: "
               "seconds per item. "
               + report.headline_rule
               + (" Degenerate here: " + "; ".join(why) + "." if why else ""))


def pair_scoring(c) -> str:
    return label(c.formulation_a) if c.formulation_a == c.formulation_b else \
        f"{label(c.formulation_a)} / {label(c.formulation_b)}"


def comparisons_view(comparisons, key: str) -> None:
    if not comparisons:
        return
    scorings = {pair_scoring(c) for c in comparisons}
    one = next(iter(scorings)) if len(scorings) == 1 else None  # then said once, above
    st.markdown("**Paired comparisons** (same items" + (f"; scoring: {one})" if one else ")"))
    st.dataframe([{"a": c.a, "b": c.b, **({} if one else {"scoring": pair_scoring(c)}),
                   "accuracy a": percent(c.accuracy_a), "accuracy b": percent(c.accuracy_b),
                   "difference b - a (95% CI)": points_interval(
                       c.difference, c.difference_ci_low, c.difference_ci_high),
                   "only a / only b": f"{c.only_a} / {c.only_b}" + (
                       " (no item changed)" if c.only_a == c.only_b == 0 else ""),
                   "items": f"{c.n} ({c.clusters} clusters)" if c.clusters else str(c.n),
                   "p (Holm)": p_value(c.p_holm),
                   "significant": "yes" if c.significant else "no"}
                  for c in comparisons], hide_index=True, key=key)
    st.caption("Each pair scored on the same items. only a / only b: items only a, or only "
               "b, got right; difference in points with its 95% interval; p (Holm): the "
               "paired test's p-value (exact McNemar; a sign-flip test where items form "
               "clusters), adjusted for the number of pairs (Holm); significant: p (Holm) "
               "under 0.05. The interval (a bootstrap over items) and p (an exact test) are "
               "computed apart: with few items that changed, an interval may reach 0 while "
               "p is 1; \"no item changed\": both got the same items right, as when an "
               "adapter moved no prediction across the answer.")
    sig = [c for c in comparisons if c.significant]
    if sig:
        st.markdown("**Significant differences:** " + "; ".join(
            f"{c.b} vs {c.a}: {points(c.difference)} points (p = {p_value(c.p_holm)})"
            for c in sig))
    else:
        st.markdown("**Significant differences:** none at 5% (Holm-adjusted).")


PAIRED_EVALS = {"unseen": ("eval_base", "eval_sft"), "seen": ("eval_base_seen", "eval_sft_seen")}


def predictions_of(lay, which: str) -> dict[tuple[str, str], tuple]:
    """(condition, item) -> the item's predictions under every scoring, of one evaluation."""
    rows = read_eval_results(eval_folder(lay, which))
    return {(r.condition, r.example_id): tuple(sorted(
        (r.extra.get("predictions") or {"prediction": r.prediction}).items())) for r in rows}


def adapter_changes(lay, bench: str) -> None:
    """How many items the adapter answered differently from the base model, by condition:
    when it changed none, the SFT rows equal the base rows by construction, not by chance."""
    pair = PAIRED_EVALS.get(bench)
    if pair is None or not all(lay.has("compare", w) for w in pair):
        return
    try:
        base, sft = (predictions_of(lay, w) for w in pair)
    except Exception as e:  # noqa: BLE001 - a file a job is still writing
        not_ready("the per-item predictions", e)
        return
    counts: dict[str, list[int]] = {}
    for (cond, item), preds in sft.items():
        if (cond, item) in base:
            c = counts.setdefault(cond, [0, 0])
            c[0] += preds != base[(cond, item)]
            c[1] += 1
    if not counts:
        return
    text = "; ".join(f"{cond}: {changed} of {n}" for cond, (changed, n) in counts.items())
    if not any(changed for changed, _ in counts.values()):
        st.info(f"The adapter changed no prediction ({text} items): SFT picks the same "
                "options as the base model under every scoring, so their accuracies are "
                "equal by construction, and their paired tests can find nothing.")
    else:
        st.caption(f"Items whose prediction the adapter changed (any scoring), by "
                   f"condition: {text}.")


def benchmark_view(rep, bench: str, b, run_name: str, lay=None) -> None:
    """One benchmark of a comparison: what it measures, its table, the oracle bound read
    first, the knowledge-free rules (and the flag when one matches the base model), and the
    paired tests."""
    rows = rep.rows_of(bench)
    st.markdown(f"#### Benchmark `{bench}` · {b.items} items")
    st.caption(BENCHMARK_WORDS.get(bench, b.measures))
    comparison_table(rep, rows, f"table-{run_name}-{bench}")
    base = {r.condition: r.headline_accuracy for r in rows if r.model == "Base"}
    if base.get("none") and base.get("oracle"):
        st.markdown(
            f"Without any passage the base model scores {accuracy(base['none'])}; given the "
            f"passage each question was written from (**oracle**, the best any retriever "
            f"could do) {accuracy(base['oracle'])}. "
            + " ".join(f"{c}: {points(a.value - base['oracle'].value)} points from the "
                       "oracle." for c in ("semantic", "keyword", "hybrid")
                       if (a := base.get(c)) is not None))
    if b.shortcuts:
        st.dataframe([{"rule (no knowledge)": s.description, "accuracy": accuracy(s.accuracy),
                       **{x: s.predictions.get(x, 0) for x in "ABCD"}} for s in b.shortcuts],
                     hide_index=True, key=f"shortcuts-{run_name}-{bench}")
        st.caption("Rules that pick an option from the wording alone. A model has to beat "
                   "them before its accuracy says anything about what it knows.")
    if b.shortcut_flag:
        st.warning(b.shortcut_flag)
    comparisons_view(b.comparisons, f"pairs-{run_name}-{bench}")
    if lay is not None:
        adapter_changes(lay, bench)


def drill_down(info) -> None:
    """One item of one condition: question, options with gold and predictions, context."""
    lay = info.layout
    which = [w for w, have in info.has_eval.items() if have]
    if not which:
        return
    st.markdown("#### Item drill-down")
    c1, c2, c3 = st.columns(3)
    ev = c1.selectbox("Evaluation", which, format_func=lambda w: EVALS[w][2],
                      key=f"ev-{info.name}")
    try:
        rows = read_eval_results(eval_folder(lay, ev))
    except Exception as e:  # noqa: BLE001 - a file a job is still writing
        not_ready("the per-item results", e)
        return
    conds = list(dict.fromkeys(r.condition for r in rows))
    if not conds:
        st.caption("No per-item results.")
        return
    cond = c2.selectbox("Condition", conds, key=f"cond-{info.name}-{ev}")
    sel = [r for r in rows if r.condition == cond]
    i = int(c3.number_input("Item", 0, max(len(sel) - 1, 0), 0, key=f"ex-{info.name}-{ev}"))
    r = sel[i]
    items = {}
    if info.has_benchmark:
        try:
            art = BENCHMARK_OF.get(ev, "benchmark")
            if lay.has("distill", art):
                items = {it.id: it for it in load_benchmark(lay.artifact("distill", art))}
        except Exception as e:  # noqa: BLE001 - a file a job is still writing
            not_ready("the benchmark", e)
    item = items.get(r.example_id)
    preds = dict(r.extra.get("predictions") or {})
    if not preds and r.prediction is not None:
        preds = {"prediction": r.prediction}
    left, right = st.columns(2)
    with left:
        verdict = "✓ correct" if r.correct else "✗ wrong"
        st.markdown(f"`{r.example_id}` · {r.model} · {cond} · gold **{r.gold or '-'}** · "
                    f"headline prediction **{r.prediction or '-'}** ({verdict})")
        if item is not None:
            st.markdown(f"##### {item.question}")
            marks: dict[str, list[str]] = {}
            for k, p in preds.items():
                for letter in (p or ""):
                    marks.setdefault(letter, []).append(label(k))
            st.markdown(options_html(item.options, r.gold, marks), unsafe_allow_html=True)
        else:
            st.caption("The question is not in this run's benchmark.")
        st.dataframe([{"scoring": label(k), "prediction": p or "(none)",
                       "correct": "✓" if r.scores.get(k, float(p == r.gold)) == 1.0 else "✗"}
                      for k, p in preds.items()], hide_index=True,
                     key=f"preds-{info.name}-{ev}")
        if r.extra.get("generation") is not None:
            st.markdown("**Generated answer**")
            st.text(r.extra["generation"] or "(empty)")
        if r.error:
            st.error(r.error)
    with right:
        if r.extra.get("context"):
            st.markdown(f"**Retrieved context ({cond})**")
            st.text(r.extra["context"])
        else:
            sec = sections_of(lay.root).get(item.provenance.section_id) \
                if item is not None and item.provenance else None
            show_section(sec)


for name in picked:
    info = by_name[name]
    lay = info.layout
    st.subheader(info.name)
    if info.report_error:
        st.warning(info.report_error)
    rep = info.report
    if rep is not None:
        st.caption(f"model `{rep.model}` · domain {rep.domain} · chance {percent(rep.chance)}"
                   + (f" · best RAG: {rep.best_rag}" if rep.best_rag else ""))
        for bench, b in rep.benchmarks.items():
            benchmark_view(rep, bench, b, info.name, lay)
        if lay.has("compare", "plot"):
            show_image(lay.artifact("compare", "plot"))
        if rep.retrieval:
            st.markdown("**Retrieval quality** (source section of each question)")
            st.dataframe([{"retriever": k, **{m: round(v, 3) for m, v in vals.items()}}
                          for k, vals in rep.retrieval.items()], hide_index=True,
                         key=f"retrieval-{info.name}")
            st.caption("Does the retriever find the section a question was written from? "
                       "hit@k: share of questions with it in the top k; recall@k: share of "
                       "relevant sections found (one a question, so equal to hit@k); "
                       "ndcg@k: hit discounted by rank; mrr: mean of 1 / its rank.")
    elif info.has_eval.get("eval"):
        try:
            s = read_eval_summary(eval_folder(lay, "eval"))
            scored = [k for k in SCORINGS if any(cs.scoring(k) for cs in s.conditions.values())]
            st.dataframe([{"condition": c, "items": cs.n, **{
                label(k): scoring_cell(f.accuracy, f.degenerate, k == s.headline.formulation)
                if (f := cs.scoring(k)) is not None else "" for k in scored}}
                for c, cs in s.conditions.items()], hide_index=True, key=f"table-{info.name}")
            st.caption("Accuracy with its Wilson 95% interval; ★ the headline scoring, ⚠ "
                       "degenerate, empty: not scored that way.")
            comparisons_view(s.comparisons, f"pairs-{info.name}")
        except Exception as e:  # noqa: BLE001 - a file a job is still writing
            not_ready("the evaluation summary", e)
    drill_down(info)
