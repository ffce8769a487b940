"""A site's private data, and splitting one QTSA dataset into sites for experiments.

A site folder holds `train.jsonl` (ChatExample: messages, sharegpt or alpaca), optionally
`eval.jsonl` (same formats) and `benchmark.jsonl` (MCItem), and `site.json` (its name and, for
split sites, which documents it got and the canaries planted in its rows). Nothing in it is
ever sent: the client app reads it from the path in its node config.
"""

from __future__ import annotations

import json
import random
import re
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.formats import read_dataset, to_chat, write_dataset
from workbench.io import atomic_write_json, read_jsonl, write_jsonl
from workbench.records import ChatExample, MCItem, QTSASample
from workbench.runs import RunLayout, outputs_at

REPO = Path(__file__).resolve().parents[2]
SITE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


@dataclass
class SiteData:
    name: str
    folder: Path
    train: list[ChatExample]
    eval: list[ChatExample] = field(default_factory=list)
    benchmark: list[MCItem] = field(default_factory=list)
    canaries: list[str] = field(default_factory=list)


def load_site(folder: str | Path) -> SiteData:
    """Read a site folder; every problem names the file (and line) at fault."""
    d = Path(folder)
    if not d.is_dir():
        raise WorkbenchError(f"site data folder {d} does not exist (node config data-path)")
    meta = {}
    if (d / "site.json").exists():
        try:
            meta = json.loads((d / "site.json").read_text())
        except json.JSONDecodeError as e:
            raise WorkbenchError(f"{d / 'site.json'}: not JSON ({e})") from None
    name = str(meta.get("name") or d.name)
    if not SITE_NAME.match(name):
        raise WorkbenchError(f"{d}: site name {name!r} must be 1-32 of a-z 0-9 _ - "
                             f"(it is the one string a site sends)")
    if not (d / "train.jsonl").exists():
        raise WorkbenchError(f"{d}: no train.jsonl (the site's SFT rows)")
    train = read_dataset(d / "train.jsonl", "auto")
    if not train:
        raise WorkbenchError(f"{d / 'train.jsonl'}: no rows")
    ev = read_dataset(d / "eval.jsonl", "auto") if (d / "eval.jsonl").exists() else []
    bench = (read_jsonl(d / "benchmark.jsonl", MCItem.model_validate)
             if (d / "benchmark.jsonl").exists() else [])
    return SiteData(name=name, folder=d, train=train, eval=ev, benchmark=bench,
                    canaries=list(meta.get("canaries", [])))


@dataclass
class _Split:
    """One split in progress: where the rows came from, how they are dealt, and the one
    random stream every step draws from (in a fixed order, so a seed gives the same sites)."""

    src: Path
    by: str
    sites: int
    eval_fraction: float
    canaries: int
    rng: random.Random
    to_chat: Callable[[QTSASample], ChatExample]
    owner: dict[str, int] = field(default_factory=dict)  # document -> site (by chapter)


def split_sites(source: str | Path, out: str | Path, *, sites: int, by: str = "chapter",
                eval_fraction: float = 0.2, canaries: int = 2, seed: int = 0) -> list[Path]:
    """Deal a distillation run's QTSA rows (and benchmark items) out to `sites` folders.

    by="chapter": each corpus document goes whole to one site (largest first, to the site
    with the fewest rows), so sites differ in topic as real sites do; "random": rows are
    dealt out at random. Each site keeps `eval_fraction` of its rows for held-out loss. With
    `canaries`, that many unique secret strings are appended to as many training rows."""
    src = Path(source)
    if not src.exists() and not src.is_absolute() and (REPO / src).exists():
        src = REPO / src  # the shipped sample, from any working folder
    rows, bench = _read_source(src)
    sp = _Split(src, by, sites, eval_fraction, canaries, random.Random(seed), to_chat)
    buckets = _deal(sp, rows)
    out = Path(out)
    _remove_extra_sites(out, sites)
    return [_write_site(sp, out / f"site-{i}", i, bucket, bench)
            for i, bucket in enumerate(buckets)]


def _read_source(src: Path) -> tuple[list[QTSASample], list[MCItem]]:
    """The run's training rows (benchmark rows left out) and its benchmark items."""
    # distill's declared samples and benchmark, in a distill folder or in a run folder's
    folders = (outputs_at("distill", src), RunLayout.at(src).outputs("distill"))
    rows: list[QTSASample] = []
    for name in ("samples_mc", "samples_nd"):
        for f in folders:
            if f.path(name).exists():
                rows += [s for s in f.read(name) if s.split == "train"]
                break
    if not rows:
        raise WorkbenchError(f"{src}: no {folders[0].path('samples_mc').name} / "
                             f"{folders[0].path('samples_nd').name} rows to split")
    bench = next((f for f in folders if f.path("benchmark").exists()), None)
    return rows, bench.read("benchmark") if bench else []


def _deal(sp: _Split, rows: list[QTSASample]) -> list[list[QTSASample]]:
    """The rows of each site, by whole documents or at random."""
    buckets: list[list[QTSASample]] = [[] for _ in range(sp.sites)]
    if sp.by == "chapter":
        docs: dict[str, list[QTSASample]] = {}
        for s in rows:
            docs.setdefault(s.provenance.doc_id or s.provenance.section_id, []).append(s)
        if len(docs) < sp.sites:
            raise WorkbenchError(f"{sp.src}: {len(docs)} documents cannot make {sp.sites} "
                                 f"sites by chapter; use split.by=random or fewer sites")
        for doc, items in sorted(docs.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            i = min(range(sp.sites), key=lambda j: (len(buckets[j]), j))
            buckets[i] += items
            sp.owner[doc] = i
    elif sp.by == "random":
        shuffled = rows[:]
        sp.rng.shuffle(shuffled)
        for k, s in enumerate(shuffled):
            buckets[k % sp.sites].append(s)
    else:
        raise WorkbenchError(f"split.by={sp.by!r}: use chapter or random")
    return buckets


def _remove_extra_sites(out: Path, sites: int) -> None:
    """Site folders of a previous split into more sites."""
    for old in out.glob("site-*"):
        if old.name.split("-")[-1].isdigit() and int(old.name.split("-")[-1]) >= sites \
                and (old / "site.json").exists():
            shutil.rmtree(old)


def _write_site(sp: _Split, d: Path, i: int, bucket: list[QTSASample],
                bench: list[MCItem]) -> Path:
    """Site `i`'s folder: its train rows (canaries planted), eval rows, benchmark items."""
    d.mkdir(parents=True, exist_ok=True)
    bucket = sorted(bucket, key=lambda s: s.id)
    sp.rng.shuffle(bucket)
    n_eval = max(1, round(len(bucket) * sp.eval_fraction))
    ev, tr = bucket[:n_eval], bucket[n_eval:]
    if not tr:
        raise WorkbenchError(f"site-{i} got {len(bucket)} rows: too few to train on")
    train = [sp.to_chat(s) for s in tr]
    planted = _plant_canaries(train, sp.canaries)
    write_dataset(d / "train.jsonl", train, "messages")
    write_dataset(d / "eval.jsonl", [sp.to_chat(s) for s in ev], "messages")
    site_bench = [b for b in bench if sp.owner.get(
                      (b.provenance.doc_id or "") if b.provenance else "", -1) == i] \
        if sp.by == "chapter" else bench[i::sp.sites]
    write_jsonl(d / "benchmark.jsonl", site_bench)
    atomic_write_json(d / "site.json", {
        "name": f"site-{i}", "source": str(sp.src), "by": sp.by,
        "documents": sorted(k for k, v in sp.owner.items() if v == i),
        "rows": {"train": len(tr), "eval": len(ev), "benchmark": len(site_bench)},
        "canaries": planted})
    return d


def _plant_canaries(train: list[ChatExample], n: int) -> list[str]:
    """Append a unique secret string to the last message of the first `n` rows."""
    planted = []
    for k in range(min(n, len(train))):
        token = f"CANARY-{secrets.token_hex(6)}"
        planted.append(token)
        msg = train[k].messages[-1]
        train[k].messages[-1] = msg.model_copy(
            update={"content": f"{msg.content}\n(site record {token})"})
    return planted


def site_folders(sites_dir: str | Path) -> list[Path]:
    d = Path(sites_dir)
    found = sorted(p for p in d.iterdir() if (p / "train.jsonl").exists()) if d.is_dir() else []
    if not found:
        raise WorkbenchError(f"{d}: no site folders (each needs a train.jsonl)")
    return found
