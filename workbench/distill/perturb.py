"""Distractors that are wrong about the text: perturbed copies of the answer sentence.

Composed mode with answers from the text used to take an item's distractors from sibling
sentences of the same section: every option was then a *true* sentence, and a rule with no
knowledge at all (pick the option sharing most words with the question) solved the benchmark.
Here each distractor is the answer sentence itself with one or two facts changed, so all
four options read alike and only one of them says what the text says:

- a number changed (0.2 -> 0.4, 50 -> 100), its unit kept;
- a word swapped for its opposite (higher/lower, series/parallel, inductive/capacitive);
- a technical term swapped for another term of the same document with the same four-letter
  ending (capacitance -> inductance, amplifier -> modifier), the nearest thing to "a term of
  the same kind" that needs no model.

Two changes (sites) per sentence make a 2 x 2 design: the answer keeps both, one distractor
changes the first, one the second, one both. Every option then differs from two others by
one change and from the third by two, so "pick the option most like the others" (the weak
spot of one-change distractors, where the answer is the centre of a star) finds nothing; no
changed word occurs in the question, so word overlap with the question is equal for all four.
A distractor that occurs in the section (a change that happens to be true) is refused.
"""

from __future__ import annotations

import random
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

# word pairs whose swap turns a statement false (either direction); domain-neutral first,
# then the electrical terms the bundled packs' texts use most
OPPOSITES: tuple[tuple[str, str], ...] = (
    ("increase", "decrease"), ("increases", "decreases"), ("increasing", "decreasing"),
    ("increased", "decreased"), ("higher", "lower"), ("high", "low"), ("larger", "smaller"),
    ("large", "small"), ("more", "less"), ("maximum", "minimum"), ("above", "below"),
    ("rises", "falls"), ("rise", "fall"), ("wider", "narrower"), ("longer", "shorter"),
    ("before", "after"), ("always", "never"), ("inner", "outer"), ("upper", "lower"),
    ("positive", "negative"), ("forward", "backward"), ("stable", "unstable"),
    ("linear", "nonlinear"), ("first", "second"), ("faster", "slower"), ("strong", "weak"),
    ("stronger", "weaker"), ("better", "worse"), ("easier", "harder"), ("early", "late"),
    ("input", "output"), ("series", "parallel"), ("inductive", "capacitive"),
    ("inductance", "capacitance"), ("inductor", "capacitor"), ("inductors", "capacitors"),
    ("voltage", "current"), ("lossless", "lossy"), ("real", "imaginary"),
    ("narrowband", "wideband"), ("transmitter", "receiver"), ("open", "short"),
    ("odd", "even"), ("primary", "secondary"), ("analog", "digital"),
    ("amplitude", "phase"), ("reflected", "transmitted"), ("gain", "loss"),
    ("halves", "doubles"),
)
_OPPOSITE = {a: b for a, b in OPPOSITES} | {b: a for a, b in OPPOSITES}
# fixed phrases whose word is not a quantity: "no longer" -> "no shorter" is not English, and a
# distractor that reads wrong gives itself away without any knowledge
_IDIOMS = re.compile(r"\b(?:no|any)\s+longer\b|\bat\s+(?:least|most|first|last)\b"
                     r"|\bmore\s+or\s+less\b|\b(?:first|second)\s+of\s+all\b"
                     r"|\bin\s+(?:short|real|general)\b|\bopen\s+(?:source|question)\b"
                     r"|\bhigh\s+level\b|\bshort\s+(?:term|answer)\b", re.I)
# word endings of verb forms and adverbs: a term swap is for nouns ("varying" -> "applying"
# turns a sentence into nonsense, not into a false statement)
_NOT_A_TERM = ("ing", "ed", "ly")

_NUMBER = re.compile(r"(?<![\w.\-−^/])(\d+(?:\.\d+)?)(?![\w.]*\d)(?!\w)")
_WORD = re.compile(r"[A-Za-z][a-z]+(?:-[a-z]+)?")
_COMMON = frozenset("""
about above after again against along also although among another because been before being
below between both cannot could does doing down during each either every from further have
having here into itself just made make makes many more most much must near only other others
over same should since some such than that their them then there these they this those
through under until used uses using very were what when where whether which while whose
will with within without would your shown given often usually typically called known
""".split())


@dataclass(frozen=True)
class Site:
    """One place in the sentence that can be changed: characters [start, end) become `new`."""

    start: int
    end: int
    new: str
    kind: str  # "number" | "opposite" | "term"


def _case_like(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    return word[:1].upper() + word[1:] if like[:1].isupper() else word


def _word_site(sentence: str, m: re.Match, new: str, kind: str) -> Site:
    """A word's change, with the article in front of it made to agree ("a short" ->
    "an open"): a wrong article would tell the distractor apart without any knowledge."""
    art = re.search(r"\b(an?|An?)\s+$", sentence[:m.start()])
    if not art:
        return Site(m.start(), m.end(), new, kind)
    a = "an" if new[:1].lower() in "aeiou" else "a"
    a = a.capitalize() if art.group(1)[0].isupper() else a
    return Site(art.start(1), m.end(), f"{a}{sentence[art.end(1):m.start()]}{new}", kind)


def _other_number(text: str, rng: random.Random, avoid: AbstractSet[str] = frozenset()
                  ) -> str | None:
    """A different value of the same form: integers stay integers, decimals keep their
    number of places; never the same value, never negative, never a value in `avoid` (a
    number the sentence already holds: "a 100 ohm load to a 100 ohm line" gives itself
    away)."""
    if "." in text:
        places = len(text.split(".")[1])
        v = float(text)
        cands = {f"{v * f:.{places}f}" for f in (2, 0.5, 3, 10, 0.1) if v * f > 0}
    else:
        v = int(text)
        if len(text) > 1 and text.startswith("0"):
            return None  # a code or a zero-padded label, not a quantity
        if 1900 <= v <= 2100:
            return None  # a year
        cands = {str(v * f) for f in (2, 3, 10)} | ({str(v // 2)} if v >= 4 else set())
        cands |= {str(v + 1)} if v <= 3 else set()
    kept = sorted(c for c in cands if c != text and float(c) != float(text)
                  and float(c) > 0 and c not in avoid)
    return rng.choice(kept) if kept else None


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def sites(sentence: str, question: str, vocabulary: list[str], rng: random.Random
          ) -> list[Site]:
    """Every change of `sentence` this module can make, in order of strength (numbers,
    opposites, then terms); none touches a word of `question`. `vocabulary`: the terms to
    swap in (the section's and document's words, nearest first)."""
    asked = _words(question) | {m.group(1) for m in _NUMBER.finditer(question)}
    out: list[Site] = []
    present = {m.group(1) for m in _NUMBER.finditer(sentence)}
    for m in _NUMBER.finditer(sentence):
        new = _other_number(m.group(1), rng, avoid=present)
        if new and m.group(1) not in asked and new not in asked:
            out.append(Site(m.start(1), m.end(1), new, "number"))
    terms = []
    fixed = [(i.start(), i.end()) for i in _IDIOMS.finditer(sentence)]
    for m in _WORD.finditer(sentence):
        w = m.group(0)
        low = w.lower()
        if low in asked or any(a <= m.start() < b for a, b in fixed):
            continue
        if low in _OPPOSITE:
            new = _OPPOSITE[low]
            # "voltage and current" -> "current and current" would give itself away
            if new not in asked and new not in _words(sentence):
                out.append(_word_site(sentence, m, _case_like(new, w), "opposite"))
            continue
        if len(low) < 6 or low in _COMMON or "-" in low or low.endswith(_NOT_A_TERM):
            continue
        have = _words(sentence)
        near = [c for c in vocabulary
                if c[-4:] == low[-4:] and abs(len(c) - len(low)) <= 4 and c not in have
                and c not in asked][:3]
        if near:
            terms.append(_word_site(sentence, m, _case_like(rng.choice(near), w), "term"))
    rng.shuffle(terms)
    return out + terms


def _apply(sentence: str, changes: list[Site]) -> str:
    for s in sorted(changes, key=lambda s: -s.start):
        sentence = sentence[:s.start] + s.new + sentence[s.end:]
    return sentence


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


def factorial_options(sentence: str, question: str, section_text: str, vocabulary: list[str],
                      seed: str) -> list[str] | None:
    """[the sentence, change 1, change 2, both changes] for the strongest two changes whose
    results all read false against `section_text`; None when the sentence has fewer than
    two such changes (the item is then dropped, never padded with a true sentence)."""
    rng = random.Random(seed)
    cands = sites(sentence, question, vocabulary, rng)
    section = _norm(section_text)
    for i, a in enumerate(cands):
        for b in cands[i + 1:]:
            if a.end > b.start and b.end > a.start:  # overlapping changes
                continue
            opts = [sentence, _apply(sentence, [a]), _apply(sentence, [b]),
                    _apply(sentence, [a, b])]
            if len({_norm(o) for o in opts}) == 4 and not any(
                    _norm(o) in section for o in opts[1:]):
                return opts
    return None


def vocabulary(*texts: str) -> list[str]:
    """Candidate terms to swap in, from the nearest text first: words of six letters or more,
    each once, in order of first appearance."""
    seen: dict[str, None] = {}
    for t in texts:
        for w in _WORD.findall(t):
            low = w.lower()
            if len(low) >= 6 and low not in _COMMON and "-" not in low \
                    and not low.endswith(_NOT_A_TERM):
                seen.setdefault(low, None)
    return list(seen)
