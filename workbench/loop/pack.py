"""The improvement loop's section of a domain pack (`pipelines.loop`: its synthesis
templates), read and checked field by field."""

from __future__ import annotations

from workbench.domain_packs import load_pack, placeholders
from workbench.errors import WorkbenchError
from workbench.loop.synth import LoopPack


def loop_pack(name: str) -> LoopPack:
    pack = load_pack(name)
    raw = pack.pipelines.get("loop")
    if raw is None:
        raise WorkbenchError(f"domain pack {name!r} has no pipelines.loop section (the "
                             "synthesis templates of the improvement loop)")
    try:
        lp = LoopPack.model_validate(raw)
    except ValueError as e:
        raise WorkbenchError(f"domain pack {name!r}, pipelines.loop: {e}") from None

    known = {"term", "branch", "text", "definition", *lp.fields}
    problems = []
    for i, t in enumerate(lp.knowledge):
        for where, text in (("question", t.question), ("answer", t.answer)):
            if bad := placeholders(text) - known:
                problems.append(f"knowledge.{i}.{where}: unknown fields {sorted(bad)}")
        if bad := set(t.needs) - known:
            problems.append(f"knowledge.{i}.needs: unknown fields {sorted(bad)}")
    for key in ("thinking", "open_answer", "rationale_template"):
        extra = {"gold", "letter"} if key == "rationale_template" else set()
        if bad := placeholders(getattr(lp, key)) - known - extra:
            problems.append(f"{key}: unknown fields {sorted(bad)}")
    if bad := placeholders(lp.rationale_prompt) - {"question", "options", "letter", "gold"}:
        problems.append(f"rationale_prompt: unknown fields {sorted(bad)}")
    if problems:
        raise WorkbenchError(f"domain pack {name!r}, pipelines.loop: " + "; ".join(problems))
    return lp
