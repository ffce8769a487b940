"""Cross-task reuse of verified grammar paths: question shapes and abstract action keys.

Tasks on one environment repeat their question's shape with other names and values ("How
many Invoice rows have Total greater than 1.98?" and "How many Track rows have UnitPrice
greater than 0.99?"), and the verified slot decisions of one are, with the names swapped, the
decisions of the other. A shape is the question with each stated value replaced by ⟨v0⟩,
⟨v1⟩, ... and each schema name it uses (tables and columns, longest first) by ⟨n0⟩, ⟨n1⟩,
... in order of first use; a move's abstract key is its key with the same replacements. The
prefix trie keeps, per shape, the abstract key paths of verified searches; a later task of
the same shape is seeded with them (`explore.GrammarGenerator.priors`), which answers the
nodes along a seeded path without a model call.

Names the question does not use (a join's other table, say) stay literal in the key, so a
path through them transfers only to tasks that take the same detour.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import lru_cache

from workbench.dataenv.profile import EnvProfile
from workbench.datatasks.grammar import _number, literals


@dataclass(frozen=True)
class Shape:
    """A question's shape and the replacements that made it (text → placeholder)."""

    text: str
    names: tuple[tuple[str, str], ...]
    values: tuple[tuple[str, str], ...]

    def abstract(self, key: str) -> str:
        """A move key (`slot:key`) with this question's values and names replaced by their
        placeholders. Values are replaced only where the grammar puts them: a condition's
        `=value` (as `repr` writes it, also for a number the question wrote otherwise, e.g.
        1.50 → 1.5), a skipped literal, a `values` pair and `k`; never inside a name."""
        slot, _, rest = key.partition(":")
        for text, ph in self.values:
            if slot == "lit" and rest == f"skip:{text}":
                rest = f"skip:{ph}"
            elif slot == "values":
                rest = "|".join(ph if f == text else f for f in rest.split("|"))
            elif slot == "k" and _is_number(text) and rest == str(_number(text)):
                rest = ph
            else:
                for form in _forms(text):
                    rest = re.sub("=" + re.escape(form) + r"(?=,|$)", "=" + ph, rest)
        for name, ph in self.names:
            rest = re.sub(r"(?<![\w⟨])" + re.escape(name) + r"(?![\w⟩])", ph, rest)
        return f"{slot}:{rest}"


def _forms(text: str) -> list[str]:
    """How a condition key may write a literal: repr of the text, and of the number."""
    forms = [repr(text)]
    if _is_number(text):
        forms += [repr(_number(text)), str(_number(text))]
    return list(dict.fromkeys(forms))


def _is_number(s: str) -> bool:
    return re.fullmatch(r"[-+]?\d+(\.\d+)?", s) is not None


def question_shape(question: str, profile: EnvProfile) -> Shape:
    """The question with its values and the schema names it uses abstracted (see above)."""
    text = question
    values = []
    for i, lit in enumerate(literals(question)):
        ph = f"⟨v{i}⟩"
        values.append((lit.text, ph))
        if lit.quoted:
            text = text.replace(f"'{lit.text}'", f"'{ph}'")
        else:
            text = re.sub(r"(?<![\w.])" + re.escape(lit.text) + r"(?![\w.])", ph, text)
    names = sorted({t.name for t in profile.tables} | {c.name for t in profile.tables
                                                     for c in t.columns}, key=len, reverse=True)
    found: list[tuple[int, str]] = []
    masked = text
    for name in names:
        pat = re.compile(r"(?<![\w⟨])" + re.escape(name) + r"(?=s?(?!\w))")
        m = pat.search(masked)
        if m:
            found.append((m.start(), name))
            masked = pat.sub(lambda mm: "\x00" * len(mm.group()), masked)
    found.sort()
    mapping = tuple((name, f"⟨n{i}⟩") for i, (_, name) in enumerate(found))
    for name, ph in sorted(mapping, key=lambda p: len(p[0]), reverse=True):
        text = re.sub(r"(?<![\w⟨])" + re.escape(name) + r"(?=s?(?!\w))", ph, text)
    return Shape(text=text, names=tuple(sorted(mapping, key=lambda p: len(p[0]), reverse=True)),
                 values=tuple(sorted(values, key=lambda p: len(p[0]), reverse=True)))


@lru_cache(maxsize=65536)
def similarity(a: str, b: str) -> float:
    """How alike two shapes are: difflib's ratio over their words (1.0: the same words in the
    same order; "What is the total ⟨n0⟩ of ⟨n1⟩ rows?" vs "... maximum ...": 0.88)."""
    return SequenceMatcher(None, a.split(), b.split(), autojunk=False).ratio()
