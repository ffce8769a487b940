"""Controlled corruptions of a good workflow, for preference pairs (chosen = the gold
workflow, rejected = a corruption) and for testing the validator: each structural corruption
must be caught before anything runs; the feedback corruptions are valid workflows that
ignore or invert what the user said."""

from __future__ import annotations

import copy
from typing import Any

from workbench.agent_packs.litsearch import dag as D
from workbench.agent_packs.litsearch.pack import edits

STRUCTURAL = ("drop_required_node", "filter_before_search", "wrong_operator",
              "invalid_parameter", "dangling_input", "cycle")
FEEDBACK = ("ignore_feedback", "invert_feedback")


def corrupt(wf: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The corrupted copy, or None when this workflow offers no such corruption."""
    w = copy.deepcopy(wf)
    nodes = w["nodes"]
    by_id = {n["id"]: n for n in nodes}
    used = [n for n in nodes if any(n["id"] in m.get("inputs", []) for m in nodes)]
    if kind == "drop_required_node":
        if not used:
            return None
        gone = used[0]["id"]
        w["nodes"] = [n for n in nodes if n["id"] != gone]
        return w
    if kind == "filter_before_search":  # a filter where a search belongs: it has no input
        src = next((n for n in nodes if n["op"] in D.SOURCES), None)
        if src is None:
            return None
        src.update(op="filter_year", params={"min": 1900}, inputs=[])
        return w
    if kind == "wrong_operator":  # a search turned into citation expansion without input
        src = next((n for n in nodes if n["op"] in ("keyword_search", "semantic_search")),
                   None)
        if src is None:
            return None
        src.update(op="cite_forward", params={})
        return w
    if kind == "invalid_parameter":
        src = next((n for n in nodes if "k" in n.get("params", {})
                    or n["op"] in ("keyword_search", "semantic_search")), None)
        if src is None:
            return None
        src["params"]["k"] = 0
        return w
    if kind == "dangling_input":
        tail = by_id[w["output"]]
        tail["inputs"] = [*tail.get("inputs", []), "missing_node"]
        return w
    if kind == "cycle":
        if not used:
            return None
        first = used[0]
        first["inputs"] = [*first.get("inputs", []), w["output"]]
        return w
    raise ValueError(f"unknown corruption {kind!r}")


def feedback_corruption(cands: dict[str, dict[str, Any]], gold: str, kind: str,
                        accepted: list[str], rejected: list[str], papers) -> dict | None:
    """ignore: the previous workflow unchanged; invert: expand from the rejected papers and
    drop the accepted ones."""
    if kind == "ignore_feedback":
        return cands.get("keep") if gold != "keep" else None
    if kind == "invert_feedback" and rejected:
        inv = edits(cands["keep"], rejected, accepted, papers)
        return inv.get("expand_and_drop") or inv.get("expand_accepted")
    return None
