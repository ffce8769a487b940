"""A researcher's own library as the literature-search pack's corpus: BibTeX, RIS, PubMed XML,
OpenAlex or Semantic Scholar JSONL, read into `Paper`s with their citations where the format
has them, and evaluation intents made from it the way the shipped dev set was made.

    agent.data: mylibrary.bib          # one file
    agent.data: exports/               # or a folder of such files (merged; ids deduplicated)

Ids: the PMID where the record has one, else the DOI (lower case), else the source's own id
(OpenAlex W-id, Semantic Scholar paperId, BibTeX key, RIS ID). Keywords (BibTeX `keywords`, RIS
KW, MeSH, OpenAlex keywords/concepts/topics, Semantic Scholar fields of study) fill the
headings the filters and the relevance grades use. References count only when they point
at a paper of the library. BibTeX and RIS exports carry no citations: a library without any
runs with the citation operators off (the agent is told, nothing fails).

Intents (`anchors_for`): papers with at least two in-library citation neighbours (or, in a
library without citations, any paper with keywords) whose graded relevance has three papers
of grade >= 2; grades as in `data.grades_for`: 3 cites or is cited by, 2 shares three
references or half the keywords, 1 shares a major heading and two keywords. A library with
no keywords at all is graded on each paper's four most particular title and abstract words
(`derived_terms`; grade 2: two of them in common), a lexical stand-in weaker than a person's
keywords; a record whose keys
clash with another paper's is kept apart and counted (`_resolve`).
"""

from __future__ import annotations

import itertools
import random
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from workbench.agent_packs.litsearch.data import anchor_grades, count_medline, parse_medline
from workbench.agent_packs.litsearch.papers import Intent, Paper
from workbench.errors import DataError, WorkbenchError
from workbench.io import iter_jsonl_raw, sha256_file
from workbench.progress import count, progress, tally

FORMATS = {".bib": "bibtex", ".bibtex": "bibtex", ".ris": "ris", ".xml": "pubmed",
           ".jsonl": "jsonl", ".json": "jsonl", ".gz": "pubmed"}
MAX_MB = 512  # one library file; larger exports should be split
# where reference managers and databases put a record's keywords in BibTeX (Zotero, JabRef:
# keywords; Scopus: author_keywords; Web of Science: keywords-plus, research-areas,
# web-of-science-categories; Mendeley: mendeley-tags; PubMed exports: mesh)
BIBTEX_KEYWORDS = ("keywords", "keyword", "author_keywords", "author-keywords",
                   "keywords-plus", "keywords_plus", "mesh", "mesh-headings", "mendeley-tags",
                   "tags", "research-areas", "web-of-science-categories")


def library_files(folder: Path) -> list[Path]:
    """The library files directly inside `folder` (regular files, not links)."""
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.is_symlink()
                  and _format(p) is not None)


def library_hash(path: str | Path) -> str:
    """sha256 over a library file, or over the library files of a folder (names and
    contents), so a stage keyed on it reruns when an export changes."""
    import hashlib

    path = Path(path)
    files = library_files(path) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + sha256_file(f).encode() + b"\n")
    return h.hexdigest()


def _format(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(".xml.gz"):
        return "pubmed"
    if name.endswith(".gz"):
        return None
    return FORMATS.get(path.suffix.lower())


def read_library(path: str | Path) -> tuple[dict[str, Paper], dict[str, Any]]:
    """(papers by id, a summary: format per file, records, skipped, citation edges)."""
    path = Path(path)
    if path.is_dir():
        files = library_files(path)
        if not files:
            raise WorkbenchError(f"{path}: no library file (.bib, .ris, PubMed .xml/.xml.gz, "
                                 "OpenAlex or Semantic Scholar .jsonl) and no papers.jsonl")
    elif path.is_file():
        if _format(path) is None:
            raise DataError("not a library file (.bib, .ris, .xml, .xml.gz, .jsonl)",
                            path=str(path), code="unsupported")
        files = [path]
    else:
        raise DataError("not found", path=str(path), code="not_found")

    records: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"files": {}, "skipped_without_title": 0}
    # a log's lines count files and, inside one (a 30,000-record export), its records read
    # of those it holds (counted in its text first), with a rate and the time left
    for f in progress(files, desc="reading the library", unit="file", delay=2):
        if f.stat().st_size > MAX_MB * 2**20:
            raise DataError(f"{f.stat().st_size / 2**20:.0f} MB is over the {MAX_MB} MB "
                            "limit for one library file: split the export", path=str(f),
                            code="too_large")
        fmt = _format(f)
        if fmt is None:  # library_files lists only files of a known format
            raise DataError("not a library file (.bib, .ris, .xml, .xml.gz, .jsonl)",
                            path=str(f), code="unsupported")
        with count("records read", None, "record", delay=2) as counter:
            read = _Counted(counter)
            kind = {"bibtex": _bibtex, "ris": _ris, "pubmed": _pubmed, "jsonl": _jsonl}[fmt](
                f, read)
        summary["files"][f.name] = {"format": kind, "records": len(read)}
        records += read
    papers = _resolve(records, summary)
    summary["papers"] = len(papers)
    summary["citation_edges"] = sum(len(p.refs) for p in papers.values())
    if not papers:
        raise WorkbenchError(f"{path}: no paper with a title in {', '.join(summary['files'])}")
    return papers, summary


# --- one record shape for every format --------------------------------------------------------
# {"ids": [preferred id first, other ids...], "title", "abstract", "year", "journal",
#  "keywords", "major", "refs": [ids as the source names them], "cited_by": [ids]}

def _clean(s: Any) -> str:
    return " ".join(str(s or "").replace("{", "").replace("}", "").split())


def _doi(s: Any) -> str | None:
    s = str(s or "").strip().lower()
    s = re.sub(r"^(https?://(dx\.)?doi\.org/|doi:)", "", s)
    return s or None


def _year(s: Any) -> int | None:
    m = re.search(r"\d{4}", str(s or ""))
    return int(m.group()) if m else None


def _split_keywords(s: Any) -> list[str]:
    if isinstance(s, list):
        return [_clean(k) for k in s if _clean(k)]
    return [k.strip() for k in re.split(r"[;,]", _clean(s)) if k.strip()]


class _Counted(list):
    """A reader's records: each one appended is counted in the progress lines, of the total
    the reader `expect`s once it has counted the file's records in its text."""

    def __init__(self, counter: Any):
        super().__init__()
        self.counter = counter

    def append(self, record: Any) -> None:
        super().append(record)
        self.counter.add(1)

    def expect(self, total: int | None) -> None:
        self.counter.expect(total)


# each reader appends the file's records to `out` as it reads them (counted in the progress
# lines, of the total it tells `out` first) and returns the format's name

CHUNK_RECORDS = 500  # BibTeX and RIS are parsed this many records at a time (~2 s of BibTeX)
# a BibTeX block's start, an entry's (not @string, @comment or @preamble), a @string's
_BIB_BLOCK = re.compile(r"^[ \t]*@", re.M)
_BIB_ENTRY = re.compile(r"^[ \t]*@(?!(?:string|comment|preamble)\b)\w+[ \t]*[{(]", re.M | re.I)
_BIB_STRING = re.compile(r"[ \t]*@string\b", re.I)
_RIS_END = re.compile(r"^ER  -.*$\n?", re.M)


def _bibtex_chunks(text: str) -> list[tuple[str, int, int]]:
    """`text` cut into pieces of about CHUNK_RECORDS blocks, only where its braces balance
    (never inside an entry): (the piece, with every @string of the file before it so that
    its macros resolve wherever they are defined; the lines of those @strings; the file's
    line the piece starts at, counted from 0). A file of fewer blocks is one piece."""
    starts = [m.start() for m in _BIB_BLOCK.finditer(text)]
    if len(starts) <= CHUNK_RECORDS:
        return [(text, 0, 0)]
    ends = [*starts[1:], len(text)]
    strings = "".join(text[a:b] for a, b in zip(starts, ends, strict=True)
                      if _BIB_STRING.match(text, a))
    prefix = strings + ("\n" if strings and not strings.endswith("\n") else "")
    pre_lines = prefix.count("\n")
    cuts, depth, since = [0], 0, 0
    for a, b in zip(starts, ends, strict=True):
        if since >= CHUNK_RECORDS and depth == 0:
            cuts.append(a)
            since = 0
        depth += text.count("{", a, b) - text.count("}", a, b)
        since += 1
    cuts.append(len(text))
    pieces, line = [], 0
    for a, b in itertools.pairwise(cuts):
        pieces.append((prefix + text[a:b], pre_lines, line))
        line += text.count("\n", a, b)
    return pieces


def _bibtex(path: Path, out: list[dict]) -> str:
    import bibtexparser
    from bibtexparser.middlewares import LatexDecodingMiddleware
    from bibtexparser.model import DuplicateBlockKeyBlock, Entry

    text = _text(path)
    if isinstance(out, _Counted):
        out.expect(len(_BIB_ENTRY.findall(text)))
    for piece, extra, first in _bibtex_chunks(text):
        lib = bibtexparser.parse_string(piece, append_middleware=[LatexDecodingMiddleware()])
        entries: list = list(lib.entries)  # Entry, and a duplicate key's second Entry
        for b in lib.failed_blocks:
            if isinstance(b, DuplicateBlockKeyBlock) and b.ignore_error_block is not None:
                if isinstance(b.ignore_error_block, Entry):
                    entries.append(b.ignore_error_block)  # a key used twice: both are read
                continue  # a @string defined twice (each piece has them all): the first
            raise DataError(f"BibTeX entry not parsed ({type(b).__name__}: "
                            f"{_clean(b.raw)[:80]})", path=str(path),
                            line=None if b.start_line is None else
                            b.start_line - extra + first + 1, code="bad_record")
        _bibtex_records(entries, out)
    return "bibtex"


def _bibtex_records(entries: list, out: list[dict]) -> None:
    for e in entries:
        f = {k.lower(): v.value for k, v in e.fields_dict.items()}
        ids = [x for x in (str(f.get("pmid", "")).strip() or None, _doi(f.get("doi")),
                           e.key) if x]
        keywords = [k for name in BIBTEX_KEYWORDS for k in _split_keywords(f.get(name))]
        out.append({"ids": ids, "own": e.key, "title": _clean(f.get("title")),
                    "abstract": _clean(f.get("abstract")), "year": _year(f.get("year")),
                    "journal": _clean(f.get("journal") or f.get("booktitle")),
                    "keywords": list(dict.fromkeys(keywords)), "major": [], "refs": []})


def _ris(path: Path, out: list[dict]) -> str:
    text = _text(path)
    ends = [m.end() for m in _RIS_END.finditer(text)]
    if isinstance(out, _Counted):
        out.expect(len(ends))
    cuts = [0, *ends[CHUNK_RECORDS - 1::CHUNK_RECORDS]]
    if cuts[-1] < len(text):
        cuts.append(len(text))
    for a, b in itertools.pairwise(cuts):
        _ris_records(text[a:b], path, out)
    return "ris"


def _ris_records(text: str, path: Path, out: list[dict]) -> None:
    import rispy

    try:
        entries = rispy.loads(text)
    except Exception as e:  # noqa: BLE001  rispy raises plain IOError/ValueError with the line
        raise DataError(f"RIS not parsed ({e})", path=str(path), code="bad_record") from None
    for r in entries:
        pmid = next((str(r[k]).strip() for k in ("pubmed_id",) if r.get(k)), None)
        ids = [x for x in (pmid, _doi(r.get("doi")), str(r.get("id") or "").strip() or None)
               if x]
        out.append({"ids": ids, "own": str(r.get("id") or "").strip() or None,
                    "title": _clean(r.get("title") or r.get("primary_title")),
                    "abstract": _clean(r.get("abstract")),
                    "year": _year(r.get("year") or r.get("publication_year")),
                    "journal": _clean(r.get("journal_name") or r.get("secondary_title")
                                      or r.get("alternate_title1")),
                    "keywords": _split_keywords(r.get("keywords") or []), "major": [],
                    "refs": []})


def _pubmed(path: Path, out: list[dict]) -> str:
    start = len(out)
    if isinstance(out, _Counted):
        out.expect(count_medline(path))
    parse_medline(path, out)  # MEDLINE's records, counted as they are read, then converted
    out[start:] = [{"ids": [p["pmid"]], "title": p["title"], "abstract": p["abstract"],
                    "year": p["year"], "journal": p["journal"], "keywords": p["mesh"],
                    "major": p["major"], "refs": p["refs"]} for p in out[start:]]
    return "pubmed"


def _jsonl(path: Path, out: list[dict]) -> str:
    kinds = set()
    if isinstance(out, _Counted):
        with open(path, "rb") as fh:  # one record a line (blank ones are skipped)
            out.expect(sum(1 for line in fh if line.strip()))
    # one record a line; bad UTF-8 or JSON raise naming the file and line
    for n, r in iter_jsonl_raw(path):  # a line nested too deeply: one DataError
        if not isinstance(r, dict):
            raise DataError("a record must be a JSON object", path=str(path), line=n,
                            code="bad_record")
        if "paperId" in r or "corpusid" in r or "externalIds" in r or "externalids" in r:
            kind, read = "semanticscholar", _s2
        elif "referenced_works" in r or str(r.get("id", "")).startswith(
                "https://openalex.org/") or "display_name" in r:
            kind, read = "openalex", _openalex
        else:
            raise DataError("neither an OpenAlex work (id, referenced_works) nor a "
                            "Semantic Scholar paper (paperId)", path=str(path), line=n,
                            code="bad_record")
        try:
            out.append(read(r))
        except (TypeError, AttributeError, ValueError, KeyError) as e:
            raise DataError(f"a {kind} record with a field of an unexpected type "
                            f"({type(e).__name__}: {str(e)[:120]})", path=str(path), line=n,
                            code="bad_record") from None
        kinds.add(kind)
    return "+".join(sorted(kinds)) or "jsonl"


def _openalex_id(s: Any) -> str | None:
    s = str(s or "").rstrip("/")
    return s.rsplit("/", 1)[-1] or None


def _openalex(r: dict) -> dict:
    ids = r.get("ids") or {}
    pmid = _openalex_id(ids.get("pmid")) if ids.get("pmid") else None
    inv = r.get("abstract_inverted_index") or {}
    words = sorted((pos, w) for w, places in inv.items() for pos in places)
    source = ((r.get("primary_location") or {}).get("source") or {})
    keywords = [k.get("display_name") for key in ("keywords", "concepts", "topics")
                for k in (r.get(key) or []) if isinstance(k, dict) and k.get("display_name")]
    return {"ids": [x for x in (pmid, _doi(r.get("doi")), _openalex_id(r.get("id"))) if x],
            "title": _clean(r.get("title") or r.get("display_name")),
            "abstract": " ".join(w for _, w in words), "year": r.get("publication_year"),
            "journal": _clean(source.get("display_name")),
            "keywords": list(dict.fromkeys(_clean(k) for k in keywords)), "major": [],
            "refs": [x for x in map(_openalex_id, r.get("referenced_works") or []) if x]}


def _s2(r: dict) -> dict:
    ext = {k.lower(): v for k, v in (r.get("externalIds") or r.get("externalids") or {}).items()}
    own = str(r.get("paperId") or r.get("corpusid") or "").strip() or None
    fields = [f if isinstance(f, str) else f.get("category") for f in
              (r.get("fieldsOfStudy") or []) + (r.get("s2FieldsOfStudy") or [])]

    def ids_of(items):
        out = []
        for x in items or []:
            x = x.get("paperId") or x.get("corpusId") if isinstance(x, dict) else x
            if x:
                out.append(str(x))
        return out

    return {"ids": [x for x in (str(ext.get("pubmed") or "").strip() or None,
                                _doi(ext.get("doi")), own) if x],
            "title": _clean(r.get("title")), "abstract": _clean(r.get("abstract")),
            "year": r.get("year"), "journal": _clean(r.get("venue")),
            "keywords": list(dict.fromkeys(_clean(f) for f in fields if f)), "major": [],
            "refs": ids_of(r.get("references")), "cited_by": ids_of(r.get("citations"))}


def _text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 (byte {e.start})", path=str(path),
                        code="bad_encoding") from None


def _title_key(title: str) -> str:
    return re.sub(r"[^0-9a-z]", "", title.casefold())


def _resolve(records: list[dict], summary: dict) -> dict[str, Paper]:
    """Papers keyed by their preferred id; references mapped through every id a paper has
    and kept only inside the library; a paper seen twice (two exports: the same PMID or DOI,
    or the same file id and title) is merged. Records that share only a file's own id (a RIS
    ID, a BibTeX key) under different titles stay two papers, the later one's id suffixed
    (`1-2`), and `summary["shared_ids"]` counts them."""
    alias: dict[str, str] = {}
    merged: dict[str, dict] = {}
    clashes: list[str] = []
    for r in records:
        if not r["title"] or not r["ids"]:
            summary["skipped_without_title"] += 1
            continue
        ids = list(r["ids"])
        own = (r.get("own") or "").lower()
        key = next((alias[i.lower()] for i in ids if i.lower() in alias), ids[0])
        if key in merged and own and not any(
                i.lower() in alias for i in ids if i.lower() != own) and \
                _title_key(merged[key]["title"]) != _title_key(r["title"]):
            # only a file's own id (a RIS ID, a BibTeX key) matches, and the titles differ:
            # two papers that share an id, not one paper twice; each keeps its own
            n = 2
            while f"{ids[-1]}-{n}".lower() in alias:
                n += 1
            clashes.append(ids[-1])
            ids = [i for i in ids if i.lower() != own] + [f"{ids[-1]}-{n}"]
            key = next((alias[i.lower()] for i in ids if i.lower() in alias), ids[0])
        for i in ids:
            alias.setdefault(i.lower(), key)
        if key in merged:
            m = merged[key]
            for f in ("abstract", "journal", "year"):
                m[f] = m[f] or r[f]
            for f in ("keywords", "major", "refs", "cited_by"):
                m[f] = list(dict.fromkeys([*m.get(f, []), *r.get(f, [])]))
        else:
            merged[key] = {**r, "cited_by": list(r.get("cited_by", []))}
    if clashes:  # said in the summary: never merged in silence
        summary["shared_ids"] = {"records": len(clashes), "ids": sorted(set(clashes))[:20]}
    refs: dict[str, set[str]] = defaultdict(set)
    for key, r in merged.items():
        for x in r["refs"]:
            if (t := alias.get(str(x).lower())) and t != key:
                refs[key].add(t)
        for x in r["cited_by"]:  # Semantic Scholar's citations: the other paper cites this
            if (t := alias.get(str(x).lower())) and t != key:
                refs[t].add(key)
    return {key: Paper(pmid=key, title=r["title"], abstract=r["abstract"],
                       year=r["year"] if isinstance(r["year"], int) else _year(r["year"]),
                       journal=r["journal"], mesh=r["keywords"], major=r["major"],
                       refs=sorted(refs[key])) for key, r in merged.items()}


# --- intents ----------------------------------------------------------------------------------

def anchors_for(papers: dict[str, Paper], *, anchors: int = 48, max_grade1: int = 25,
                seed: int = 7) -> list[Intent]:
    """Evaluation intents from the library itself (see the module's docstring). A library
    whose records carry no keywords at all (a BibTeX export without them) is graded on the
    words most particular to each paper's title and abstract instead (`derived_terms`)."""
    allp = {k: p.model_dump() for k, p in papers.items()}
    share = 0.5
    if not any(p.mesh for p in papers.values()):  # two of four particular words in common
        for k, terms in derived_terms(papers).items():
            allp[k]["mesh"] = terms
        share = 1 / 3
    cites: dict[str, set[str]] = defaultdict(set)
    cited_by: dict[str, set[str]] = defaultdict(set)
    ref_index: dict[str, set[str]] = defaultdict(set)
    for p in papers.values():
        for r in p.refs:
            ref_index[r].add(p.pmid)
            cites[p.pmid].add(r)
            cited_by[r].add(p.pmid)
    by_term: dict[str, set[str]] = defaultdict(set)
    for k, rec in allp.items():
        for t in rec["mesh"]:
            by_term[t].add(k)
    with_citations = any(p.refs for p in papers.values())
    cands = sorted(k for k in papers
                   if (len(cites[k] | cited_by[k]) >= 2 if with_citations
                       else bool(allp[k]["mesh"])))
    random.Random(seed).shuffle(cands)
    out: list[Intent] = []
    # counted: the intents made of those wanted (the loop ends there, usually long before
    # the candidates run out); the candidates graded so far move inside it
    with count("making intents", anchors, "intent", delay=2) as made, \
            tally("candidates graded", "paper") as tried:
        for pid in cands[:MAX_ANCHOR_TRIES]:
            tried.add()
            # only papers that can reach a grade: cited, citing, sharing a reference or a term
            near = {pid, *cites[pid], *cited_by[pid]}
            for r in allp[pid]["refs"]:
                near |= ref_index.get(r, set())
            for t in allp[pid]["mesh"]:
                near |= by_term[t]
            g = anchor_grades(pid, {k: allp[k] for k in near}, cites, cited_by, ref_index,
                              max_grade1, share)
            if g is None:
                continue
            g = dict(sorted(g.items()))
            i = len(out)
            p = papers[pid]
            out.append(Intent(id=f"ls-{i:03d}", anchor=pid, query=p.title,
                              intent=(p.major or allp[pid]["mesh"])[:3], relevance=g,
                              part="train" if i % 3 == 0 else "dev"))
            made.add()
            if len(out) == anchors:
                break
    return out


MAX_ANCHOR_TRIES = 5_000  # candidate anchors graded at most (a 30,000-paper library)
_STOP_WORDS = """about above after again against also although among analysis approach based
because been before being between both case cases could data different does during each
effect effects either from further have having here however into more most much must only
other over paper papers present presented provide provides result results same several
shown should show shows since some such than that their them then there these they this
those through under using very were what when where whether which while with within
without would study studies method methods model models used use also can may our its
new two three one first second well high higher low lower large small"""
_STOP = frozenset(_STOP_WORDS.split())


def derived_terms(papers: dict[str, Paper], per_paper: int = 4) -> dict[str, list[str]]:
    """For a library without keywords: each paper's `per_paper` words most its own (tf-idf
    over titles, counted twice, and abstracts), among words that at least two papers use and
    at most half of them."""
    import math
    from collections import Counter

    words = {k: re.findall(r"[a-z][a-z0-9-]{3,}", f"{p.title} {p.title} {p.abstract}".lower())
             for k, p in papers.items()}
    words = {k: [w for w in ws if w not in _STOP] for k, ws in words.items()}
    df = Counter(w for ws in words.values() for w in set(ws))
    n = len(papers)
    top = max(3, n // 2)
    out = {}
    for k, ws in words.items():
        tf = Counter(w for w in ws if 2 <= df[w] <= top)
        ranked = sorted(tf, key=lambda w: (-tf[w] * math.log(n / df[w]), w))
        out[k] = ranked[:per_paper]
    return out


def load_library(path: str | Path, log=None) -> tuple[dict[str, Paper], list[Intent]]:
    """Papers and intents of a library; `log` gets a line for each thing a person should
    know (records kept apart or skipped, keywords derived, no intents and why)."""
    papers, summary = read_library(path)
    intents = anchors_for(papers)
    for line in library_notes(path, papers, summary, intents) if log else ():
        log(line)
    return papers, intents


def library_notes(path: str | Path, papers: dict[str, Paper], summary: dict[str, Any],
                  intents: list[Intent]) -> list[str]:
    out = []
    if summary.get("shared_ids"):
        sh = summary["shared_ids"]
        out.append(f"{path}: {sh['records']} record(s) share an id with another paper under a "
                   f"different title (ids {', '.join(sh['ids'][:5])}): kept as separate "
                   "papers, the later one's id suffixed -2, -3...")
    if summary.get("skipped_without_title"):
        out.append(f"{path}: {summary['skipped_without_title']} record(s) without a title or "
                   "an id left out")
    if not any(p.mesh for p in papers.values()):
        out.append(f"{path}: no record has keywords: the evaluation's relevance grades use "
                   "each paper's most particular title and abstract words instead")
    if not intents:
        cites = any(p.refs for p in papers.values())
        out.append(f"{path}: no evaluation intents: none of the {len(papers)} papers has "
                   "three others related to it (" + ("citing or cited by it, or " if cites
                                                     else "") +
                   "sharing three references or half its keywords)")
    return out

