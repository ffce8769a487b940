"""Quality gates: rules a reader can check by hand, run on every question that survived the
parsers, before the verifier.

A weak teacher writes questions that parse and still should not be trained on: a question
about a program its section never mentions, a term from another field, an echoed "Q: Q:",
a statement with a question mark added. Each gate has a name, a one-sentence rule (the report
prints it) and, per question, a verdict: pass, strip (echoed prefixes removed, the question
kept) or reject with a reason and the words that decided it. A question is removed by the
first gate it fails; every rule gate still judges every question, so `gates.jsonl` holds each
question's verdict from each rule gate. The last gate, `likelihood`, is no rule: the teacher
scores the questions the rules kept (`workbench.distill.likelihood`; its score is in
`gates.jsonl` too).

What a question is checked against (its "section"): the text of the section it was written
from and the section's heading path. Names must occur there: an answer the teacher wrote
cannot vouch for a name the text never uses. Content words may also occur in the reference
answer (in composed mode a sentence of the text; else the gold option or the written answer)
and in the words of the perspective's name ("fundamental concepts", ...), which the writer
was asked about. Words compare by their Snowball English stem ("differences" = "differ").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

GATES = ("echo_prefix", "interrogative", "self_contained", "broken_phrases", "named_entities",
         "content_words", "foreign_words", "likelihood")
RULE_GATES = GATES[:-1]  # `check` runs these; likelihood scores with a model (pipeline)

RULES = {
    "echo_prefix": "Leading 'Q:' / 'Question:' / 'Question 2:' / 'Here is a question:' / "
                   "'The correct question is:' / 'My question is:' markers (repeated or not) "
                   "are stripped; a question that still holds a "
                   "marker ('Q:', 'A:', 'Answer:', 'Fact:', 'Text:', 'Options:') or an echo of "
                   "the prompt is refused.",
    "interrogative": "The question must ask: it starts with a question word (what, which, who, "
                     "when, where, why, how...), an auxiliary verb (is, does, can, should...) "
                     "or an exam verb (explain, describe, name...), possibly after a "
                     "preposition ('In which') or an opening clause ending in a comma "
                     "('For a 50-ohm line, what ...'), or ends with a tag ('..., isn't it?'). "
                     "Otherwise it is a statement with a question mark. A sentence cut off "
                     "before its '?' (ending in ',', '...', 'and', 'the', ..., or a clause "
                     "without its complement: '... if the second line is?') is refused too.",
    "self_contained": "The question points at nothing the reader cannot see: no 'this', "
                      "'these', 'those', 'the above', 'aforementioned', 'the following', "
                      "'the given', 'the former/latter' or 'which one' (without 'of ...') "
                      "outside quotes.",
    "broken_phrases": "No broken wording: a word or a phrase of up to three words written "
                      "twice in a row ('patch patch'), a word spelt out letter by letter "
                      "('i n s t a l l'), a content word used three times or more, or a full "
                      "stop inside the question followed by a lower-case word ('the "
                      "Version. field').",
    "named_entities": "Every name in the question occurs in its section text or headings "
                      "(case-insensitive): capitalised words after the first word (each word "
                      "of a multi-word name), acronyms, CamelCase names, code-like tokens "
                      "(options such as --unified, paths, names with digits or dots), quoted "
                      "terms, and numbers of two digits or more or with a unit.",
    "content_words": "At least {min_share:.0%} of the question's content words (not stopwords "
                     "or generic question words, 3+ letters) occur, by stem, in its section, "
                     "its reference answer or its perspective's name.",
    "foreign_words": "At most {max_foreign} content word(s) of {min_letters}+ letters that "
                     "the question's whole document, its reference answer and its "
                     "perspective's name never use (by stem): a question in another field's "
                     "terms (shorter words are mostly everyday English).",
    "likelihood": "The teacher reads the question as likely after the text it was written "
                  "from: its mean token log-probability after '<text>\\n\\nQuestion:' is at "
                  "least {min_likelihood:g} (garbled wording scores lower). Scored only for "
                  "the questions every rule kept.",
}

REASONS = {  # the reject reason a gate gives a task (the report's `rejects` counts them)
    "echo_prefix": "echoed_marker",
    "interrogative": "statement_with_question_mark",
    "self_contained": "points_at_unseen_context",
    "broken_phrases": "broken_phrase",
    "named_entities": "absent_name",
    "content_words": "few_content_words_in_section",
    "foreign_words": "foreign_words",
    "likelihood": "unlikely_question",
}

# function words, and words any question uses whatever its subject
STOPWORDS = frozenset("""
a about above across after again against all almost along also although always am among an and
another any anyone anything are around as at away be because been before being below between
both but by can cannot could did do does doing done down during each either else enough even
ever every few for from further had has have having he her here hers him his how however i if
in into is it its itself just least less like many may me might more most much must my neither
never no nor not now of off often on once one only onto or other others otherwise our out over
own per perhaps rather same several shall she should since so some such than that the their
them themselves then there therefore these they this those though through thus to together too
toward towards under unless until up upon us very via was we were what whatever when whenever
where whereas wherever whether which while who whoever whom whose why will with within without
would yet you your yours zero two three four five six seven eight nine ten hundred thousand
behind beside beneath inside outside near past throughout despite except like unlike amid
""".split()) | frozenset("""
ability able accomplish according achieve act action actual actually addition additional
advantage advantages affect affected allow allowed allows answer answers apply approach
appropriate area aspect aspects avoid based basic basis behave behavior behaviour benefit
benefits best better case cases cause caused causes certain change changes characteristic
characteristics choose chosen common commonly compare compared comparison concept concepts
condition conditions consequence consider considered contain contains context correct correctly
could define defined definition definitions describe described description determine determined
difference differences different differently disadvantage does done drawback drawbacks during
effect effects else ensure example examples exist exists explain explained fact factor factors
feature features first following follows function functions general generally give given goal
good happen happens help helps how ideal identify implication implications important importance
include included includes including instead involve involved issue issues key kind kinds know
known lead leads limit limitation limitations limits main mainly make makes matter meaning
means mechanism method methods most name named nature necessary need needed needs new number
occur occurs order overall part particular perform performed possible potential practice
prevent primary principle principles problem problems process processes property properties
provide provided provides purpose purposes question questions reason reasons recommended
regarding related relate relates relation relationship relevant require required requires
result results role roles second significance significant similar situation situations specific
statement statements step steps suggest suitable take taken term terms third thing things true
false type types typical typically understand usage use used useful uses using usually value
various way ways well work works affects belong belongs bad calculate complex consist consists
contribute contributes decide decrease depend dependent depends effective efficient exactly
handle handled handles impact improve increase indicate indicates influence influences likely
measure mention mentioned normal obtain operate possible prefer proper reduce refer refers
represent represents select special specified specify simple support supported supports
unlikely usual valid wrong
""".split())

QUESTION_WORDS = frozenset("what which who whom whose when where why how".split())
AUXILIARIES = frozenset("""
is are was were am be do does did can could should would will shall may might must has have had
isn't aren't wasn't weren't don't doesn't didn't can't couldn't shouldn't wouldn't won't hasn't
haven't hadn't
""".split())
EXAM_VERBS = frozenset("""
name list explain describe give state define compare identify calculate compute determine
estimate find derive show outline summarize summarise discuss suggest distinguish contrast
evaluate predict classify justify interpret illustrate demonstrate
""".split())
PREPOSITIONS = frozenset("""
in on at for to by from with under of over during after before between into within without
through across against among beyond upon according
""".split())
SUBORDINATORS = frozenset("when where if while since because although though after before "
                          "unless once as given assuming suppose supposing".split())

_LEAD = re.compile(
    r"^\s*(?:[-*•]\s*|\d+[.)]\s*)?(?:\*\*)?(?:q|question(?:\s*\d+)?|ask|query|exam question|"
    r"new question|generated question|here(?:'s| is) (?:a|one|the|my|your) question|"
    r"(?:a|one) question|(?:the |my |your )?(?:correct |right |final |new |revised |rewritten )?"
    r"question (?:is|would be|could be)|(?:sure|okay|ok)[!,.]? here(?:'s| is) (?:a|the|my) "
    r"question)(?:\*\*)?\s*[:.)\-–]\s*(?:\*\*)?\s*", re.I)
_MARKER = re.compile(r"(?:^|(?<=[\s(\"'“]))(?:q|a|answer|question|fact|text|options?|correct"
                     r"(?: answer| option)?|solution|explanation)\s*:", re.I)
_PROMPT_ECHO = re.compile(r"\b(?:write (?:one|a) (?:multiple-choice |open-ended )?question|"
                          r"reply with the question|that this (?:fact|text) answers|"
                          r"start the question with)\b", re.I)
_TAG = re.compile(r",\s*(?:\w+n['’]t|is|are|does|do|did|can|will|would|should|right)"
                  r"(?:\s+(?:it|they|he|she|there|this|that|you|we))?\s*\?$", re.I)
_WORD = re.compile(r"[A-Za-z]+")
_CONTRACTION = re.compile(r"n?['’](?:s|t|re|ll|ve|d|m)\b", re.I)

UNITS = ("%", "db", "dbm", "dbi", "hz", "khz", "mhz", "ghz", "thz", "ohm", "ohms", "ω", "v",
         "mv", "kv", "a", "ma", "µa", "ua", "w", "mw", "kw", "s", "ms", "µs", "us", "ns", "ps",
         "m", "cm", "mm", "km", "µm", "nm", "k", "°c", "°f", "c", "f", "pf", "nf", "µf", "uf",
         "h", "mh", "µh", "uh", "b", "kb", "mb", "gb", "tb", "bit", "bits", "byte", "bytes",
         "bps", "kbps", "mbps", "gbps", "g", "kg", "mg", "j", "kj", "n", "pa", "kpa", "bar",
         "rpm", "min", "hours", "days", "years", "lines", "characters", "columns")
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:[.,]\d+)*)(?:\s*(" + "|".join(
    re.escape(u) for u in sorted(UNITS, key=len, reverse=True)) + r")(?![A-Za-z]))?", re.I)
_QUOTED = re.compile(r"(?:(?<=[\s(])|^)(?:'([^'\n]{2,40})'|\"([^\"\n]{2,40})\"|`([^`\n]{2,40})`"
                     r"|‘([^’\n]{2,40})’|“([^”\n]{2,40})”)")
_CODE = re.compile(r"(?<![\w-])(?:--?[A-Za-z][\w-]*|[A-Za-z][\w+-]*(?:[./_][\w+-]+)+|"
                   r"[A-Za-z]+\d[\w.+-]*)")
_ACRONYM = re.compile(r"\b[A-Z][A-Z0-9&]{1,}(?:s|es)?\b")
_CAMEL = re.compile(r"\b[a-z]*[A-Z][a-z0-9]+[A-Z][\w]*\b|\b[a-z]+[A-Z]\w*\b")
_CAP_RUN = re.compile(r"\b[A-Z][a-zA-Z0-9]*(?:['’]s)?(?:\s+[A-Z][a-zA-Z0-9]*(?:['’]s)?)*")


@lru_cache(maxsize=1)
def _stemmer():
    import snowballstemmer

    return snowballstemmer.stemmer("english").stemWord


@lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    return _stemmer()(word.lower())


def words(text: str) -> list[str]:
    """Letter runs, lowercased, contractions' endings dropped ("doesn't" -> "doesn")."""
    return [w.lower() for w in _WORD.findall(_CONTRACTION.sub("", text))]


def content_words(text: str) -> list[str]:
    """Words of 3+ letters that are neither stopwords nor generic question words, once each
    in order of appearance."""
    seen: dict[str, None] = {}
    for w in words(text):
        if len(w) >= 3 and w not in STOPWORDS and stem(w) not in _STOP_STEMS:
            seen.setdefault(w, None)
    return list(seen)


_STOP_STEMS = frozenset(stem(w) for w in STOPWORDS)


def stems(text: str) -> set[str]:
    return {stem(w) for w in words(text)}


# --- names ------------------------------------------------------------------------------------

def named_entities(question: str) -> list[str]:
    """The names a question uses, each as it is written (see RULES['named_entities'])."""
    q = question.strip()
    found: dict[str, None] = {}

    def add(x: str) -> None:
        x = re.sub(r"['’]s$", "", x.strip().strip(".,;:!?()[]{}"))
        if len(x) >= 2:
            found.setdefault(x, None)

    for m in _QUOTED.finditer(q):
        add(next(g for g in m.groups() if g))
    for m in _CODE.finditer(q):
        tok = m.group(0).rstrip(".-")
        if re.search(r"[A-Za-z]", tok) and not re.fullmatch(r"[A-Za-z]+-[A-Za-z-]+", tok) \
                and not re.fullmatch(r"(?:[A-Za-z]\.)+[A-Za-z]?", tok):
            add(tok)  # hyphenated words ("side-by-side") are words, "e.g." no name
    for m in _ACRONYM.finditer(q):
        add(re.sub(r"(?<=[A-Z0-9])(?:s|es)$", "", m.group(0)))
    for m in _CAMEL.finditer(q):
        add(m.group(0))
    for m in _CAP_RUN.finditer(q):
        parts = m.group(0).split()
        start = m.start()
        lead = q[:start].rstrip()
        # the sentence's first word is capitalised anyway: a name only if it is not a
        # common word and a capitalised word follows it
        if (start == 0 or lead.endswith((":", ".", "!", "?"))) and (
                parts[0].lower() in _COMMON or len(parts) == 1):
            parts = parts[1:]
        parts = [p for p in parts
                 if p != "I" and re.sub(r"['’]s$", "", p).lower() not in _COMMON]
        if parts:
            add(" ".join(parts))
    for m in _NUMBER.finditer(q):
        num, unit = m.group(1), m.group(2)
        if unit or len(num.replace(".", "").replace(",", "")) >= 2 or "." in num:
            add(f"{num} {unit}" if unit else num)
    # a name inside a longer one found too ("Debian" in "Debian Policy") is checked once
    out = list(found)
    return [x for x in out if not any(x != y and x in y.split() for y in out)]


_COMMON = STOPWORDS | QUESTION_WORDS | AUXILIARIES | EXAM_VERBS | PREPOSITIONS | SUBORDINATORS


def occurs(name: str, haystack: str, hay_stems: set[str]) -> bool:
    """A name occurs if its text does (case-insensitive, not inside a longer word); a
    multi-word name if each of its words does (by stem for ordinary words); a number with a
    unit if the number does."""
    m = _NUMBER.fullmatch(name)
    if m and m.group(1):
        name = m.group(1)
    pat = r"(?<![A-Za-z0-9])" + re.escape(name.lower()) + r"(?![A-Za-z0-9])"
    if re.search(pat, haystack):
        return True
    if " " in name and not _QUOTED_CHARS.intersection(name):
        return all(occurs(p, haystack, hay_stems) if not p.isalpha() or p.isupper()
                   else stem(p) in hay_stems for p in name.split())
    if name.isalpha() and not name.isupper():
        return stem(name) in hay_stems  # "Patches" in a text that says "patch"
    return False


_QUOTED_CHARS = frozenset("'\"`‘’“”")


# --- the gates --------------------------------------------------------------------------------

@dataclass
class Verdict:
    gate: str
    action: str  # "pass" | "strip" | "reject"
    reason: str = ""
    detail: str = ""

    def to_json(self) -> dict:
        d = {"action": self.action}
        if self.reason:
            d["reason"] = self.reason
        if self.detail:
            d["detail"] = self.detail
        return d


@dataclass
class Context:
    """What one question is checked against."""

    section_text: str
    headings: str = ""
    answer: str = ""
    perspective: str = ""
    document_stems: set[str] | None = None  # None: the foreign_words gate passes

    def __post_init__(self):
        self.hay = f"{self.headings}\n{self.section_text}".lower()
        self.hay_stems = stems(self.hay)
        self.known = self.hay_stems | stems(self.answer) | stems(self.perspective)


def echo_prefix(question: str) -> tuple[str, Verdict]:
    q, n = question.strip(), 0
    while True:
        new = _LEAD.sub("", q, count=1).strip()
        if new == q:
            break
        q, n = new, n + 1
    if len(q) > 2 and q[0] in '"“' and q[-1] in '"”':
        q = q[1:-1].strip()
    if q[:1].islower():
        q = q[:1].upper() + q[1:]
    if m := _MARKER.search(q):
        return question, Verdict("echo_prefix", "reject", "echoed_marker", m.group(0).strip())
    if m := _PROMPT_ECHO.search(q):
        return question, Verdict("echo_prefix", "reject", "echoed_marker", m.group(0))
    if len(q) < 12:
        return question, Verdict("echo_prefix", "reject", "echo_only", q)
    if n:
        return q, Verdict("echo_prefix", "strip", "stripped_prefix",
                          question[:len(question) - len(q)].strip() or question[:12])
    return question, Verdict("echo_prefix", "pass")


def _asks(tokens: list[str]) -> bool:
    if not tokens:
        return False
    t0 = tokens[0]
    if t0 in ("when", "where") and len(tokens) > 1 and tokens[1] not in AUXILIARIES \
            and tokens[1] != "to":
        return False  # "When comparing files, ..." opens a clause: what follows must ask
    if t0 in QUESTION_WORDS or t0 in AUXILIARIES or t0 in EXAM_VERBS:
        return True
    if t0 in PREPOSITIONS:  # "In which ...", "To what extent ...", "According to whom"
        return any(t in QUESTION_WORDS for t in tokens[1:3])
    return False


def _tokens(text: str) -> list[str]:
    """Words, lowercased; "what's" -> "what", "isn't" stays "isn't"."""
    return [re.sub(r"['’](?:s|re|ll|d|ve)$", "", w.lower())
            for w in re.findall(r"[A-Za-z]+(?:['’][a-z]+)?", text)]


def _opens(tokens: list[str]) -> bool:
    """An opening clause ('For a 50-ohm line', 'When comparing files', 'Using diff',
    'Regarding X') rather than a sentence with its own subject."""
    return bool(tokens) and (tokens[0] in PREPOSITIONS or tokens[0] in SUBORDINATORS
                             or tokens[0] in OPENERS or tokens[0].endswith("ing"))


OPENERS = frozenset("regarding considering concerning so then now also finally here thus "
                    "hence besides apart other instead for".split())


_CUT = re.compile(r"(?:[,;:\-–]|\.\.\.|…|\b(?:and|or|nor|but|the|a|an|than|whose)|"
                  # a clause cut before its complement: "..., if the second line is?"
                  r"\b(?:if|when|whether|unless|while|because|although)\s+(?:[\w'’-]+\s+)"
                  r"{0,4}?(?:is|are|was|were|be|been)"
                  r")\s*\?$", re.I)


def interrogative(question: str) -> Verdict:
    q = question.strip()
    if m := _CUT.search(q):
        return Verdict("interrogative", "reject", "cut_off_question", q[max(0, m.start() - 20):])
    if _TAG.search(q):
        return Verdict("interrogative", "pass")
    if _asks(_tokens(q)):
        return Verdict("interrogative", "pass")
    # a question after an opening clause and a comma, or after a colon
    head = _tokens(re.split(r"[,:;]", q, maxsplit=1)[0])
    for m in re.finditer(r"([,:;])\s+", q):
        rest = _tokens(q[m.end():])
        if _asks(rest) and (m.group(1) != "," or _opens(head)):
            return Verdict("interrogative", "pass")
    first = " ".join(q.split()[:4])
    return Verdict("interrogative", "reject", "statement_with_question_mark", first)


_DEICTIC = re.compile(r"\b(?:this|these|those|the above|above-mentioned|aforementioned|"
                      r"the following|the given|the former|the latter|"
                      r"which ones?\b(?!\s+of\b))\b", re.I)


def self_contained(question: str) -> Verdict:
    bare = _QUOTED.sub(" ", question)
    if m := _DEICTIC.search(bare):
        return Verdict("self_contained", "reject", "points_at_unseen_context", m.group(0))
    return Verdict("self_contained", "pass")


_ABBREVIATIONS = frozenset("etc vs cf al approx fig figs eq no nos resp incl esp ca viz "
                           "ed eds vol pp sec ch".split())
_LETTER_SPACED = re.compile(r"(?<![\w-])(?:[A-Za-z] ){3,}[A-Za-z](?![\w-])")
_INNER_STOP = re.compile(r"\b([A-Za-z]{2,})\.\s+([a-z])")
# words a sentence writes twice in a row with reason ("that that", "had had")
_DOUBLES = frozenset("that had is do".split())


def broken_phrases(question: str) -> Verdict:
    """Wording no careful writer leaves: a repeated word or phrase, a word spelt out letter
    by letter, a content word three times, a full stop that ends nothing."""
    bare = _QUOTED.sub(" ", question)
    if m := _LETTER_SPACED.search(bare):
        return Verdict("broken_phrases", "reject", "letter_spaced", m.group(0))
    toks = [w.lower() for w in re.findall(r"[A-Za-z][A-Za-z'’-]*", bare)]
    for n in (1, 2, 3):
        for i in range(len(toks) - 2 * n + 1):
            a, b = toks[i:i + n], toks[i + n:i + 2 * n]
            if a == b and not (n == 1 and a[0] in _DOUBLES):
                return Verdict("broken_phrases", "reject", "repeated_words", " ".join(a + b))
    counts: dict[str, int] = {}
    for w in words(bare):
        if len(w) >= 3 and w not in STOPWORDS:
            counts[stem(w)] = counts.get(stem(w), 0) + 1
    if thrice := [w for w, n in counts.items() if n >= 3]:
        return Verdict("broken_phrases", "reject", "repeated_words",
                       f"'{thrice[0]}' {counts[thrice[0]]} times")
    for m in _INNER_STOP.finditer(bare):
        if m.group(1).lower() not in _ABBREVIATIONS:
            return Verdict("broken_phrases", "reject", "broken_sentence",
                           bare[max(0, m.start() - 10):m.end() + 10].strip())
    return Verdict("broken_phrases", "pass")


def entities_gate(question: str, ctx: Context) -> Verdict:
    absent = [e for e in named_entities(question) if not occurs(e, ctx.hay, ctx.hay_stems)]
    if absent:
        return Verdict("named_entities", "reject", "absent_name", ", ".join(absent))
    return Verdict("named_entities", "pass")


def content_gate(question: str, ctx: Context, min_share: float) -> Verdict:
    cw = content_words(question)
    if not cw:
        return Verdict("content_words", "reject", "no_content_words", question[:40])
    absent = [w for w in cw if stem(w) not in ctx.known]
    share = 1 - len(absent) / len(cw)
    if share < min_share:
        return Verdict("content_words", "reject", "few_content_words_in_section",
                       f"{len(cw) - len(absent)}/{len(cw)} in the section; absent: "
                       + ", ".join(absent))
    return Verdict("content_words", "pass")


def foreign_gate(question: str, ctx: Context, max_foreign: int, min_letters: int = 6
                 ) -> Verdict:
    if ctx.document_stems is None:
        return Verdict("foreign_words", "pass")
    foreign = [w for w in content_words(question) if len(w) >= min_letters
               and stem(w) not in ctx.known and stem(w) not in ctx.document_stems]
    if len(foreign) > max_foreign:
        return Verdict("foreign_words", "reject", "foreign_words",
                       "never in the document: " + ", ".join(foreign))
    return Verdict("foreign_words", "pass")


@dataclass
class Result:
    question: str  # after stripping
    verdicts: list[Verdict]

    @property
    def removed_by(self) -> Verdict | None:
        return next((v for v in self.verdicts if v.action == "reject"), None)


def check(question: str, ctx: Context, *, enabled: Iterable[str] = RULE_GATES,
          min_share: float = 0.5, max_foreign: int = 0, min_letters: int = 6) -> Result:
    """Every enabled rule gate's verdict on one question (the later gates judge the stripped
    question); the likelihood gate is the pipeline's (it needs a model)."""
    on = set(enabled)
    verdicts = []
    q = question
    if "echo_prefix" in on:
        q, v = echo_prefix(question)
        verdicts.append(v)
    if "interrogative" in on:
        verdicts.append(interrogative(q))
    if "self_contained" in on:
        verdicts.append(self_contained(q))
    if "broken_phrases" in on:
        verdicts.append(broken_phrases(q))
    if "named_entities" in on:
        verdicts.append(entities_gate(q, ctx))
    if "content_words" in on:
        verdicts.append(content_gate(q, ctx, min_share))
    if "foreign_words" in on:
        verdicts.append(foreign_gate(q, ctx, max_foreign, min_letters))
    return Result(q, verdicts)


def rule_text(name: str, *, min_share: float = 0.5, max_foreign: int = 0,
              min_letters: int = 6, min_likelihood: float = -2.2) -> str:
    return RULES[name].format(min_share=min_share, max_foreign=max_foreign,
                              min_letters=min_letters, min_likelihood=min_likelihood)
