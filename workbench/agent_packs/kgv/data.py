"""The KG fact-verification dev set, built from Princeton WordNet 3.0 (Debian `wordnet-base`).

Knowledge graph: WordNet synsets are entities (label = first lemma, aliases = the other
lemmas), pointers are predicates. Documents: one per entity, its gloss plus sentences that
state the graph facts touching it, written either from the subject's side ("A dachshund is a
kind of dog.") or from the object's side ("Kinds of dog include the dachshund."), often under
an alias, so a verifier must find the right entry and sometimes expand aliases.

Claims: positives are graph facts; negatives are type-consistent object swaps from the same
predicate (the new object has the true object's lexicographer type where one exists, is an
object of that predicate elsewhere, never an ancestor of the subject, so the claim is false in
WordNet). Frequent predicates are "seen" (their train part feeds distillation); rare predicates
form the held-out "longtail" split.

`build(wordnet_dir, out)` writes `documents.jsonl` (Section records), `claims.jsonl`
(KGClaim records) and `summary.json`. The shipped `datasets/kgv/` was built with
`python -m workbench.agent_packs.kgv.data /usr/share/wordnet datasets/kgv`.
"""

from __future__ import annotations

import json
import random
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import DataError, WorkbenchError
from workbench.io import atomic_write_text, write_jsonl
from workbench.records import Section

# pointer symbol -> (predicate id, split, part of speech of both ends)
PREDICATES: dict[str, tuple[str, str, str]] = {
    "@": ("hypernym", "seen", "n"),
    "@i": ("instance_of", "seen", "n"),
    "#m": ("member_of", "seen", "n"),
    "#p": ("part_of", "seen", "n"),
    "#s": ("substance_of", "longtail", "n"),
    ";c": ("topic_domain", "longtail", "n"),
    ";r": ("region_domain", "longtail", "n"),
    "*": ("entails", "longtail", "v"),
    ">": ("causes", "longtail", "v"),
}

# how each predicate is stated in documents: (subject side, object side)
STATEMENTS: dict[str, tuple[str, str]] = {
    "hypernym": ("{s} is a kind of {o}.", "Kinds of {o} include {s}."),
    "instance_of": ("{s} is an instance of {o}.", "One example of {o} is {s}."),
    "member_of": ("{s} is a member of {o}.", "Members of {o} include {s}."),
    "part_of": ("{s} is a part of {o}.", "{o} has {s} as a part."),
    "substance_of": ("{s} is a substance that {o} is made of.",
                     "{o} is made partly of {s}."),
    "topic_domain": ("{s} is a term from the field of {o}.",
                     "The field of {o} uses the term {s}."),
    "region_domain": ("{s} is a term used in the region of {o}.",
                      "In {o}, people use the term {s}."),
    "entails": ("To {s} entails to {o}.", "To {o} is entailed by to {s}."),
    "causes": ("To {s} causes to {o}.", "To {o} can be caused by to {s}."),
}


@dataclass
class Synset:
    offset: str
    pos: str
    lemmas: list[str]
    gloss: str
    lexfile: str = ""  # the lexicographer file: a coarse semantic type (noun.animal, ...)
    pointers: list[tuple[str, str, str]] = field(default_factory=list)  # (sym, offset, pos)

    @property
    def key(self) -> str:
        return f"{self.pos}{self.offset}"

    @property
    def label(self) -> str:
        return self.lemmas[0]


def _lemma(word: str) -> str:
    import re

    return re.sub(r"\(.*\)$", "", word).replace("_", " ")


def read_data_file(path: Path, pos: str) -> dict[str, Synset]:
    """Parse a WordNet `data.*` file (wndb(5WN) format); a malformed line names its number."""
    out: dict[str, Synset] = {}
    with path.open(encoding="latin-1") as f:
        for n, line in enumerate(f, start=1):
            if line.startswith("  "):
                continue  # licence header
            try:
                head, _, gloss = line.partition(" | ")
                parts = head.split()
                offset, w_cnt = parts[0], int(parts[3], 16)
                words = [_lemma(parts[4 + 2 * i]) for i in range(w_cnt)]
                k = 4 + 2 * w_cnt
                p_cnt = int(parts[k])
                ptrs = [(parts[k + 1 + 4 * i], parts[k + 2 + 4 * i], parts[k + 3 + 4 * i])
                        for i in range(p_cnt)]
            except (IndexError, ValueError) as e:
                raise DataError(f"not a WordNet data line ({e})", path=str(path), line=n,
                                code="bad_line") from None
            gloss = gloss.strip().split(";")[0].strip().strip('"')
            seen: list[str] = []
            for w in words:
                if w.lower() not in (x.lower() for x in seen):
                    seen.append(w)
            out[f"{pos}{offset}"] = Synset(offset, pos, seen, gloss, parts[1], ptrs)
    return out


def load_wordnet(folder: str | Path) -> dict[str, Synset]:
    folder = Path(folder)
    files = {"n": folder / "data.noun", "v": folder / "data.verb"}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise WorkbenchError(f"WordNet data not found: {', '.join(missing)} (install Debian's "
                             "wordnet-base, or pass the folder holding data.noun/data.verb)")
    synsets: dict[str, Synset] = {}
    for pos, path in files.items():
        synsets.update(read_data_file(path, pos))
    return synsets


def graph_facts(synsets: dict[str, Synset]) -> dict[str, list[tuple[str, str]]]:
    """predicate -> (subject key, object key) for every pointer we use."""
    facts: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for s in synsets.values():
        for sym, off, pos in s.pointers:
            if sym in PREDICATES and pos == PREDICATES[sym][2] == s.pos:
                facts[PREDICATES[sym][0]].append((s.key, f"{pos}{off}"))
    return facts


def _ancestors(key: str, synsets: dict[str, Synset], depth: int = 12) -> set[str]:
    out: set[str] = set()
    frontier = {key}
    for _ in range(depth):
        nxt: set[str] = set()
        for k in frontier:
            s = synsets.get(k)
            if s:
                nxt |= {f"{p}{o}" for sym, o, p in s.pointers if sym in ("@", "@i")}
        nxt -= out
        if not nxt:
            break
        out |= nxt
        frontier = nxt
    return out


def _usable(s: Synset) -> bool:
    """Entities a small model can read: short single-word-ish labels, a gloss."""
    return len(s.label) <= 24 and len(s.gloss) >= 15 and s.label[:1].isalpha()


def build(wordnet_dir: str | Path, out: str | Path, *, per_seen: int = 60,
          per_longtail: int = 14, seed: int = 13) -> dict:
    """Sample claims per predicate (half true, half swapped), write the documents that state
    the true facts, and return the summary."""
    rng = random.Random(seed)  # one stream, drawn in this order: claims, documents, parts
    synsets = load_wordnet(wordnet_dir)
    claims, stated = _sample_claims(synsets, graph_facts(synsets), rng, per_seen, per_longtail)
    docs, fact_doc = _documents(synsets, claims, stated, rng)
    records = _claim_records(synsets, claims, fact_doc)
    by_pred = _assign_parts(records, rng)
    return _write(Path(out), docs, records, by_pred, seed)


def _sample_claims(synsets: dict[str, Synset], facts: dict[str, list[tuple[str, str]]],
                   rng: random.Random, per_seen: int, per_longtail: int
                   ) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """(claims, the facts the documents state): per predicate, facts with distinct subjects,
    every other one kept true and the rest refuted by a swapped object."""
    truth = {(p, s, o) for p, fs in facts.items() for s, o in fs}
    claims: list[dict] = []
    stated: list[tuple[str, str, str]] = []
    for pred, split, _ in PREDICATES.values():
        pool = [(s, o) for s, o in facts.get(pred, ()) if _usable(synsets[s])
                and _usable(synsets[o])
                and synsets[s].label.lower() != synsets[o].label.lower()]
        rng.shuffle(pool)
        objects = sorted({o for _, o in pool})
        by_type: dict[str, list[str]] = defaultdict(list)
        for o in objects:
            by_type[synsets[o].lexfile].append(o)
        picked = _distinct_subjects(pool, per_seen if split == "seen" else per_longtail)
        for i, (s, o) in enumerate(picked):
            stated.append((pred, s, o))
            if i % 2 == 0:
                claims.append({"s": s, "p": pred, "o": o, "label": "SUPPORTED", "split": split,
                               "gold": [s, o]})
                continue
            o2 = _swap_object(synsets, truth, rng, pred, s, o, by_type[synsets[o].lexfile],
                              objects)
            if o2 is not None:
                claims.append({"s": s, "p": pred, "o": o2, "label": "REFUTED", "split": split,
                               "gold": [s, o], "true_object": o})
    return claims, stated


def _distinct_subjects(pool: list[tuple[str, str]], want: int) -> list[tuple[str, str]]:
    """The first `want` facts of the pool, one per subject."""
    used_subjects: set[str] = set()
    picked = []
    for s, o in pool:
        if s in used_subjects:
            continue
        used_subjects.add(s)
        picked.append((s, o))
        if len(picked) == want:
            break
    return picked


def _swap_object(synsets: dict[str, Synset], truth: set[tuple[str, str, str]],
                 rng: random.Random, pred: str, s: str, o: str, same_type: list[str],
                 objects: list[str]) -> str | None:
    """An object that makes (s, pred, object) false in WordNet, or None after 60 tries."""
    anc = _ancestors(s, synsets) | {s}
    for attempt in range(60):  # same semantic type first: a plausible swap
        o2 = rng.choice(same_type if attempt < 40 and len(same_type) > 1 else objects)
        if (pred, s, o2) not in truth and o2 not in anc and o2 != o and \
                synsets[o2].label.lower() != synsets[o].label.lower():
            return o2
    return None


def _documents(synsets: dict[str, Synset], claims: list[dict],
               stated: list[tuple[str, str, str]], rng: random.Random
               ) -> tuple[list, dict[tuple[str, str, str], str]]:
    """(one Section per entity of a claim, fact -> the entity whose entry states it): each
    fact stated from one side, the subject under a random one of its names."""
    entities = sorted({c["s"] for c in claims} | {c["o"] for c in claims} |
                      {t for c in claims if (t := c.get("true_object"))})
    sentences: dict[str, list[str]] = defaultdict(list)
    fact_doc: dict[tuple[str, str, str], str] = {}
    for pred, s, o in stated:
        subj_side = rng.random() < 0.6
        name_s = rng.choice(synsets[s].lemmas) if rng.random() < 0.4 else synsets[s].label
        tpl = STATEMENTS[pred][0 if subj_side else 1]
        text = tpl.format(s=name_s, o=synsets[o].label)
        sentences[s if subj_side else o].append(text[0].upper() + text[1:])
        fact_doc[(pred, s, o)] = s if subj_side else o
    docs = []
    for order, key in enumerate(entities):
        syn = synsets[key]
        head = syn.label + (f" (also: {', '.join(syn.lemmas[1:4])})" if len(syn.lemmas) > 1
                            else "")
        text = f"{head}: {syn.gloss}.\n" + " ".join(sentences.get(key, []))
        docs.append(Section(id=f"wn-{key}", doc_id=f"wn-{key}", source="wordnet-3.0",
                            heading_path=[syn.label], text=text.strip(),
                            content_hash=_hash(text), order=order,
                            metadata={"pos": syn.pos, "aliases": syn.lemmas[1:]}))
    return docs, fact_doc


def _claim_records(synsets: dict[str, Synset], claims: list[dict],
                   fact_doc: dict[tuple[str, str, str], str]) -> list[dict]:
    """Claims as KGClaim records; the evidence is the entry that states the true fact."""
    records = []
    for i, c in enumerate(claims):
        s, o = synsets[c["s"]], synsets[c["o"]]
        gold_fact = (c["p"], c["gold"][0], c["gold"][1])
        records.append({
            "id": f"kgv-{i:04d}", "subject": {"id": s.key, "label": s.label,
                                              "aliases": s.lemmas[1:]},
            "predicate": c["p"], "object": {"id": o.key, "label": o.label,
                                            "aliases": o.lemmas[1:]},
            "label": c["label"], "split": c["split"],
            "evidence": [f"wn-{fact_doc[gold_fact]}"]})
    return records


def _assign_parts(records: list[dict], rng: random.Random) -> dict[str, list[dict]]:
    """Set each record's part: half of each seen predicate's claims train the student;
    long-tail claims are dev only. Returns the records by predicate."""
    by_pred: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_pred[r["predicate"]].append(r)
    for rs in by_pred.values():
        rng.shuffle(rs)
        for j, r in enumerate(rs):
            r["part"] = "train" if r["split"] == "seen" and j % 2 == 0 else "dev"
    return by_pred


def _write(out: Path, docs: list, records: list[dict], by_pred: dict[str, list[dict]],
           seed: int) -> dict:
    """documents.jsonl, claims.jsonl and summary.json; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "documents.jsonl", docs)
    atomic_write_text(out / "claims.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                    for r in records))
    summary = {"documents": len(docs), "claims": len(records),
               "by_predicate": {p: len(v) for p, v in sorted(by_pred.items())},
               "by_part": {k: sum(r["part"] == k for r in records) for k in ("train", "dev")},
               "by_label": {k: sum(r["label"] == k for r in records)
                            for k in ("SUPPORTED", "REFUTED")},
               "source": "Princeton WordNet 3.0 (Debian wordnet-base)", "seed": seed}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    return summary


def _hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


if __name__ == "__main__":
    print(json.dumps(build(sys.argv[1], sys.argv[2]), indent=1))
