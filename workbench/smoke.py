"""The smoke job: load the default chat model and embedder, answer one question about a
dataset file using its most relevant paragraphs, and report the answer and timings."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from workbench.domain_packs import load_pack
from workbench.errors import WorkbenchError
from workbench.models.embed import load_embedder
from workbench.models.factory import open_chat_model


@dataclass
class SmokeResult:
    question: str
    answer: str
    context_sources: list[str]
    timings: dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    model: str = ""
    embedder: str = ""


def paragraphs(text: str) -> list[str]:
    blocks = [b.strip() for b in re.split(r"\n\s*\n", text)]
    return [b for b in blocks if len(b) > 40 and not b.startswith("#")]


def run_smoke(cfg) -> SmokeResult:
    pack = load_pack(cfg.domain).smoke
    document, question = cfg.smoke.document or pack.document, cfg.smoke.question or \
        pack.question
    if not document or not question:
        raise WorkbenchError(f"set smoke.document and smoke.question (the domain pack "
                             f"{cfg.domain!r} has no smoke section)")
    doc = Path(document)
    if not doc.is_file():
        raise WorkbenchError(f"smoke.document: {doc} not found")
    paras = paragraphs(doc.read_text(encoding="utf-8"))
    if not paras:
        raise WorkbenchError(f"{doc}: no paragraphs to answer from")
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    chat = open_chat_model(cfg.models.chat, cfg)
    t["load_chat_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    emb = load_embedder(cfg.models.embedder.spec, device=cfg.models.embedder.device,
                        batch_size=cfg.models.embedder.batch_size)
    t["load_embedder_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    vecs = emb.embed(paras)
    q = emb.embed([question])[0]
    order = (vecs @ q).argsort()[::-1][:2]
    t["embed_s"] = time.perf_counter() - t0
    context = "\n\n".join(paras[i] for i in sorted(order))
    conv = [
        {"role": "system", "content": "Answer briefly using the text."},
        {"role": "user", "content": f"Text:\n{context}\n\nQuestion: {question}"},
    ]
    params = cfg.generation.model_copy(update={"max_tokens": cfg.smoke.max_tokens})
    t0 = time.perf_counter()
    gen = chat.generate([conv], params)[0]
    t["generate_s"] = time.perf_counter() - t0
    if gen.error:
        raise WorkbenchError(f"generation failed: {gen.error}")
    if gen.completion_tokens and not gen.cached:
        t["tokens_per_s"] = gen.completion_tokens / t["generate_s"]
    return SmokeResult(question=question, answer=gen.text.strip(),
                       context_sources=[f"{doc} ¶{i + 1}" for i in sorted(order)], timings=t,
                       tokens=gen.completion_tokens, model=chat.identity, embedder=emb.identity)
