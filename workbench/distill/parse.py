"""Deterministic parsing and validation of the agents' outputs.

Every function either returns clean fields or raises `Reject(reason)`: a record that fails is
counted under its reason and dropped, never patched by copying raw text into fields.
"""

from __future__ import annotations

import json
import re

from workbench.evaluate.mc import format_options  # noqa: F401  re-exported for distill

LETTERS = "ABCD"


class Reject(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# References a self-contained question must not make
_CONTEXT_REFS = re.compile(
    r"\b(the|this|above|given|following|provided)\s+(text|passage|excerpt|section|paragraph|"
    r"article|document|chapter|fact|statement|question)\b|\baccording to the\b|"
    r"\bas (stated|mentioned|described) (above|earlier)\b|\bgiven a (fact|text)\b", re.I)
_NUMBERED_REF = re.compile(r"\b(fig(?:ure)?|eq(?:uation)?|table|section)\.?\s*\(?\d+(?:\.\d+)*\)?",
                           re.I)
_ANSWER_LEAK = re.compile(r"^\s*(correct( answer| option)?|answer|solution)\s*[:=]", re.I)
_OPTION_LINE = re.compile(r"^\s*\(?([A-Da-d])[\)\].:]\s*(.+?)\s*$")
_QUESTION_LINE = re.compile(r"^\s*(?:\*\*)?question(?:\*\*)?\s*[:.-]\s*(.+)$", re.I)
_CORRECT_LINE = re.compile(r"^\s*(?:\*\*)?correct(?: answer| option)?(?:\*\*)?\s*[:=-]\s*"
                           r"\(?([A-Da-d])\b", re.I)


def rewrite_numbered_refs(text: str) -> tuple[str, bool]:
    """'Equation (2)' -> 'the relevant equation', 'Figure 3' -> 'the relevant figure'."""
    changed = False

    def sub(m: re.Match) -> str:
        nonlocal changed
        changed = True
        word = m.group(1).lower().rstrip(".")
        kind = {"fig": "figure", "eq": "equation"}.get(word, word)
        return f"the relevant {kind}"

    return _NUMBERED_REF.sub(sub, text), changed


def strip_answer_leaks(question: str) -> str:
    """Drop lines of a question stem that state the answer ('Answer: B')."""
    return "\n".join(line for line in question.splitlines()
                     if not _ANSWER_LEAK.match(line)).strip()


def check_question(q: str, *, min_chars: int = 12, max_chars: int = 600) -> str:
    q = " ".join(strip_answer_leaks(q.strip().strip('"').strip()).split())
    if len(q) < min_chars:
        raise Reject("question_too_short", q)
    if len(q) > max_chars:
        raise Reject("question_too_long")
    if _CONTEXT_REFS.search(q):
        raise Reject("not_self_contained", q)
    if _NUMBERED_REF.search(q):
        raise Reject("numbered_reference", q)
    if not re.search(r"[A-Za-z]{3}", q):
        raise Reject("question_not_text", q)
    if _CHATTY.search(q):
        raise Reject("chat_not_question", q)
    return q


_CHATTY = re.compile(r"\b(I'm|I am|I'd|I will|on your mind|help you|can I|may I|let me|"
                     r"do you (want|need))\b", re.I)
_CONTENT = re.compile(r"[A-Za-z][A-Za-z\-]{4,}")


def check_grounded(question: str, source: str, min_shared: int = 1) -> None:
    """The question must use at least `min_shared` content words (5+ letters) of its source
    text: a question about something else cannot be answered only from the text."""
    src = {w.lower() for w in _CONTENT.findall(source)}
    shared = {w.lower() for w in _CONTENT.findall(question)} & src
    if len(shared) < min_shared:
        raise Reject("not_grounded", question)


_QUESTION_SENTENCE = re.compile(r"(?:^|(?<=[\s\"'“(:]))([A-Z][^?\n\"”]{8,300}\?)")
_LIST_PREFIX = re.compile(r"^\s*(?:\d+[.)]|[-*•]|ask:|q:|question\s*\d*[:.])\s*", re.I)


def parse_question(text: str) -> str:
    """The model's first well-formed question (composed mode's question call).

    Small models wrap their question in chatter ('One question is "How ...?"', 'Ask: ...',
    numbered lists); the first sentence that ends with '?' and passes `check_question` is
    taken as written. Nothing is invented or completed.
    """
    if not text.strip():
        raise Reject("empty_output")
    last: Reject | None = None
    for line in text.strip().splitlines():
        m = _QUESTION_LINE.match(line)
        line = _LIST_PREFIX.sub("", m.group(1) if m else line).strip()
        for cand in _QUESTION_SENTENCE.findall(line):
            try:
                return check_question(cand)
            except Reject as r:
                last = r
    raise last or Reject("no_question_mark", text.strip()[:60])


def parse_mc_block(text: str) -> tuple[str, list[str], str]:
    """RF-Agent's writer format: 'Question: ...', 'A) ...' to 'D) ...', 'Correct: X'."""
    if not text.strip():
        raise Reject("empty_output")
    lines = text.strip().splitlines()
    question_parts: list[str] = []
    options: dict[str, str] = {}
    correct = None
    in_question = False
    for line in lines:
        if m := _QUESTION_LINE.match(line):
            question_parts, in_question = [m.group(1)], True
        elif m := _OPTION_LINE.match(line):
            in_question = False
            letter = m.group(1).upper()
            if letter in options:
                raise Reject("duplicate_option_letter", letter)
            options[letter] = m.group(2)
        elif m := _CORRECT_LINE.match(line):
            correct = m.group(1).upper()
        elif in_question and line.strip():
            question_parts.append(line.strip())
    if not question_parts:
        raise Reject("no_question")
    if sorted(options) != list(LETTERS):
        raise Reject("not_four_options", "".join(sorted(options)))
    if correct is None:
        raise Reject("no_correct_letter")
    opts = [options[x].strip() for x in LETTERS]
    check_options(opts)
    return check_question("\n".join(question_parts)), opts, correct


def check_options(opts: list[str]) -> None:
    if any(len(o) < 1 for o in opts):
        raise Reject("empty_option")
    norm = [re.sub(r"\W+", " ", o.lower()).strip() for o in opts]
    if len(set(norm)) != len(norm):
        raise Reject("duplicate_options")
    if any(re.fullmatch(r"(all|none) of the above|both .*", n) for n in norm):
        raise Reject("meta_option")


_THINK = re.compile(r"<think>(.*?)</think>", re.S | re.I)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)


def parse_answerer(text: str, *, multiple_choice: bool) -> tuple[str, str, str]:
    """RF-Agent's answerer format: <think>reasoning</think> solution <answer>final</answer>.

    Returns (thinking, solution, answer). Tags must be balanced and appear once each.
    """
    low = text.lower()
    for tag in ("think", "answer"):
        if low.count(f"<{tag}>") != low.count(f"</{tag}>"):
            raise Reject("unbalanced_tags", tag)
        if low.count(f"<{tag}>") != 1:
            raise Reject(f"{tag}_tag_count", str(low.count(f"<{tag}>")))
    think = _THINK.search(text)
    ans = _ANSWER.search(text)
    if think is None or ans is None:  # a closing tag before its opening one
        raise Reject("unbalanced_tags", "think" if think is None else "answer")
    if think.start() > ans.start():
        raise Reject("answer_before_thinking")
    thinking = think.group(1).strip()
    solution = text[think.end():ans.start()].strip()
    answer = ans.group(1).strip()
    if not thinking:
        raise Reject("empty_thinking")
    if not solution:
        raise Reject("empty_solution")
    if multiple_choice:
        answer = normalise_letters(answer)
    elif not answer:
        raise Reject("empty_answer")
    return thinking, solution, answer


def normalise_letters(answer: str) -> str:
    """'(b), a' -> 'AB'; anything else than option letters is rejected."""
    cleaned = re.sub(r"(?i)\b(options?|and|or)\b", " ", answer)
    letters = re.findall(r"\b([A-Da-d])\b", cleaned)
    rest = re.sub(r"\b[A-Da-d]\b|[\s,;().&/]+", "", cleaned)
    if not letters or rest:
        raise Reject("answer_not_letters", answer[:40])
    return "".join(sorted({x.upper() for x in letters}))


def parse_sentence(text: str, *, min_chars: int = 8, max_chars: int = 400) -> str:
    """A short free-text answer (composed mode): first paragraph, cleaned."""
    para = text.strip().split("\n\n")[0].strip()
    para = re.sub(r"^\s*(answer|a)\s*[:.-]\s*", "", para, flags=re.I)
    if len(para) < min_chars:
        raise Reject("answer_too_short", para)
    if len(para) > max_chars:
        para = para[:max_chars].rsplit(". ", 1)[0] + "."
        if len(para) < min_chars:
            raise Reject("answer_too_long")
    return para


def parse_rationale(text: str, *, min_chars: int = 40) -> str:
    t = text.strip()
    t = re.sub(r"</?think>", "", t, flags=re.I).strip()
    if len(t) < min_chars:
        raise Reject("rationale_too_short", t[:40])
    return t


def parse_postprocess_json(text: str) -> dict[str, str]:
    """Strict JSON with exactly question, thinking, solution, answer (all non-empty strings)."""
    m = re.search(r"\{.*\}", text, re.S)
    if not m:
        raise Reject("postprocess_no_json")
    try:
        obj = json.loads(m.group(0))
    except json.JSONDecodeError:
        raise Reject("postprocess_bad_json") from None
    keys = {"question", "thinking", "solution", "answer"}
    if not isinstance(obj, dict) or set(obj) != keys:
        raise Reject("postprocess_wrong_keys", ",".join(sorted(obj) if isinstance(obj, dict)
                                                         else []))
    if not all(isinstance(obj[k], str) and obj[k].strip() for k in keys):
        raise Reject("postprocess_empty_field")
    return {k: obj[k].strip() for k in keys}

