"""Retrieved chunks as prompt context: numbered, with source citations, under a token budget.

RF-Agent's preset is the default: the top 3 chunks of a retriever (hybrid: the top 15 of each
retriever, fused, then the top 3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from workbench.records import RetrievalHit

RF_AGENT_TOP_K = 3
RF_AGENT_HYBRID_CANDIDATES = 15


def token_counter(index) -> Callable[[str], int]:
    """Count tokens with the index's embedder tokenizer when it has one, else words."""
    tok = getattr(getattr(getattr(index, "semantic", None), "embedder", None), "model", None)
    tok = getattr(tok, "tokenizer", None)
    if tok is None:
        return lambda s: len(s.split())
    return lambda s: len(tok.encode(s, add_special_tokens=False))


def cite(hit: RetrievalHit, source: str | None = None) -> str:
    where = " > ".join(hit.heading_path) or hit.doc_id
    return f"{where}" + (f" ({source})" if source else "")


def format_context(hits: Sequence[RetrievalHit], *, max_tokens: int = 768,
                   count_tokens: Callable[[str], int] | None = None,
                   sources: dict[str, str] | None = None) -> str:
    """Blocks like `[1] Reflection and Standing Waves > VSWR\\n<text>`, best first, stopping
    before the budget is exceeded (a block that does not fit whole is cut at a word)."""
    count = count_tokens or (lambda s: len(s.split()))
    blocks, used = [], 0
    for i, h in enumerate(hits, start=1):
        head = f"[{i}] {cite(h, (sources or {}).get(h.doc_id))}\n"
        block = head + h.text.strip()
        n = count(block)
        if used + n > max_tokens:
            room = max_tokens - used - count(head)
            if room > 16:
                words = h.text.split()
                lo, hi = 0, len(words)
                while lo < hi:  # longest prefix that fits
                    mid = (lo + hi + 1) // 2
                    if count(head + " ".join(words[:mid])) <= max_tokens - used:
                        lo = mid
                    else:
                        hi = mid - 1
                if lo:
                    blocks.append(head + " ".join(words[:lo]) + " ...")
            break
        blocks.append(block)
        used += n + 1
    return "\n\n".join(blocks)


def with_context(question: str, context: str) -> str:
    if not context:
        return question
    return (f"Use the reference passages to answer.\n\nReference passages:\n{context}\n\n"
            f"Question: {question}")
