"""Text analysis for keyword retrieval: configurable lowercasing, stopwords and stemming.

Scripts written without spaces (Chinese, Japanese, Thai, ...) are split into single
characters so that they never collapse into one giant token or into nothing.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from workbench.errors import WorkbenchError

# A short English stopword list (the usual function words); pass stopwords="none" to keep all.
ENGLISH_STOPWORDS = frozenset("""
a an and are as at be but by for from has have he her his i if in into is it its me my no nor
not of on or our she so such than that the their them then there these they this to was we
were what when where which while who whom why will with you your
""".split())

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*", re.UNICODE)
# CJK ideographs, kana, hangul syllables, Thai, Lao, Khmer, Myanmar: no spaces between words
_NOSPACE = re.compile(r"[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf"
                      r"\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


@dataclass(frozen=True)
class Analyzer:
    lowercase: bool = True
    stopwords: str = "none"  # "none" | "english"
    stemmer: str = "none"  # "none" | "english" (Snowball, needs `snowballstemmer`)
    min_token_len: int = 1

    def to_json(self) -> dict:
        return asdict(self)

    def __post_init__(self):
        if self.stopwords not in ("none", "english"):
            raise ValueError(f"stopwords must be 'none' or 'english', got {self.stopwords!r}")
        if self.stemmer not in ("none", "english"):
            raise ValueError(f"stemmer must be 'none' or 'english', got {self.stemmer!r}")

    def _stem_fn(self):
        if self.stemmer == "none":
            return None
        try:
            import snowballstemmer
        except ImportError:
            raise WorkbenchError("stemmer 'english' needs `pip install snowballstemmer`") \
                from None
        return snowballstemmer.stemmer("english").stemWord

    def __call__(self, text: str) -> list[str]:
        if self.lowercase:
            text = text.lower()
        out: list[str] = []
        stop = ENGLISH_STOPWORDS if self.stopwords == "english" else frozenset()
        stem = self._stem_fn()
        for m in _WORD.finditer(text):
            tok = m.group(0)
            if _NOSPACE.search(tok):
                out.extend(_split_nospace(tok))
                continue
            if tok in stop or len(tok) < self.min_token_len:
                continue
            out.append(stem(tok) if stem else tok)
        return out

    def batch(self, texts) -> list[list[str]]:
        return [self(t) for t in texts]


def _split_nospace(tok: str) -> list[str]:
    """Characters of space-less scripts become tokens; embedded Latin/digit runs stay whole."""
    out, run = [], ""
    for ch in tok:
        if _NOSPACE.match(ch):
            if run:
                out.append(run)
                run = ""
            out.append(ch)
        else:
            run += ch
    if run:
        out.append(run)
    return out
