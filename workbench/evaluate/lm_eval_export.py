"""A multiple-choice benchmark as an lm-evaluation-harness task folder.

    workbench eval export-lm-eval runs/rf_demo -o lm_tasks      # the run's distilled benchmark
    workbench eval export-lm-eval mmlu_test.csv -o lm_tasks --name mmlu_mine
    lm_eval --model hf --model_args pretrained=MODEL --include_path lm_tasks --tasks rf_demo

The folder holds the items (`NAME.jsonl`), a loader (`NAME_utils.py`, found next to the YAML
whatever the working directory, so the folder can be moved), and three tasks: `NAME_letter`
(the letter after the options, lm-eval's MMLU shape; metric acc), `NAME_cloze` (the option
texts after the question; acc and acc_norm) and the group `NAME` running both. Prompts are
written by the same functions `workbench eval` scores with `eval.template: raw`, so both tools
see the same strings and, on the same model, choose the same options (the full-tier test
checks it to the item).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from workbench.errors import WorkbenchError
from workbench.evaluate.benchmark import load_benchmark
from workbench.evaluate.mc import LETTERS, cloze_request, raw_prompt
from workbench.io import atomic_write_text, check_made_here
from workbench.records import MCItem

LOADER = '''"""Loads the items next to this file (written by `workbench eval export-lm-eval`)."""
import json
from pathlib import Path

import datasets


def load(**kwargs):
    path = Path(__file__).with_name("{data}")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    return datasets.DatasetDict({{"test": datasets.Dataset.from_list(rows)}})
'''

TASK = """task: {task}
custom_dataset: !function {utils}.load
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{{prompt}}}}}"
doc_to_choice: {choices}
doc_to_target: target
metric_list:
{metrics}metadata:
  version: 1
  source: "workbench eval export-lm-eval ({n} items)"
"""


def task_name(name: str) -> str:
    slug = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")
    if not slug:
        raise WorkbenchError(f"{name!r}: a task name needs letters or digits")
    return slug


class Exported(TypedDict):
    """What `export_lm_eval` wrote (export.json)."""

    group: str
    tasks: list[str]
    items: int
    skipped_multi_answer: int
    folder: str


def export_lm_eval(items: Sequence[MCItem], out: Path, name: str) -> Exported:
    """Write the task folder; returns what was written."""
    single = [it for it in items if len(it.answer) == 1]
    if not single:
        raise WorkbenchError("the benchmark has no single-answer item: nothing to export")
    skipped = len(items) - len(single)  # lm-eval's multiple_choice has one target
    items = single
    name = task_name(name)
    check_made_here(out, ("export.json",))  # absent, empty, or an earlier export: never a
    out.mkdir(parents=True, exist_ok=True)  # folder of the user's own files
    rows = []
    for it in items:
        rows.append({"id": it.id, "question": it.question, "options": list(it.options),
                     "letters": list(LETTERS[:len(it.options)]),
                     "target": LETTERS.index(it.answer[0]),
                     "letter_prompt": raw_prompt(it),
                     "cloze_prompt": cloze_request(it, None, "raw").prompt})
    data, utils = f"{name}.jsonl", f"{name}_utils"
    atomic_write_text(out / data, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                          for r in rows))
    atomic_write_text(out / f"{utils}.py", LOADER.format(data=data))
    acc = "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    norm = "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n"
    tasks = {f"{name}_letter": ("letter_prompt", "letters", acc),
             f"{name}_cloze": ("cloze_prompt", "options", acc + norm)}
    for task, (prompt, choices, metrics) in tasks.items():
        atomic_write_text(out / f"{task}.yaml", TASK.format(
            task=task, utils=utils, prompt=prompt, choices=choices, metrics=metrics,
            n=len(rows)))
    atomic_write_text(out / f"{name}.yaml",
                      f"group: {name}\ntask:\n" + "".join(f"  - {t}\n" for t in tasks)
                      + "aggregate_metric_list:\n  - metric: acc\n    weight_by_size: true\n"
                      "metadata:\n  version: 1\n")
    done: Exported = {"group": name, "tasks": list(tasks), "items": len(rows),
                      "skipped_multi_answer": skipped, "folder": str(out)}
    atomic_write_text(out / "export.json", json.dumps(done, indent=1) + "\n")  # written last
    return done


def benchmark_of(source: Path) -> tuple[list[MCItem], str]:
    """(items, default task name) of a run folder (its distilled benchmark) or a benchmark
    file in any layout `workbench eval` reads."""
    return load_benchmark(source), (source.name if source.is_dir() else source.stem)
