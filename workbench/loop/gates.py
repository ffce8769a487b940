"""Quality gates every synthesised sample passes before it may be trained on, in order:

1. format: a user turn and a non-empty assistant turn of bounded length;
2. identifiers: e-mail addresses, phone numbers, record or social-security numbers, dates
   of birth and titled names (Mr/Mrs/Ms/Dr Smith) drop the sample; a generated sample that
   carries one is suspect, and nothing identifying reaches the weights;
3. safety: a drug dose (a number with mg, mcg, ml, units...) or an instruction to take or
   stop a medicine drops it;
4. duplicates: the same text, or word 3-gram Jaccard above the limit, against the samples
   kept before (this round's and the training data of earlier rounds);
5. benchmark leaks: a judged question (test, retention, the judged open questions) verbatim
   in the sample's prompt, or the given share of its word n-grams there, drops it, and so
   does a sample made from a test term's section or item (synthesis never retrieves them;
   this is the check that it did not);
6. verifier: the answer names the right option (MC) or is grounded in its section (its
   content words are in the section's text).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from workbench.loop.suites import Suites
from workbench.loop.synth import names_gold
from workbench.records import ChatExample, MCItem

PII = [
    ("email", re.compile(r"\b[\w.+-]+@[\w-]+\.[\w.-]+\b")),
    ("phone", re.compile(r"(?<!\w)(?:\+?\d{1,3}[\s.-]?)?\(?\d{3}\)?[\s.-]\d{3}[\s.-]\d{4}\b")),
    ("ssn", re.compile(r"\b\d{3}-\d{2}-\d{4}\b")),
    ("record_number", re.compile(r"\b(?:MRN|medical record(?: number)?|patient id)\s*[:#]?\s*"
                                 r"[A-Z0-9-]{4,}", re.IGNORECASE)),
    ("date_of_birth", re.compile(r"\b(?:born|DOB|date of birth)\b[^.\n]{0,20}\d{1,4}[/.-]\d{1,2}"
                                 r"[/.-]\d{1,4}", re.IGNORECASE)),
    ("titled_name", re.compile(r"\b(?:Mr|Mrs|Ms|Miss|Dr)\.? [A-Z][a-z]+\b")),
]
UNSAFE = [
    ("dose", re.compile(r"\b\d+(?:\.\d+)?\s*(?:mg|mcg|µg|g|ml|mL|units?|IU)\b(?:/(?:kg|day|d))?")),
    ("medication_instruction", re.compile(
        r"\b(?:take|stop taking|double|increase|start) (?:your |the )?(?:medicine|medication|"
        r"dose|pills?|tablets?|insulin)\b", re.IGNORECASE)),
]
MAX_CHARS = 1500


def _norm(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _grams(words: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def _turn(ex: ChatExample, role: str) -> str:
    return "\n".join(m.content or "" for m in ex.messages if m.role == role)


class Gates:
    """Run the gates over samples; `seen` texts are the earlier rounds' training data."""

    def __init__(self, suites: Suites, settings, *, seen: Iterable[ChatExample] = (),
                 sections: dict[str, str] | None = None):
        self.s = settings
        self.tests: list[tuple[str, str, set]] = []
        judged = [(it.id, it.question) for it in suites.test + suites.retention] + [
            (q.id, q.question) for q in suites.open]
        for qid, question in judged:
            w = _norm(question)
            self.tests.append((qid, " ".join(w), _grams(w, settings.ngram)))
        self.guarded = suites.guarded
        self.kept_text: set[str] = set()
        self.kept_grams: list[set] = []
        for ex in seen:
            self._remember(ex)
        self.sections = sections or {}
        # section id -> the term id it states (samples name either)
        self.section_terms = {sid: (m.group(1) if (m := re.search(r"\bID: ([A-Za-z]+:\d+)",
                                                                  text)) else sid)
                              for sid, text in self.sections.items()}
        self.dev = {it.id: it for it in suites.dev}

    def _remember(self, ex: ChatExample) -> None:
        w = _norm(_turn(ex, "user") + " " + _turn(ex, "assistant"))
        self.kept_text.add(" ".join(w))
        self.kept_grams.append(_grams(w, 3))

    def check(self, ex: ChatExample) -> tuple[str, str] | None:
        """None when the sample passes, else (gate, reason)."""
        user, answer = _turn(ex, "user"), _turn(ex, "assistant")
        if not user.strip() or not answer.strip():
            return "format", "empty user or assistant turn"
        if len(answer) > MAX_CHARS or len(user) > 2 * MAX_CHARS:
            return "format", f"too long ({len(user)} + {len(answer)} characters)"
        for name, rx in PII:
            if m := rx.search(user + "\n" + answer):
                return "identifiers", f"{name}: {m.group(0)[:40]!r}"
        for name, rx in UNSAFE:
            if m := rx.search(answer):
                return "safety", f"{name}: {m.group(0)[:40]!r}"
        w = _norm(user + " " + answer)
        text = " ".join(w)
        if text in self.kept_text:
            return "duplicate", "same text as a kept sample"
        g = _grams(w, 3)
        for other in self.kept_grams:
            if g and other and len(g & other) / len(g | other) >= self.s.max_duplicate:
                return "duplicate", f"3-gram Jaccard >= {self.s.max_duplicate}"
        uw = _norm(user)
        joined = " ".join(uw)
        ug = _grams(uw, self.s.ngram)
        for tid, q, qg in self.tests:
            if q and f" {q} " in f" {joined} ":
                return "leak", f"judged item {tid} verbatim in the prompt"
            if qg and len(qg & ug) / len(qg) >= self.s.max_leak_overlap:
                return "leak", f"judged item {tid}: {len(qg & ug)}/{len(qg)} of its " \
                               f"{self.s.ngram}-grams in the prompt"
        meta = ex.metadata or {}
        sec = self.section_terms.get(meta.get("section_id") or "", meta.get("section_id"))
        if sec in self.guarded:
            return "leak", f"made from the test term {sec}"
        if why := self._unverified(ex, answer):
            return "verifier", why
        return None

    def _unverified(self, ex: ChatExample, answer: str) -> str | None:
        meta = ex.metadata or {}
        item: MCItem | None = self.dev.get(meta.get("source", ""))
        if meta.get("job") in ("reasoning", "calibration", "anchors") and item is not None:
            gold = item.options["ABCDEFGHIJ".index(item.answer)]
            if not names_gold(answer, gold):
                return "the answer does not name the right option"
        if meta.get("job") == "knowledge":
            src = self.sections.get(meta.get("section_id") or "", "")
            want = {x for x in _norm(answer) if len(x) > 3}
            if src and want:
                have = set(_norm(src)) | set(_norm(_turn(ex, "user")))
                if len(want & have) < 0.8 * len(want):
                    return "the answer is not grounded in its section"
        return None

    def run(self, samples: Sequence[ChatExample]) -> tuple[list[ChatExample], list[dict]]:
        kept, dropped = [], []
        for ex in samples:
            why = self.check(ex)
            if why is None:
                kept.append(ex)
                self._remember(ex)
            else:
                dropped.append({"id": ex.id, "job": (ex.metadata or {}).get("job"),
                                "gate": why[0], "reason": why[1]})
        return kept, dropped
