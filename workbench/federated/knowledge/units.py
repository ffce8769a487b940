"""Track B: knowledge units evolved across sites (FedAgentKE), without raw data leaving them.

Each round a site receives its personalised view of the active units, works its local tasks
with them, proposes ExpeL-style operations (ADD / AGREE / EDIT / REMOVE, with counts), drops
every unit that fails the privacy filter (canaries, identifiers of its own data, n-gram overlap
with its trajectories), keeps only units that do not lower success on a local gate slice
(A/B), and sends the operations and counts. The server groups units (by their steps; free
text by embedding), votes by support (distinct sites, counts), promotes a unit to active only
when `k_min` sites support it, retires one that more count against than for, and sends each
site the active units of its task families.

What a site does with units is `site`'s business (the data-agent sites); this module is the
protocol: records, filter, gate, the knowledge base and its rounds on disk.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from workbench.io import append_line, atomic_write_json
from workbench.models.embed import load_embedder
from workbench.records import KnowledgeOp, StrictModel
from workbench.runs import outputs_at

OP_KINDS = ("ADD", "AGREE", "EDIT", "REMOVE")  # KnowledgeOp.op


class Unit(StrictModel):
    """A unit of shared know-how: a workflow (abstract steps with slots) or an insight."""

    id: str
    kind: Literal["workflow", "insight"] = "workflow"
    family: str
    text: str = Field(max_length=200)
    steps: list[str] = Field(default_factory=list)
    status: Literal["candidate", "active", "retired"] = "candidate"
    support: dict[str, int] = Field(default_factory=dict)  # site key -> count (server only)
    against: dict[str, int] = Field(default_factory=dict)
    created_round: int = 0
    promoted_round: int | None = None

    @staticmethod
    def make_id(kind: str, family: str, steps: Sequence[str], text: str) -> str:
        key = json.dumps([kind, family, list(steps)] if steps else [kind, family, text])
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    def public(self) -> dict[str, Any]:
        """What a site sees: no supporters, only counts."""
        pro, con = votes(self)
        return {"id": self.id, "kind": self.kind, "family": self.family, "text": self.text,
                "steps": self.steps, "sites": pro, "against": con,
                "support": sum(self.support.values())}


# --- the wire: ops as parallel lists of short strings and numbers ------------------------------

def ops_to_record(ops: Sequence[KnowledgeOp]) -> dict[str, Any]:  # a ConfigRecord's lists
    return {"op": [o.op for o in ops], "count": [o.count for o in ops],
            "target": [o.target for o in ops], "kind": [o.kind for o in ops],
            "family": [o.family for o in ops], "text": [o.text for o in ops],
            "steps": ["|".join(o.steps) for o in ops]}


def ops_from_record(rec: dict[str, Any]) -> list[KnowledgeOp]:
    keys = {"op", "count", "target", "kind", "family", "text", "steps"}
    if set(rec) != keys:
        raise ValueError(f"knowledge record keys {sorted(rec)}; expected {sorted(keys)}")
    n = len(rec["op"])
    if any(len(rec[k]) != n for k in keys):
        raise ValueError("knowledge record lists differ in length")
    return [KnowledgeOp(op=rec["op"][i], count=int(rec["count"][i]), target=rec["target"][i],
               kind=rec["kind"][i], family=rec["family"][i], text=rec["text"][i],
               steps=[s for s in str(rec["steps"][i]).split("|") if s]) for i in range(n)]


# --- the site side: privacy filter and A/B gate ----------------------------------------------

IDENT = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+|\b\d{4,}\b|'[^']*'|\"[^\"]*\"")


@dataclass
class PrivacyFilter:
    """Drops a unit that carries a canary or one of the site's own identifiers (table, column
    and value names it was told about), or that shares a word n-gram with the site's private
    texts; scrubs e-mail addresses, long numbers and quoted literals to `<slot>`."""

    private_texts: Sequence[str]
    identifiers: Sequence[str] = ()
    canaries: Sequence[str] = ()
    n: int = 5
    # optional: texts -> vectors; a unit whose cosine to any private text reaches
    # `max_similarity` is dropped (paraphrases that share no n-gram)
    embed: Callable[[list[str]], Any] | None = None
    max_similarity: float = 0.9
    embed_texts: Sequence[str] | None = None  # what `embed` compares with (default: all)
    _grams: set = field(default_factory=set, init=False)
    _vectors: Any = field(default=None, init=False)

    def __post_init__(self):
        for t in self.private_texts:
            w = _words(t)
            self._grams.update(tuple(w[i:i + self.n]) for i in range(len(w) - self.n + 1))
        self._idents = {i.lower() for i in self.identifiers if len(i) >= 4}

    def check(self, text: str) -> tuple[str | None, str]:
        """(the scrubbed text, "") or (None, why it was dropped)."""
        if any(c in text for c in self.canaries):
            return None, "canary"
        scrubbed = IDENT.sub("<slot>", text)
        words = _words(scrubbed)
        if hit := next((w for w in words if w in self._idents), None):
            return None, f"identifier {hit!r}"
        grams = {tuple(words[i:i + self.n]) for i in range(len(words) - self.n + 1)}
        if grams & self._grams:
            return None, f"{self.n}-gram overlap with local trajectories"
        texts = list(dict.fromkeys(self.embed_texts if self.embed_texts is not None
                                   else self.private_texts))
        if self.embed is not None and texts:
            import numpy as np

            if self._vectors is None:
                v = np.asarray(self.embed(texts), dtype=float)
                self._vectors = v / (np.linalg.norm(v, axis=1, keepdims=True) + 1e-12)
            q = np.asarray(self.embed([scrubbed]), dtype=float)[0]
            sim = float((self._vectors @ (q / (np.linalg.norm(q) + 1e-12))).max())
            if sim >= self.max_similarity:
                return None, f"embedding similarity {sim:.2f} to a local trajectory"
        return scrubbed, ""


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_<>=]+", text.lower())


def ab_gate(candidates: Sequence[KnowledgeOp], view: Sequence[dict],
            success: Callable[[Sequence[dict], str], float]
            ) -> tuple[list[KnowledgeOp], list[dict]]:
    """Keep an ADD/EDIT candidate only when `success(view + candidate, family)` is not lower
    than `success(view, family)` on the site's gate slice; AGREE/REMOVE pass through."""
    kept, log = [], []
    base: dict[str, float] = {}
    for op in candidates:
        if op.op not in ("ADD", "EDIT"):
            kept.append(op)
            continue
        unit = {"id": "candidate", "kind": op.kind, "family": op.family, "text": op.text,
                "steps": op.steps, "trial": True}  # a site must show it to measure it
        trial_view = [u for u in view if not (op.op == "EDIT" and u["id"] == op.target)]
        if op.family not in base:
            base[op.family] = success(view, op.family)
        with_unit = success([*trial_view, unit], op.family)
        ok = with_unit >= base[op.family]
        log.append({"family": op.family, "text": op.text, "without": base[op.family],
                    "with": with_unit, "kept": ok})
        if ok:
            kept.append(op)
    return kept, log


# --- the server side -------------------------------------------------------------------------

class KnowledgeBase(StrictModel):
    round: int = 0
    units: dict[str, Unit] = Field(default_factory=dict)
    families: dict[str, list[str]] = Field(default_factory=dict)  # node -> task families
    failed_streak: int = 0

    def active(self) -> list[Unit]:
        return [u for u in self.units.values() if u.status == "active"]

    def candidates_for(self, site: str, families: Sequence[str] | None, limit: int = 20,
                       rnd: int = 0) -> list[dict]:
        """Candidate units a site has not voted on yet, of its families, for its review: at
        most `limit`, rotated by round so units it could not judge do not hide the rest."""
        fams = set(families or ())
        out = [u.public() for u in sorted(self.units.values(), key=lambda u: u.id)
               if u.status == "candidate" and site not in u.support and site not in u.against
               and (not fams or u.family in fams)]
        if len(out) > limit:
            start = (rnd * limit) % len(out)
            out = (out[start:] + out[:start])[:limit]
        return out

    def view(self, families: Sequence[str] | None) -> list[dict]:
        """The active units of a site's task families (all of them when it named none)."""
        fams = set(families or ())
        return [u.public() for u in sorted(self.active(), key=lambda u: u.id)
                if not fams or u.family in fams]


def review_candidates(candidates: Sequence[dict], view: Sequence[dict],
                      success: Callable[[Sequence[dict], str], float], n_tasks:
                      Callable[[str], int]) -> tuple[list[KnowledgeOp], list[dict]]:
    """A site's vote on units other sites proposed: AGREE when adding the unit to its view
    raises success on its gate slice, REMOVE when it lowers it (count: tasks won or lost),
    nothing when it cannot tell (no tasks of the family, or no change)."""
    ops, log = [], []
    base: dict[str, float] = {}
    for c in candidates:
        fam = c["family"]
        if n_tasks(fam) == 0:
            continue
        if fam not in base:
            base[fam] = success(view, fam)
        with_unit = success([*view, {**c, "trial": True}], fam)
        delta = round((with_unit - base[fam]) * n_tasks(fam))
        log.append({"id": c["id"], "family": fam, "without": base[fam], "with": with_unit})
        if delta > 0:
            ops.append(KnowledgeOp(op="AGREE", target=c["id"], count=delta))
        elif delta < 0:
            ops.append(KnowledgeOp(op="REMOVE", target=c["id"], count=-delta))
    return ops, log


def votes(u: Unit) -> tuple[int, int]:
    """(sites for, sites against): one vote per site, the sign of its net count, so a site
    that inflates its counts weighs no more than one that reports honestly."""
    sites = set(u.support) | set(u.against)
    net = [u.support.get(s, 0) - u.against.get(s, 0) for s in sites]
    return sum(n > 0 for n in net), sum(n < 0 for n in net)


def apply_round(kb: KnowledgeBase, updates: Sequence[tuple[str, list[KnowledgeOp]]], *, k_min: int,
                rnd: int, embed: Callable[[list[str]], Any] | None = None,
                threshold: float = 0.95) -> dict[str, int]:
    """Fold the sites' operations into the knowledge base; returns counts of what happened.

    Workflows are grouped by (family, steps); insights (free text) are merged into an existing
    unit of the same family when their embeddings' cosine is at least `threshold`. Counts are
    kept per site and each site votes once (`votes`): a unit is active when at least `k_min`
    sites are for it and more are for than against, retired when more are against.
    """
    import numpy as np

    stats = dict.fromkeys(("add", "agree", "edit", "remove", "merged", "promoted", "retired"),
                          0)

    def find_or_create(op: KnowledgeOp) -> Unit:
        uid = Unit.make_id(op.kind or "workflow", op.family, op.steps, op.text)
        if uid in kb.units:
            stats["merged"] += 1
            return kb.units[uid]
        if op.kind == "insight" and embed is not None:
            same = [u for u in kb.units.values() if u.kind == "insight" and u.family == op.family]
            if same:
                vecs = np.asarray(embed([op.text] + [u.text for u in same]), dtype=float)
                vecs /= np.linalg.norm(vecs, axis=1, keepdims=True) + 1e-12
                sims = vecs[1:] @ vecs[0]
                if sims.max() >= threshold:
                    stats["merged"] += 1
                    return same[int(sims.argmax())]
        u = Unit(id=uid, kind=op.kind or "workflow", family=op.family, text=op.text,
                 steps=op.steps, created_round=rnd)
        kb.units[uid] = u
        return u

    for site, ops in updates:
        for op in ops:
            if op.op in ("ADD", "EDIT"):
                u = find_or_create(op)
                u.support[site] = u.support.get(site, 0) + op.count
                stats["add" if op.op == "ADD" else "edit"] += 1
            if op.op == "AGREE" and op.target in kb.units:
                t = kb.units[op.target]
                t.support[site] = t.support.get(site, 0) + op.count
                stats["agree"] += 1
            if op.op in ("EDIT", "REMOVE") and op.target in kb.units:
                t = kb.units[op.target]
                t.against[site] = t.against.get(site, 0) + op.count
                stats["remove"] += op.op == "REMOVE"
    for u in kb.units.values():
        pro, con = votes(u)
        if con > pro and u.status != "retired":
            u.status = "retired"
            stats["retired"] += 1
        elif u.status == "candidate" and pro >= k_min and pro > con:
            u.status, u.promoted_round = "active", rnd
            stats["promoted"] += 1
    kb.round = rnd
    return stats


def kb_path(out: Path, rnd: int) -> Path:
    return outputs_at("fed", out, under="federation").path("kb") / f"round-{rnd:04d}.json"


def save_kb(out: Path, kb: KnowledgeBase) -> None:
    atomic_write_json(kb_path(out, kb.round), kb.model_dump(mode="json"))
    atomic_write_json(outputs_at("fed", out, under="federation").path("kb") / "state.json",
                      {"round": kb.round})


def load_latest_kb(out: Path) -> KnowledgeBase | None:
    d = outputs_at("fed", out, under="federation").path("kb")
    for p in sorted(d.glob("round-*.json"), reverse=True) if d.is_dir() else []:
        try:
            return KnowledgeBase.model_validate_json(p.read_text())
        except ValueError:
            continue  # a torn file: the round before
    return None


def log_round(out: Path, row) -> None:
    append_line(outputs_at("fed", out, under="federation").path("rounds"), json.dumps(asdict(row)))


def record_bytes(rec: dict) -> int:
    return len(json.dumps(rec, separators=(",", ":")).encode())


def now() -> float:
    return time.monotonic()


@functools.cache
def minilm():
    """The bundled MiniLM, loaded once per process (the in-process runner serves every site
    from one process; the server embeds insights with it)."""
    return load_embedder("minilm")
