"""Chat with what you built: up to three setups side by side (a model, an adapter of the
workspace or an OpenAI-compatible endpoint, each with or without an index). Every answer
streams as it is written; a person marks it good or bad and says what it should have said,
and the workspace keeps that as SFT rows and preference pairs (workbench.chat)."""

import os
import threading
import time
from dataclasses import dataclass, field

import streamlit as st

from workbench.app.common import read_or_none, show_error, workspace
from workbench.app.glossary import show_glossary
from workbench.chat import (
    MAX_SETUPS,
    RETRIEVERS,
    Answer,
    ChatSession,
    ChatSetup,
    rate,
    workspace_choices,
)
from workbench.models import load_model as load

st.title("Chat")
st.caption("Ask once; every setup answers in its own column, as it writes. Rate an answer to "
           "keep it (or your correction) as training data in this workspace's chat folder.")
show_glossary("RAG", "SFT", "adapter")
ws = workspace()
choices = read_or_none("the adapters and indexes of this workspace",
                       lambda: workspace_choices(ws))
adapters = choices.adapters if choices else {}
indexes = choices.indexes if choices else {}
BASE, ENDPOINT = "base model", "OpenAI-compatible endpoint"


def base_model() -> tuple[str, dict]:
    """The app's base model (tests set a scripted one in WB_APP_MODEL)."""
    spec = os.environ.get("WB_APP_MODEL") or "default"
    if spec.startswith("fake"):
        return "fake", {"script": os.environ["WB_APP_MODEL_SCRIPT"]}
    return spec, {}


@st.cache_resource(show_spinner="Loading the model", max_entries=4)
def load_model(spec: str, adapter: str | None, options: tuple):
    """One instance per model + adapter for the whole app (generation is locked inside)."""
    opts = dict(options)
    if adapter:
        opts["adapter"] = adapter
    return load(spec, **opts)


def loader(spec: str, **opts):
    adapter = opts.pop("adapter", None)
    return load_model(spec, adapter, tuple(sorted(opts.items())))


def setup_label(i: int, s: ChatSetup, index: str) -> str:
    """The label of setup `i` on its answers and in the ratings, SFT rows and preference pairs
    it leaves: its number, then the setup's own label (model, adapter, retriever and k) and
    its index's name, or "no retrieval", so two setups of one model never share a label."""
    if s.index is None:
        return f"Setup {i + 1}: {s.label}, no retrieval"
    return f"Setup {i + 1}: {s.label} (index {index.removesuffix(' (index)')})"


top = st.columns(3)
n = top[0].number_input("Setups side by side", 1, MAX_SETUPS, 2 if adapters or indexes else 1,
                        key="c-n")
longest = top[1].number_input("Longest answer (tokens)", 16, 2048, 256, step=16, key="c-max",
                              help="Generation stops here if the model has not ended its "
                                   "answer (about 3 words for every 4 tokens).")
temperature = top[2].slider("Temperature", 0.0, 1.5, 0.0, 0.1, key="c-temp",
                            help="0 always gives the model's most likely answer; higher "
                                 "values vary it from one question to the next.")
setups = []
cols = st.columns(int(n))
for i, col in enumerate(cols):
    with col:
        st.markdown(f"**Setup {i + 1}**")
        kind = st.selectbox("Model", [BASE, *adapters, ENDPOINT], key=f"c-model-{i}",
                            index=min(i, len(adapters)) if i and adapters else 0)
        spec: str | None
        spec, opts = base_model()
        adapter = None
        if kind == ENDPOINT:
            spec = st.text_input("Endpoint", key=f"c-url-{i}",
                                 placeholder="http://127.0.0.1:8000/v1#model-name")
            opts = {}
        elif kind != BASE:  # the adapter's own base model (its manifest says which)
            adapter, spec, opts = str(adapters[kind]), None, {}
        idx = st.selectbox("Retrieval", ["none", *indexes], key=f"c-index-{i}",
                           index=1 if indexes and i == int(n) - 1 and n > 1 else 0)
        retriever, k = "hybrid", 3
        if idx != "none":
            retriever = st.selectbox("Retriever", RETRIEVERS, key=f"c-ret-{i}")
            k = st.number_input("Passages", 1, 20, 3, key=f"c-k-{i}")
        if kind == ENDPOINT and not spec:
            st.caption("Give the endpoint's URL.")
            continue
        try:
            s = ChatSetup(model=spec, adapter=adapter, options=opts, retriever=retriever,
                          model_label="base" if kind == BASE else "",
                          max_tokens=int(longest), temperature=float(temperature),
                          k=int(k), index=str(indexes[idx]) if idx != "none" else None)
            setups.append(s.model_copy(update={"name": setup_label(i, s, idx)}))
        except ValueError as e:
            show_error(e)

key = repr([s.model_dump() for s in setups])
if st.session_state.get("c-key") != key:  # other setups: a new conversation
    st.session_state["c-key"] = key
    st.session_state["c-session"] = ChatSession(setups, loader=loader) if setups else None
session: ChatSession | None = st.session_state["c-session"]
if session is None:
    st.stop()


@dataclass
class Live:
    """The question a run is answering, and what each setup it began has written so far."""
    session: ChatSession
    turn: str
    question: str
    stop: threading.Event = field(default_factory=threading.Event)
    texts: dict[int, str] = field(default_factory=dict)


WAIT_FOR_STOPPED_S = 10.0


def recover_interrupted() -> None:
    """A run that was writing answers was cut short (Stop, or the person left the page).
    Streamlit starts the new run at once while the old one still writes (fastReruns), so the
    old answers are not kept yet: the question and its partial answers vanished. Tell the old
    run to stop, wait for it to keep what it wrote (marked stopped); an answer it has not
    kept in time is kept here from what the page saw of it (the library's, once kept, shows
    instead: `turn_answers`)."""
    live: Live | None = st.session_state.pop("c-live", None)
    if live is None:
        return
    live.stop.set()
    deadline = time.monotonic() + WAIT_FOR_STOPPED_S

    def kept() -> set[int]:
        return {a.setup for a in live.session.answers if a.turn == live.turn}

    while set(live.texts) - kept() and time.monotonic() < deadline:
        time.sleep(0.1)
    for i in sorted(set(live.texts) - kept()):
        live.session.answers.append(Answer(
            turn=live.turn, setup=i, label=live.session.setups[i].label,
            question=live.question, prompt=[], text=live.texts[i], finish="stopped"))


def tracked(gen, live: Live, i: int):
    """`gen`'s pieces, each also added to what the page saw of setup `i`'s answer."""
    for piece in gen:
        live.texts[i] += piece
        yield piece


recover_interrupted()
if st.button("New conversation", key="c-reset"):
    session.reset()
    session.answers.clear()


def show_passages(a) -> None:
    if a.passages:
        with st.expander(f"{len(a.passages)} passages"):
            for p in a.passages:
                st.markdown(f"**[{p.rank}] {p.cite}** · `{p.source}`")
                st.caption(p.text[:800])


def rating(a, n: int) -> None:
    if a.finish == "error":
        st.error(a.error)
        return
    if a.finish == "stopped":
        st.caption(":material/stop_circle: Stopped: the answer is as far as it was written.")
    if not a.text.strip():
        return
    good = st.button("Good", key=f"c-good-{n}", icon=":material/thumb_up:")
    with st.expander("Bad: say what it should have said", icon=":material/thumb_down:"):
        fix = st.text_area("What it should have said (optional)", key=f"c-fix-{n}")
        bad = st.button("Mark bad", key=f"c-bad-{n}")
    if good or bad:
        _rate(a, "good" if good else "bad", None if good else fix)
    mark = st.session_state.setdefault("c-rated", {}).get((a.turn, a.setup))
    if mark:
        st.caption(f"rated {mark}")


def _rate(a, verdict: str, fix: str | None) -> None:
    try:
        files = rate(ws, a, verdict, fix)
    except Exception as e:  # noqa: BLE001 - shown in the page
        show_error(e)
        return
    st.session_state["c-rated"][(a.turn, a.setup)] = verdict
    st.toast(f"Kept: {files.sft} SFT rows, {files.pairs} pairs in {files.folder}")


def turn_answers(answers: list) -> dict[str, dict[int, Answer]]:
    """Each turn's answers by setup; the last kept one of a setup wins (the library's own
    answer over the page's stand-in for it)."""
    turns: dict[str, dict[int, Answer]] = {}
    for a in answers:
        turns.setdefault(a.turn, {})[a.setup] = a
    return turns


for answers in turn_answers(session.answers).values():
    first = next(iter(answers.values()))
    with st.chat_message("user"):
        st.markdown(first.question)
    cols = st.columns(len(session.setups))
    for i, a in sorted(answers.items()):
        with cols[i]:
            st.markdown(f"**{a.label}**")
            st.markdown(a.text or "_(no text)_")
            show_passages(a)
            rating(a, session.answers.index(a))

question = st.chat_input("Ask every setup", key="c-ask")
if question:
    with st.chat_message("user"):
        st.markdown(question)
    # pressing Stop reruns the page: the new run stops this one's writing and shows what it
    # wrote (recover_interrupted)
    st.button("Stop", key="c-stop", icon=":material/stop:")
    cols = st.columns(len(session.setups))
    live = Live(session=session, turn=session.new_turn(), question=question.strip())
    st.session_state["c-live"] = live
    for i, s in enumerate(session.setups):
        with cols[i]:
            st.markdown(f"**{s.label}**")
            live.texts[i] = ""
            gen = session.stream(i, question, turn=live.turn, stop=live.stop)
            pieces = tracked(gen, live, i)
            try:
                st.write_stream(pieces)
            except Exception as e:  # noqa: BLE001 - shown in its column
                show_error(e)
            finally:
                pieces.close()
                gen.close()  # a rerun (Stop, or the person left) ends generation here
    st.session_state.pop("c-live", None)
    st.rerun()
