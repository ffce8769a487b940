"""Multiple-choice benchmarks as they come: our MCItem JSONL, MMLU/ARC-style JSON(L), CSV.

Recognised layouts (`fmt="auto"` tells them apart by file suffix and fields):

- `mcitem`: our own `MCItem` rows (`id`, `question`, `options`, `answer` letter, optional
  `difficulty` and `provenance`), validated strictly; `auto` reads such rows the same way.
- `mmlu`: JSON Lines (or one JSON array) with a question, its choices and an answer. The
  question is `question` (a string, or ARC's `{"stem", "choices"}`) or `stem`; the choices
  are `choices` or `options`, as a list of strings, a `{"text": [...], "label": [...]}`
  table (ARC on the Hugging Face hub), a list of `{"text", "label"}` objects (ARC's original
  files) or a `{"A": ..., "B": ...}` object, or else option fields (`A`, `B`, ... /
  `option_a` ... / `choice1` ...); the answer is `answer`, `answerKey`, `label`, `gold` or
  `correct`: a letter, a 0-based index, one of the choice labels, or an option's exact text.
- `csv` (also `.tsv`): a header row with a question column (`question` / `stem` / `prompt`),
  option columns (`A`, `B`, ...; `option_a` / `optionA` / `option a`; `choice1` / `choice_1`
  / `option1` ...) and an answer column (as for JSON), or MMLU's header-less files
  (`question, A, B, C, D, answer`).

`mapping` names other fields: `{"question": "stem", "choices": "opts", "answer": "label",
"id": "qid"}`; a dotted name reaches into nested objects (`"question.stem"`), and `"choices"`
may be a list of field (column) names. Rows without an id get `<file stem>-<line>`. Errors
name the file, the 1-based line (CSV: the row, counting the header) and the field. Items
have 2 to 10 options.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from workbench.errors import DataError
from workbench.io import describe_validation_error, iter_jsonl_raw
from workbench.records import LETTERS, MCItem, Provenance
from workbench.runs import RunLayout, outputs_at

BenchmarkFormat = Literal["auto", "mcitem", "mmlu", "csv"]
MIN_OPTIONS, MAX_OPTIONS = 2, len(LETTERS)
FIELDS = ("id", "question", "choices", "answer")
_NAMES = {"id": ("id", "question_id", "qid", "uid"),
          "question": ("question", "stem", "prompt", "query"),
          "choices": ("choices", "options"),
          "answer": ("answer", "answerKey", "answer_key", "label", "gold", "correct",
                     "correct_answer")}
_OPTION_FIELD = re.compile(r"^(?:(?:option|choice|opt)[\s_-]?)?([A-Ja-j]|10|[1-9])$", re.I)


def load_benchmark(path: str | Path, *, fmt: BenchmarkFormat = "auto",
                   mapping: Mapping[str, Any] | None = None, max_items: int | None = None
                   ) -> list[MCItem]:
    """The items of a benchmark file (or of a run folder's `distill/benchmark.jsonl`), in
    file order, the first `max_items` of them when set."""
    p = _resolve(Path(path))
    if mapping and (unknown := set(mapping) - set(FIELDS)):
        raise DataError(f"field_map names unknown fields {sorted(unknown)}; the fields are "
                        f"{', '.join(FIELDS)}", path=str(p))
    if fmt == "auto":
        fmt = "csv" if p.suffix.lower() in (".csv", ".tsv") else "mmlu"
    if fmt == "csv":
        items = _read_csv(p, dict(mapping or {}))
    else:
        items = [_mcitem(obj, p, line) if fmt == "mcitem" or (not mapping and _is_mcitem(obj))
                 else _from_json(obj, dict(mapping or {}), p, line)
                 for line, obj in _json_rows(p)]
    if not items:
        raise DataError("the benchmark has no items", path=str(p))
    seen: dict[str, int] = {}
    for i, it in enumerate(items):
        if it.id in seen:
            raise DataError(f"field 'id': {it.id!r} is used by items {seen[it.id] + 1} and "
                            f"{i + 1}; ids must be unique", path=str(p))
        seen[it.id] = i
    return items[:max_items] if max_items else items


def _is_mcitem(obj: Any) -> bool:
    return isinstance(obj, Mapping) and {"id", "question", "options", "answer"} <= set(obj) \
        <= set(MCItem.model_fields)


def _mcitem(obj: Any, p: Path, line: int) -> MCItem:
    try:
        item = MCItem.model_validate(obj)
    except ValueError as e:
        raise DataError(describe_validation_error(e), path=str(p), line=line) from None
    if len(item.options) > MAX_OPTIONS:
        raise DataError(f"field 'options': {len(item.options)} options; a benchmark item "
                        f"needs {MIN_OPTIONS} to {MAX_OPTIONS}", path=str(p), line=line)
    return item


def _resolve(p: Path) -> Path:
    if p.is_dir():
        # distill's declared benchmark, in a run folder or in a distill folder itself
        in_run, alone = (RunLayout.at(p).artifact("distill", "benchmark"),
                         outputs_at("distill", p).path("benchmark"))
        for cand in (in_run, alone):
            if cand.exists():
                return cand
        raise DataError(f"no {alone.name} (or {in_run.relative_to(p)}) in this folder",
                        path=str(p))
    if not p.exists():
        raise DataError("file not found", path=str(p), code="not_found")
    return p


def _json_rows(p: Path):
    """(line, object) of a JSONL file, or (item number, object) of a JSON array file."""
    head = p.read_bytes()[:4096].lstrip(b"\xef\xbb\xbf").lstrip()
    if head.startswith(b"["):
        try:
            data = json.loads(p.read_text(encoding="utf-8-sig"))
        except json.JSONDecodeError as e:
            raise DataError(f"bad JSON at line {e.lineno} column {e.colno}: {e.msg}",
                            path=str(p)) from None
        yield from enumerate(data, start=1)
    else:
        yield from iter_jsonl_raw(p)


def _get(obj: Mapping, name: str) -> Any:
    cur: Any = obj
    for part in name.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _pick(obj: Mapping, field: str, mapping: Mapping[str, Any]) -> tuple[str | None, Any]:
    if field in mapping:
        return mapping[field], _get(obj, mapping[field])
    for name in _NAMES[field]:
        if name in obj:
            return name, obj[name]
    return None, None


def _choices(value: Any) -> tuple[list[Any], list[str] | None]:
    """(choice texts, their labels if the file gives labels)."""
    if isinstance(value, Mapping):
        if "text" in value:
            return list(value["text"]), [str(x) for x in value["label"]] \
                if "label" in value else None
        return list(value.values()), [str(k) for k in value]
    if isinstance(value, list) and value and all(isinstance(c, Mapping) for c in value):
        return [c.get("text") for c in value], [str(c.get("label")) for c in value] \
            if all("label" in c for c in value) else None
    if isinstance(value, list):
        return value, None
    raise ValueError("expected a list of options or a {label: text} object")


def _answer_letter(value: Any, texts: list[str], labels: list[str] | None) -> str:
    n = len(texts)
    if isinstance(value, bool) or value is None:
        raise ValueError(f"expected a letter or a 0-based index, got {value!r}")
    s = str(value).strip()
    if labels is not None and s in labels:
        return LETTERS[labels.index(s)]
    if isinstance(value, int) or s.isdigit():
        i = int(s)
        if not 0 <= i < n:
            raise ValueError(f"index {i} is outside 0..{n - 1} (answers are a letter or a "
                             "0-based index)")
        return LETTERS[i]
    m = re.fullmatch(r"\(?([A-Ja-j])[).]?", s)
    if m and m.group(1).upper() in LETTERS[:n]:
        return m.group(1).upper()
    if texts.count(s) == 1:  # the answer written out as the option's text
        return LETTERS[texts.index(s)]
    raise ValueError(f"{value!r} is not one of the {n} options ({LETTERS[0]}-{LETTERS[n - 1]}, "
                     f"0..{n - 1}, or an option's exact text)")


def _item(p: Path, line: int, *, item_id: Any, question: Any, options: list[Any],
          labels: list[str] | None, answer: Any, names: Mapping[str, str | None],
          rest: Mapping[str, Any] | None = None) -> MCItem:
    def bad(field: str, msg: str) -> DataError:
        return DataError(f"field {names.get(field) or field!r}: {msg}", path=str(p), line=line)

    if isinstance(question, Mapping) and "stem" in question:
        question = question["stem"]
    if not isinstance(question, str) or not question.strip():
        raise bad("question", "missing or empty" if question in (None, "") else
                  f"expected text, got {type(question).__name__}")
    if not MIN_OPTIONS <= len(options) <= MAX_OPTIONS:
        raise bad("choices", f"{len(options)} options; a benchmark item needs "
                             f"{MIN_OPTIONS} to {MAX_OPTIONS}")
    texts = []
    for i, o in enumerate(options):
        if isinstance(o, bool) or not isinstance(o, str | int | float) or not str(o).strip():
            raise bad("choices", f"option {i + 1} is empty or not text ({o!r})")
        texts.append(str(o).strip())
    if answer is None or answer == "":
        raise bad("answer", "missing")
    try:
        letter = _answer_letter(answer, texts, labels)
    except ValueError as e:
        raise bad("answer", str(e)) from None
    extra = {k: rest[k] for k in ("difficulty", "provenance") if rest and rest.get(k) is not None}
    group = next((str(rest[k]).strip() for k in SUBSET_FIELDS if rest and rest.get(k)
                  not in (None, "")), None)
    try:
        if "provenance" in extra:
            extra["provenance"] = Provenance.model_validate(extra["provenance"])
        elif group:  # a subset (MMLU's subject) travels as the provenance's document
            extra["provenance"] = Provenance(section_id=str(item_id or f"{p.stem}-{line}"),
                                             span_hash="", doc_id=group)
        return MCItem(id=str(item_id) if item_id not in (None, "") else f"{p.stem}-{line}",
                      question=question.strip(), options=texts, answer=letter, **extra)
    except ValueError as e:
        raise DataError(describe_validation_error(e), path=str(p), line=line) from None


# a column naming each item's group (the improvement loop's subsets; MMLU's subject)
SUBSET_FIELDS = ("subset", "subject", "category")


def _option_fields(names: list[str]) -> list[str]:
    """Fields that look like options (A, B, ...; option_a ...; choice1 ...), in order, from
    one family only (letters, else numbers)."""
    letters, numbers = [], []
    for name in names:
        m = _OPTION_FIELD.match(name.strip())
        if m:
            key = m.group(1).upper()
            if key.isdigit():
                numbers.append((int(key), name))
            else:
                letters.append((LETTERS.index(key), name))
    family = sorted(letters) if len(letters) >= MIN_OPTIONS else sorted(numbers)
    return [name for _, name in family]


def _from_json(obj: Any, mapping: dict, p: Path, line: int) -> MCItem:
    if not isinstance(obj, Mapping):
        raise DataError(f"expected a JSON object, got {type(obj).__name__}", path=str(p),
                        line=line)
    names: dict[str, str | None] = {}
    values: dict[str, Any] = {}
    for field in ("id", "question", "answer"):
        names[field], values[field] = _pick(obj, field, mapping)
    q = values["question"]
    choice_fields = mapping.get("choices")
    if isinstance(choice_fields, list):
        missing = [f for f in choice_fields if _get(obj, f) is None]
        if missing:
            raise DataError(f"field {missing[0]!r}: missing", path=str(p), line=line)
        options, labels = [_get(obj, f) for f in choice_fields], None
        names["choices"] = ",".join(choice_fields)
    else:
        names["choices"], value = _pick(obj, "choices", mapping)
        if value is None and isinstance(q, Mapping) and "choices" in q:
            names["choices"], value = "question.choices", q["choices"]
        if value is None and "choices" not in mapping:
            fields = _option_fields([k for k in obj if k not in names.values()])
            if len(fields) >= MIN_OPTIONS:
                value, names["choices"] = {f: obj[f] for f in fields}, ",".join(fields)
        if value is None:
            raise DataError(f"field {names['choices'] or 'choices'!r}: missing (looked for "
                            f"{', '.join(_NAMES['choices'])} and option fields A, B, ...; "
                            "name another with a field map)", path=str(p), line=line)
        try:
            options, labels = _choices(value)
        except (ValueError, TypeError, KeyError) as e:
            raise DataError(f"field {names['choices']!r}: {e}", path=str(p),
                            line=line) from None
        if labels is not None and names["choices"] and "," in names["choices"]:
            labels = None  # option fields A, B, ...: their names are not answer labels
    return _item(p, line, item_id=values["id"], question=q, options=options, labels=labels,
                 answer=values["answer"], names=names, rest=obj)


def _read_csv(p: Path, mapping: dict) -> list[MCItem]:
    text = p.read_text(encoding="utf-8-sig")
    delimiter = "\t" if p.suffix.lower() == ".tsv" else ","
    rows = [(i, r) for i, r in enumerate(csv.reader(text.splitlines(), delimiter=delimiter),
                                         start=1) if any(c.strip() for c in r)]
    if not rows:
        return []
    head_line, header = rows[0][0], [c.strip() for c in rows[0][1]]
    lower = {c.lower(): c for c in header}

    def column(field: str) -> str | None:
        if field in mapping:
            return mapping[field]
        return next((lower[n.lower()] for n in _NAMES[field] if n.lower() in lower), None)

    q_col = column("question")
    if q_col is None and not mapping and re.fullmatch(r"[A-Ja-j]", header[-1]):
        # MMLU's files: no header; question, options..., answer letter
        return [_headerless(p, line, r) for line, r in rows]
    a_col, id_col = column("answer"), column("id")
    opt_cols = mapping.get("choices") or _option_fields(
        [c for c in header if c not in (q_col, a_col, id_col)])
    opt_cols = [opt_cols] if isinstance(opt_cols, str) else list(opt_cols)
    for field, col in (("question", q_col), ("answer", a_col),
                       *(("choices", c) for c in opt_cols)):
        if col is None or col not in header:
            looked = f"no column {col!r}" if col else \
                f"no column named {' / '.join(_NAMES[field])}"
            raise DataError(f"field {field!r}: {looked} in the header ({', '.join(header)}); "
                            f"name it with field_map.{field}", path=str(p), line=head_line)
    if len(opt_cols) < MIN_OPTIONS:
        raise DataError(f"field 'choices': option columns {opt_cols or 'none'} in the header "
                        f"({', '.join(header)}); name them A, B, ... or option_a ... or "
                        "choice1 ..., or list them in field_map.choices", path=str(p),
                        line=head_line)
    at = {c: header.index(c) for c in header}
    names = {"question": q_col, "choices": ",".join(opt_cols), "answer": a_col, "id": id_col}
    items = []
    for line, r in rows[1:]:
        def cell(col: str | None, r=r) -> str | None:
            i = at.get(col) if col is not None else None
            return r[i].strip() if i is not None and i < len(r) else None

        options = [cell(c) for c in opt_cols]
        while options and options[-1] in (None, ""):  # an item with fewer options
            options.pop()
        rest = {k: cell(lower[k]) for k in SUBSET_FIELDS if k in lower}
        items.append(_item(p, line, item_id=cell(id_col), question=cell(q_col),
                           options=options, labels=None, answer=cell(a_col), names=names,
                           rest=rest))
    return items


def _headerless(p: Path, line: int, r: list[str]) -> MCItem:
    cells = [c.strip() for c in r]
    if len(cells) < 2 + MIN_OPTIONS:
        raise DataError("no header with a question column, and too few columns for MMLU's "
                        "header-less layout (question, options..., answer)", path=str(p),
                        line=line)
    names = {"question": "column 1", "choices": f"columns 2-{len(cells) - 1}",
             "answer": f"column {len(cells)}"}
    return _item(p, line, item_id=None, question=cells[0], options=cells[1:-1], labels=None,
                 answer=cells[-1], names=names)
