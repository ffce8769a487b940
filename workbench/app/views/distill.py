import streamlit as st

from workbench.app.common import (
    base_config,
    distill_settings,
    job_panel,
    not_ready,
    options_html,
    pick_run,
    rate_decisions,
    require_corpus,
    runs,
    sections_of,
    show_error,
    show_section,
    workspace,
)
from workbench.app.glossary import show_glossary
from workbench.distill.verifier_check import verifier_check
from workbench.domain_packs import available_packs, load_pack
from workbench.errors import WorkbenchError
from workbench.jobs import start_job

FLAGS = {"verifier_disagrees": "a second reading by the model picked another option; "
                               "check the gold answer",
         "no_rationale": "a benchmark item (scored, never trained on), so no thinking was "
                         "written",
         "rewrote_references": "numbered figure or equation references were rewritten",
         "stripped_prefix": "an echo of the instructions was cut from the question"}

VERDICT_FLAGS = {"verifier_disagrees"}  # the verifier's verdict, which a rater must not see


def verifier_check_of(run):
    """(the run's verifier check, None) or (None, the error that says why there is none)."""
    try:
        return verifier_check(run), None
    except Exception as e:  # noqa: BLE001 - said in the page, never a traceback
        return None, e


def verdict_hidden(s, vc) -> bool:
    """Whether the sample browser hides the verifier's verdict on sample `s`: an item the
    verifier decided that no one has rated yet, while the check has items left to rate (a
    skip brings in a replacement from outside the current sample, so any unrated item may
    still be asked). Hidden too when the check cannot be read now."""
    if s.kind != "mc" or not s.provenance.models.get("verifier"):
        return False  # the verifier never saw it: there is no verdict to hide
    if vc is None:
        return True  # unreadable now (a job still writing): hide rather than guess
    return vc.check.next is not None and s.id not in vc.check.rated


st.title("Distill QTSA data")
st.caption("A teacher model reads each section of the corpus and writes training samples in "
           "four parts: **Q**uestion, **T**hinking (its reasoning), **S**olution and "
           "**A**nswer. Sections held out of training become a multiple-choice benchmark. "
           "The form's button runs it as a background job over the workspace's corpus (its "
           "progress shows below and in the Task centre); review the samples when it ends.")
show_glossary("QTSA", "MC", "ND", "teacher", "perspective", "verifier", "kappa")
ws = workspace()
# no form: a form's fields are lost when its page is left unsubmitted (they are kept for
# the session: common.keep_fields), and the perspectives follow the pack as it is picked
name = st.text_input("Run name", value="distill", key="d-name")
pack = st.selectbox("Domain pack", available_packs(), index=available_packs().index("rf")
                    if "rf" in available_packs() else 0, key="d-pack")
persp = load_pack(pack).perspectives
perspectives = st.multiselect("Perspectives", [p.id for p in persp],
                              default=[p.id for p in persp], key=f"d-persp-{pack}",
                              help="The angles questions are asked from, one question "
                                   "per section and perspective: " + "; ".join(
                                       f"{p.id}: {p.name}" for p in persp) + ".")
kinds = st.multiselect("Sample kinds", ["mc", "nd"], default=["mc", "nd"], key="d-kinds",
                       help="mc: multiple choice, four options and a letter answer (the "
                            "benchmark is made of these); nd: an open-ended question with "
                            "a written answer.")
teacher = st.text_input("Teacher model (bundled 'default', a folder, or an "
                        "OpenAI-compatible URL#model)", value="default", key="d-model")
mode = st.radio("Mode", ["composed", "single"], horizontal=True, key="d-mode",
                help="composed: one easy step per call (small models); single: "
                     "RF-Agent's writer + answerer (capable teachers).")
answers = st.radio("Answers (composed mode)", ["text", "model"], horizontal=True,
                   key="d-answers", help="text: a sentence of the document is the answer "
                                         "and the model writes its question (best for "
                                         "small models); model: the model answers too.")
max_sections = st.number_input("Max sections (0 = all)", 0, 10000, 0, key="d-max",
                               help="Distil only the first sections: a quick trial run.")
# no help= here: a button with help renders twice, and tests/test_e2e_browser.py finds
# this one by its text
go = st.button("Start distillation", key="d-start", type="primary")
if go:
    try:
        require_corpus(ws)
        if not perspectives or not kinds:
            raise WorkbenchError("pick at least one perspective and one sample kind")
        cfg = base_config(name, corpus=str(ws / "corpus"), domain=pack, distill={
            **distill_settings(mode, answers), "perspectives": perspectives, "kinds": kinds,
            "mode": mode, "answer_source": answers, "max_sections": max_sections or None})
        if teacher != "default":
            cfg["models"]["chat"] = {"spec": teacher}
        job = start_job(ws, "distill", cfg)
        st.success(f"Started job {job.id}")
    except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
        show_error(e)
job_panel("distill", "distill")

st.subheader("Samples")
done = [r for r in runs() if r.has_samples]
if not done:
    st.caption("No finished distillation yet.")
else:
    from workbench.distill.api import (
        export_run,
        load_samples,
        read_report,
        read_review,
        review_sample,
    )

    info = pick_run("Run", done, "d-run")
    run = info.path
    dist = info.layout.folder("distill")
    try:
        report, md = read_report(run)
        a = report.accepted.model_dump()
        st.markdown(f"**{a['total']} accepted** ({a['mc']} mc, {a['nd']} nd) · rejects: "
                    + (", ".join(f"{k} {v}" for k, v in report.rejects.items()) or "none"))
        st.caption("mc: multiple choice · nd: open-ended · rejects: questions the quality "
                   "gates dropped, by reason (the Distillation report below explains each).")
        with st.expander("Distillation report"):
            st.markdown(md)
        samples = load_samples(run, reviewed=False)
        review = read_review(dist)
        sections = sections_of(run)
    except Exception as e:  # noqa: BLE001 - a file a job is still writing
        not_ready("the samples of this run", e)
        st.stop()
    vc, vc_error = verifier_check_of(run)
    if samples:
        i = st.number_input("Sample", 0, len(samples) - 1, 0, key="d-sample",
                            help=f"{len(samples)} samples, numbered from 0.")
        s = samples[int(i)]
        left, right = st.columns(2)
        with left:
            blind = verdict_hidden(s, vc)
            flags = [f for f in s.flags if not (blind and f in VERDICT_FLAGS)]
            st.markdown(f"**{s.kind.upper()}** · {s.provenance.perspective} · difficulty "
                        f"{s.difficulty} · review: "
                        f"{review.get(s.id, {}).get('action', 'not yet')}"
                        + (f" · flags: {', '.join(flags)}" if flags else ""))
            if known := [f"{f}: {FLAGS[f]}" for f in flags if f in FLAGS]:
                st.caption("; ".join(known))
            if blind:  # said of every such item, flagged or not: the note itself tells nothing
                st.caption(":material/visibility_off: The verifier's verdict on this item is "
                           "hidden until it is rated under Check the verifier below, so the "
                           "rating is not swayed by it.")
            st.markdown(f"#### {s.question}")
            if s.options:
                st.markdown(options_html(s.options, s.answer), unsafe_allow_html=True)
            st.markdown(f"**Answer:** {s.answer}")
            with st.expander("Thinking", expanded=True):
                st.write(s.thinking or "_(none written)_")
            st.markdown("**Solution**")
            st.write(s.solution)
            with st.expander("Edit"):
                q = st.text_area("Question", s.question, key=f"q-{s.id}")
                sol = st.text_area("Solution", s.solution, key=f"s-{s.id}")
            b1, b2, b3 = st.columns(3)
            try:
                if b1.button("Accept", key=f"acc-{s.id}",
                             help="Mark the sample checked: it stays in the export."):
                    review_sample(run, s.id, "accept")
                    st.rerun()
                if b2.button("Reject", key=f"rej-{s.id}",
                             help="Leave the sample out of the exported training set."):
                    review_sample(run, s.id, "reject")
                    st.rerun()
                if b3.button("Save edit", key=f"edit-{s.id}",
                             help="Keep the question and solution as changed under Edit: "
                                  "the export uses them."):
                    review_sample(run, s.id, "edit", {"question": q, "solution": sol})
                    st.rerun()
            except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
                show_error(e)
        with right:
            show_section(sections.get(s.provenance.section_id))
    st.markdown("**Export the reviewed samples**")
    fmt = st.selectbox("Export format", ["messages", "sharegpt", "alpaca"], key="d-fmt",
                       help="messages: chat rows with user and assistant turns (what the "
                            "Train page reads); sharegpt: ShareGPT conversations; alpaca: "
                            "instruction / output rows.")
    style = st.selectbox("Style", ["instruct", "thinking"], key="d-style",
                         help="instruct: the thinking, solution and answer in one reply; "
                              "thinking: the thinking kept apart as the reply's reasoning, "
                              "for models with a thinking mode.")
    if st.button("Export training set", key="d-export",
                 help="Write the training samples (rejections left out, edits applied) to a "
                      "JSONL file in the run's distill folder, and offer it for download."):
        out = dist / f"export.{style}.{fmt}.jsonl"
        try:
            n = export_run(run, out, fmt=fmt, style=style)
            data = out.read_bytes()
        except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
            show_error(e)
        else:
            st.success(f"Wrote {n} examples to {out}")
            st.download_button("Download", data, file_name=out.name, key="d-dl")

    # --- the verifier checked against a person
    st.subheader("Check the verifier")
    st.caption("The verifier answers each multiple-choice item from its text and rejects (or "
               "flags) the ones whose answer is not the keyed one. Rate a seeded sample of its "
               "decisions (half it accepted where there are enough) without seeing its "
               "verdict: Cohen's kappa between the verifier and you, with its 95% interval, "
               "says how far its accept/reject can be trusted.")
    from workbench.distill.verifier_check import QUESTION, WHAT
    from workbench.errors import DataError

    if isinstance(vc_error, WorkbenchError) and not isinstance(vc_error, DataError):
        # the verifier was off, or decided nothing that can be shown
        st.caption(f"Nothing to check: {str(vc_error).splitlines()[0]}")
    elif vc_error is not None:  # a file a job is still writing, or a bad line (named)
        not_ready("the verifier's decisions", vc_error)
    else:
        st.caption(f"Verifier {vc.decisions.verifier}: the run keeps "
                   f"{len(vc.decisions.items)} of its {vc.decisions.checked} decisions.")
        rate_decisions("d-vc", vc.check, vc.reading,
                       lambda key, verdict, by: vc.decisions.rate(key, verdict, by=by),
                       question=QUESTION, machine=WHAT.removeprefix("the "),
                       answers=("Correct", "Not correct"), verdicts=("correct", "not correct"))
