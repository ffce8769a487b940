"""A scripted model and trainer for the improvement loop's tests.

`loopfake` answers the loop's prompts through the normal model protocol: a multiple-choice
question is right when the scripted effect of its adapter says so (base: a fixed half of the
items, by hash), open questions get a short fixed answer, judge prompts say yes when the
criterion's last word is in the answer. The trainer writes an adapter whose "weights" name
the round's plan target and the subset the test wants hurt (`LOOP_HURT_ROUND_<n>=subset`),
so a round improves one subset and, when asked, hurts another. `LOOP_DIE_AT_TRAIN=<file>`
makes the first candidate training exit like a SIGKILL (and creates the file), for resume.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from workbench.models.base import ContinuationScore
from workbench.models.fake import FakeChatModel
from workbench.models.messages import plain_conversation
from workbench.models.backends import register_backend

ITEMS: dict[str, tuple[str, str]] = {}  # question -> (gold option text, subset)


def _load_items() -> None:
    if ITEMS:
        return
    root = Path(__file__).resolve().parents[1] / "datasets"
    for f in (root / "health" / "dev.jsonl", root / "health" / "test.jsonl",
              root / "rf_distilled" / "benchmark.jsonl"):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            gold = d["options"]["ABCD".index(d["answer"])]
            ITEMS[d["question"]] = (gold, (d.get("provenance") or {}).get("doc_id")
                                    or "retention")


def _base_right(question: str) -> bool:
    return int(hashlib.sha256(question.encode()).hexdigest(), 16) % 2 == 0


@register_backend("loopfake")
class LoopFake(FakeChatModel):
    def __init__(self, spec: str = "loopfake", adapter: str | None = None,
                 merge_adapter: bool = False, **options):
        super().__init__(spec, **{"responses": ["It is an abnormality of the body.",
                                                "A clinical finding."], **options})
        self.effect = {}
        if adapter:
            self.effect = json.loads((Path(adapter) / "effect.json").read_text())
        _load_items()

    @property
    def identity(self) -> str:
        return f"loopfake:{json.dumps(self.effect, sort_keys=True)}"

    def _right(self, question: str, subset: str) -> bool:
        if subset == self.effect.get("hurt"):
            return False
        if subset == self.effect.get("improve"):
            return True
        return _base_right(question)

    def score(self, requests):
        out = []
        for req in requests:
            conv = plain_conversation(req.prompt) if not isinstance(req.prompt, str) else []
            prompt = req.prompt if isinstance(req.prompt, str) else conv[-1]["content"]
            if list(req.continuations) == ["yes", "no"]:  # a rubric judge
                crit = prompt.split("criterion?", 1)[-1].split("\n")[0].strip().rstrip(".")
                answer = prompt.split("Answer:", 1)[-1].split("\n")[0].lower()
                word = crit.split()[-1].lower() if crit.split() else ""
                yes = bool(word) and word in answer
                out.append([ContinuationScore(0.0 if yes else -3.0, 1, 3),
                            ContinuationScore(-3.0 if yes else 0.0, 1, 2)])
                continue
            question = next((q for q in ITEMS if q in prompt), None)
            gold, subset = ITEMS.get(question, ("", "")) if question else ("", "")
            right = question is not None and self._right(question, subset)
            row = []
            wrong_done = False
            for c in req.continuations:
                if c == gold:
                    lp = 0.0 if right else -5.0
                elif not right and not wrong_done:
                    lp, wrong_done = 0.0, True
                else:
                    lp = -5.0
                row.append(ContinuationScore(lp * max(len(c), 1), 1, len(c)))
            out.append(row)
        return out


def train(data: Path, output: Path, settings, *, steps: int, model_spec: str, seed: int,
          log=print) -> dict:
    round_dir = Path(output).parent if Path(output).name == "candidate" \
        else Path(output).parent.parent
    index = int(round_dir.name)
    target = json.loads((round_dir / "round.json").read_text())["plan"]["target"]
    die = os.environ.get("LOOP_DIE_AT_TRAIN")
    if die and Path(output).name == "candidate" and not Path(die).exists():
        Path(die).write_text("died once")
        os._exit(137)
    effect = {"improve": target, "hurt": os.environ.get(f"LOOP_HURT_ROUND_{index}")}
    rows = Path(data).read_text().count("\n")
    Path(output).mkdir(parents=True, exist_ok=True)
    (Path(output) / "effect.json").write_text(json.dumps(effect))
    (Path(output) / "adapter_model.safetensors").write_bytes(
        json.dumps({**effect, "rows": rows, "steps": steps, "seed": seed}).encode())
    return {"steps": steps, "first_loss": 2.0, "last_loss": 1.0}
