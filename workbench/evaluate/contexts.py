"""Retrieved context for a benchmark condition, as evaluation sees it.

Evaluation does not know about indexes or retrievers: a caller hands it one `ContextProvider`
per RAG condition, and evaluation only asks for formatted context strings. The wording that
puts a context in front of a question belongs here, so every condition is prompted alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


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
