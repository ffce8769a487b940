"""Retrieved context for a benchmark condition, as evaluation sees it.

Evaluation does not know about indexes or retrievers: a caller hands it one `ContextProvider`
per RAG condition, and evaluation only asks for formatted context strings. The wording that
puts a context in front of a question belongs here, so every condition is prompted alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from workbench.errors import WorkbenchError


@runtime_checkable
class ContextProvider(Protocol):
    """Formatted context strings for questions, one per question, in order.

    `ranks` asks for the hits at 1-based ranks lo..hi (inclusive); None means the provider's
    usual top `top_k`. The hit-vs-miss check asks for ranks top_k+1..2*top_k."""

    top_k: int

    def __call__(self, questions: Sequence[str], ranks: tuple[int, int] | None = None
                 ) -> list[str]: ...


def with_context(body: str, context: str | None) -> str:
    """The user message with reference passages in front of it (no context: the body)."""
    if not context:
        return body
    return (f"Use the reference passages to answer.\n\nReference passages:\n{context}\n\n"
            f"Question: {body}")


def miss_ranks(provider: ContextProvider) -> tuple[int, int]:
    """The ranks just below the provider's top k (RF-Agent: top 3 vs ranks 4-6)."""
    k = provider.top_k
    return (k + 1, 2 * k)


class OracleContexts:
    """The oracle condition's contexts: each item's own source passage, found through its
    provenance (the section it was distilled from), cut to a window of at most `max_words`
    words around the sentence its correct option quotes (the whole section when that sentence
    is not found). The bound retrieval cannot pass: a retriever that always found the right
    passage would give these contexts. Called, as every provider is, with the items'
    questions in the items' order: items that share a question get their own windows."""

    top_k = 1

    def __init__(self, items, sections, *, max_words: int = 256):
        by_id = {s.id: s for s in sections}
        # items may share a question ("Which statement about <section> is correct?"): the
        # k-th item asking a question gets the k-th context made for that question
        self._by_question: dict[str, list[str]] = {}
        missing = []
        for it in items:
            sec = by_id.get(it.provenance.section_id) if it.provenance else None
            if sec is None:
                missing.append(it.id)
                continue
            gold = it.options["ABCDEFGHIJ".index(it.answer[0])]
            self._by_question.setdefault(it.question, []).append(
                f"[1] {sec.title}\n{_window(sec.text, gold, max_words)}")
        if missing:
            raise WorkbenchError(
                f"the oracle condition needs each item's source section: {len(missing)} "
                f"item(s) have no provenance or a section id not in the sections file (first: "
                f"{missing[0]})")

    def __call__(self, questions: Sequence[str], ranks: tuple[int, int] | None = None
                 ) -> list[str]:
        if ranks is not None:  # there is no "rank below" the source passage
            return ["" for _ in questions]
        seen: dict[str, int] = {}
        out = []
        for q in questions:
            ctxs = self._by_question.get(q) or [""]
            k = seen.get(q, 0)
            seen[q] = k + 1
            out.append(ctxs[min(k, len(ctxs) - 1)])
        return out


def _window(text: str, sentence: str, max_words: int) -> str:
    """At most `max_words` words of `text`, centred on `sentence` where it occurs."""
    words = text.split()
    if len(words) <= max_words:
        return text.strip()
    at = text.find(sentence)
    if at < 0:
        return " ".join(words[:max_words]) + " ..."
    centre = len(text[:at].split()) + len(sentence.split()) // 2
    lo = max(0, min(centre - max_words // 2, len(words) - max_words))
    return (("... " if lo else "") + " ".join(words[lo:lo + max_words])
            + (" ..." if lo + max_words < len(words) else ""))
