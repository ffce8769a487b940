"""SFT exports of QTSA samples: OpenAI messages (default), ShareGPT, Alpaca; two styles.

- `instruct`: one assistant turn holding thinking, solution and `<answer>`, for instruct
  models;
- `thinking`: the thinking in the reasoning channel (`reasoning_content`; a `<think>` block
  in ShareGPT/Alpaca), the solution and `<answer>` as the reply, for thinking models.
Only training-split samples are exported: benchmark sections never reach training data.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from workbench.distill.parse import format_options
from workbench.formats import write_dataset
from workbench.records import ChatExample, Message, QTSASample

STYLES = ("instruct", "thinking")


def question_text(s: QTSASample) -> str:
    if s.kind == "mc":
        return f"{s.question}\n{format_options(s.options)}\nAnswer with the letter of the " \
               "correct option."
    return s.question


def to_chat(s: QTSASample, style: str = "instruct") -> ChatExample:
    final = f"{s.solution}\n\n<answer>{s.answer}</answer>"
    if style == "instruct":
        reply = Message(role="assistant", content=f"{s.thinking}\n\n{final}")
    elif style == "thinking":
        reply = Message(role="assistant", content=final, reasoning_content=s.thinking)
    else:
        raise ValueError(f"style must be one of {', '.join(STYLES)}")
    return ChatExample(id=s.id, messages=[Message(role="user", content=question_text(s)),
                                          reply],
                       metadata={"kind": s.kind, "section_id": s.provenance.section_id})


def export_sft(samples: Iterable[QTSASample], path: str | Path, *, fmt: str = "messages",
               style: str = "instruct", kinds: tuple[str, ...] = ("mc", "nd"),
               include_benchmark: bool = False) -> int:
    chosen = [s for s in samples if s.kind in kinds
              and (include_benchmark or s.split != "benchmark")]
    return write_dataset(path, [to_chat(s, style) for s in chosen], fmt)
