"""One line for every term of art the app's pages use: the sidebar's Glossary (every page)
and each page's "Terms on this page" expander read it. tests/test_app_flow.py checks that
every term a page's text uses is in that page's list."""

from __future__ import annotations

import streamlit as st

GLOSSARY: dict[str, str] = {
    "QTSA": "A training sample in four parts: Question, Thinking (the reasoning), Solution "
            "and Answer.",
    "MC": "Multiple choice: a question with four options (A-D) and one correct letter; the "
          "benchmark is made of these.",
    "ND": "An open-ended question (nd samples): the answer is written, not picked.",
    "teacher": "The model that writes the training data (the bundled one is a 135M "
               "demonstration model; name a larger one for real data).",
    "perspective": "An angle a question is asked from (concepts, analysis, design, ...): one "
                   "question per section and perspective.",
    "verifier": "The model answering each MC item again from its text; an item whose answer "
                "is not the keyed one is flagged or rejected.",
    "RAG": "Retrieval-augmented generation: passages found in an index of the corpus are put "
           "in the prompt.",
    "BM25": "Keyword retrieval: passages ranked by the rare words they share with the query.",
    "hit@k": "Retrieval: the share of questions whose source section is among the top k "
             "passages.",
    "recall@k": "Retrieval: the share of relevant sections found in the top k (one per "
                "question here, so equal to hit@k).",
    "MRR": "Mean reciprocal rank: the mean of 1 / the rank of the source section (1 when it "
           "is always first).",
    "nDCG": "Normalised discounted cumulative gain: hits counted less the lower they rank "
            "(1: always first).",
    "oracle": "The passage a question was written from, given to the model: the best any "
              "retriever could do.",
    "SFT": "Supervised fine-tuning: training on questions with their written answers.",
    "DPO": "Direct preference optimisation: training on pairs of a preferred and a rejected "
           "answer to one prompt.",
    "LoRA": "Low-rank adaptation: small matrices trained beside the frozen model; the result "
            "(an adapter) is a few MB.",
    "adapter": "The LoRA weights a training run wrote, loaded on top of its base model.",
    "MCF": "Multiple-choice formulation (letter scoring): the model sees every option and the "
           "likeliest letter A-D is its answer.",
    "CF": "Cloze formulation: each option's own text is scored as the answer and the "
          "likeliest option wins.",
    "per-char norm.": "Cloze scoring divided by each option's length in characters, so a "
                      "long option is not penalised for its length.",
    "headline": "The scoring a table reads first for each configuration (★); the rule that "
                "picks it is stated under the table.",
    "degenerate": "A scoring that gives nearly the same letter for every item (⚠): its "
                  "accuracy says nothing about what the model knows.",
    "Wilson": "A 95% confidence interval for an accuracy that stays sound with few items.",
    "McNemar": "The exact paired test: does one model get right more of the items the other "
               "gets wrong than the reverse?",
    "Holm": "An adjustment of p-values when several pairs are tested at once, so the chance "
            "of any false finding stays under 5%.",
    "bootstrap": "An interval from resampling the items many times and recomputing the "
                 "figure.",
    "kappa": "Cohen's kappa: agreement between two raters beyond what chance gives (0: "
             "chance, 1: perfect).",
    "rubric": "The criteria an open answer is judged by, item by item (met or not met).",
    "guard": "A limit a candidate model must stay within (a subset's drop, answer length, "
             "...) before it may be kept.",
    "retention": "Items of another domain that must not get worse while this one is trained.",
    "FedAvg": "Federated averaging: each site trains on its own data and only the weight "
              "updates are averaged.",
    "FFA-LoRA": "Federated LoRA with the A matrices frozen and only B trained, so averaging "
                "the sites' updates is exact.",
    "SuperNode": "Flower's process at one site of a real federated deployment.",
    "canaries": "Planted secrets in a site's data: one showing up elsewhere means data "
                "leaked.",
    "MCTS": "Monte Carlo tree search: tries steps, scores where they lead, and expands the "
            "most promising ones.",
    "prior": "How likely the search thinks each next step is before trying it (from the "
             "model, uniform, or chosen by hand).",
    "ICL": "In-context learning: solved examples put in the prompt instead of training.",
    "KGV": "Knowledge-graph fact verification: an agent checks a claim against a graph of "
           "facts and cited passages.",
    "GGUF": "llama.cpp's single-file model format.",
    "ETA": "Estimated time left, from the job's rate so far.",
}


def show_glossary(*terms: str) -> None:
    """A collapsed "Terms on this page" expander: one line for each of `terms`."""
    with st.expander("Terms on this page", icon=":material/menu_book:"):
        st.markdown("\n".join(f"- **{t}**: {GLOSSARY[t]}" for t in terms))


def sidebar_glossary() -> None:
    """Every term, in the sidebar of every page."""
    with st.sidebar.expander("Glossary", icon=":material/menu_book:"):
        st.markdown("\n".join(f"- **{t}**: {d}" for t, d in GLOSSARY.items()))
