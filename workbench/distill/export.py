"""SFT exports of QTSA samples: OpenAI messages (default), ShareGPT, Alpaca; two styles (the
sample as a chat example is `formats.to_chat`).

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

from workbench.formats import to_chat, write_dataset
from workbench.records import QTSASample


def export_sft(samples: Iterable[QTSASample], path: str | Path, *, fmt: str = "messages",
               style: str = "instruct", kinds: tuple[str, ...] = ("mc", "nd"),
               include_benchmark: bool = False) -> int:
    chosen = [s for s in samples if s.kind in kinds
              and (include_benchmark or s.split == "train")]
    return write_dataset(path, [to_chat(s, style) for s in chosen], fmt)
