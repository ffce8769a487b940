"""SFT exports of QTSA samples: OpenAI messages (default), ShareGPT, Alpaca; two styles.

- `instruct`: one assistant turn holding thinking, solution and `<answer>`, for instruct
  models;
- `thinking`: the thinking in the reasoning channel (`reasoning_content`; a `<think>` block
  in ShareGPT/Alpaca), the solution and `<answer>` as the reply, for thinking models.
A multiple-choice reply starts with its letter and option ("B) ..."): the letter scoring
reads the reply's first token, so that is the token training has to teach.
Only training-split samples are exported: held-out items (either benchmark) never reach
training data.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from workbench.distill.parse import format_options
from workbench.formats import write_dataset
from workbench.records import LETTERS, ChatExample, Message, QTSASample

STYLES = ("instruct", "thinking")


def question_text(s: QTSASample) -> str:
    if s.kind == "mc":
        assert s.options is not None  # an MC sample has its four (QTSASample checks)
        return f"{s.question}\n{format_options(s.options)}\nAnswer with the letter of the " \
               "correct option."
    return s.question


def _lead(s: QTSASample) -> str:
    """An MC reply's first line: the letter and its option ("B) ..."), so the letter is the
    reply's first token, the one the letter scoring reads (and what the answer parser reads
    first). Open answers have none."""
    if s.kind != "mc" or not s.options or len(s.answer) != 1:
        return ""
    return f"{s.answer}) {s.options[LETTERS.index(s.answer)]}\n\n"


def to_chat(s: QTSASample, style: str = "instruct") -> ChatExample:
    lead = _lead(s)
    # composed mode's solution only restates the option the lead line already gives
    restated = lead and s.solution.startswith("The correct option is ")
    final = f"<answer>{s.answer}</answer>" if restated else \
        f"{s.solution}\n\n<answer>{s.answer}</answer>"
    if style == "instruct":
        body = f"{s.thinking}\n\n{final}" if s.thinking else final
        reply = Message(role="assistant", content=f"{lead}{body}")
    elif style == "thinking":
        reply = Message(role="assistant", content=f"{lead}{final}",
                        reasoning_content=s.thinking)
    else:
        raise ValueError(f"style must be one of {', '.join(STYLES)}")
    return ChatExample(id=s.id, messages=[Message(role="user", content=question_text(s)),
                                          reply],
                       metadata={"kind": s.kind, "section_id": s.provenance.section_id})


def export_sft(samples: Iterable[QTSASample], path: str | Path, *, fmt: str = "messages",
               style: str = "instruct", kinds: tuple[str, ...] = ("mc", "nd"),
               include_benchmark: bool = False) -> int:
    chosen = [s for s in samples if s.kind in kinds
              and (include_benchmark or s.split == "train")]
    return write_dataset(path, [to_chat(s, style) for s in chosen], fmt)
