"""Canonical text forms: what makes two questions or two programs the same (near-duplicate
removal, the trie's keys)."""

from __future__ import annotations

import re


def normalise_question(text: str) -> str:
    """Lower case, punctuation and articles removed, whitespace collapsed."""
    words = re.sub(r"[^\w.'/-]+", " ", text.casefold()).split()
    return " ".join(w for w in words if w not in ("a", "an", "the"))


def normalise_program(sql: str) -> str:
    """Whitespace collapsed, case folded outside string literals."""
    parts = re.split(r"('(?:[^']|'')*')", sql)
    return "".join(p if p.startswith("'") else " ".join(p.split()).casefold() for p in parts)
