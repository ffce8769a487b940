"""The likelihood gate: how likely the teacher finds a question after the text it was written
from. Rules cannot see garbled wording ("What is the names of the files that have been listed
in the list of files?", "... a hunk of gold is the number one?"); a language model reading
the text reads it as improbable: its tokens are ones the model would not have written after
that text.

Score: the mean log-probability per token of " <question>" after "<span text>\\n\\nQuestion:"
(raw text, no chat template), by the verifier's model. The questions written from one span
share its prompt: one request per span, the span run once and every question scored from its
key/value cache (`models.local_scoring`), each score stored in the call cache. A question
whose score is below `distill.gates.min_likelihood` is refused (`unlikely_question`).

`answer_pmi` is the other signal tried (BENCHMARKS.md, "Distillation gates measured on real
manuals"): how much a question raises its reference answer's log-probability over a
content-free question. With a 135M scorer it did not tell the questions a reader keeps from
the rest, so it is no gate; the benchmark computes it for the comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workbench.models.base import ChatModel, ScoreRequest

PROMPT = "{text}\n\nQuestion:"
NEUTRAL_QUESTION = "What does the text say?"


@dataclass(frozen=True)
class Likelihood:
    logprob: float  # the question's tokens, summed
    n_tokens: int

    @property
    def mean(self) -> float:
        return self.logprob / max(self.n_tokens, 1)

    def to_json(self) -> dict:
        return {"mean_logprob": round(self.mean, 4), "tokens": self.n_tokens}


def question_likelihoods(scorer: ChatModel, items: Sequence[tuple[str, str]]
                         ) -> list[Likelihood]:
    """(span text, question) -> each question's likelihood after its text, in order; one
    score request per distinct text."""
    by_text: dict[str, list[int]] = {}
    for i, (text, _) in enumerate(items):
        by_text.setdefault(text, []).append(i)
    requests = [ScoreRequest(PROMPT.format(text=text.strip()),
                             [" " + items[i][1].strip() for i in idx])
                for text, idx in by_text.items()]
    out: list[Likelihood | None] = [None] * len(items)
    for idx, row in zip(by_text.values(), scorer.score(requests) if requests else [],
                        strict=True):
        for i, sc in zip(idx, row, strict=True):
            out[i] = Likelihood(sc.logprob, sc.n_tokens)
    return out  # type: ignore[return-value]


def answer_pmi(scorer: ChatModel, items: Sequence[tuple[str, str]]) -> list[float]:
    """(question, reference answer) -> log p(answer | question) - log p(answer | "What does
    the text say?"), per answer token, in a user/assistant exchange without the text."""
    asked = scorer.score([ScoreRequest([{"role": "user", "content": q}], [a])
                          for q, a in items])
    neutral = scorer.score([ScoreRequest([{"role": "user", "content": NEUTRAL_QUESTION}],
                                         [a for _, a in items])])[0] if items else []
    return [(x[0].logprob - y.logprob) / max(x[0].n_tokens, 1)
            for x, y in zip(asked, neutral, strict=True)]
