"""A small RF knowledge graph, its claims, a document corpus indexed with the retrieval library
(a prebuilt index, as `workbench rag build` makes it), and a scripted verifier model for the
KGV tests: the index as evidence (test_kgv_index.py), the verdicts checked against a person
(test_kgv_verdict_check.py, test_app_kgv_check.py)."""

import re
from pathlib import Path

DOCS = {
    "mixers.md": "# Mixers\n\nA mixer is driven by a local oscillator and multiplies the RF "
                 "signal to shift its frequency.\n",
    "lna.md": "# Low-noise amplifiers\n\nThe low-noise amplifier is part of the receiver "
              "front end and sets its noise figure.\n",
    "filters.md": "# Filters\n\nA band-pass filter is part of the receiver and rejects "
                  "signals outside its pass band.\n",
    "antennas.md": "# Antennas\n\nAn antenna radiates and receives electromagnetic waves.\n",
    "power.md": "# Power amplifiers\n\nA power amplifier is part of the transmitter and "
                "feeds the antenna.\n",
    "vco.md": "# Oscillators\n\nA voltage-controlled oscillator is tuned by a control "
              "voltage.\n",
}
GRAPH = ["mixer\tdriven by\tlocal oscillator", "low-noise amplifier\tpart of\treceiver",
         "band-pass filter\tpart of\treceiver", "power amplifier\tpart of\ttransmitter",
         "antenna\tpart of\ttransmitter"]
# four true, four false; all dev
CLAIMS = [("mixer", "driven by", "local oscillator", "SUPPORTED"),
          ("low-noise amplifier", "part of", "receiver", "SUPPORTED"),
          ("band-pass filter", "part of", "receiver", "SUPPORTED"),
          ("power amplifier", "part of", "transmitter", "SUPPORTED"),
          ("antenna", "part of", "mixer", "REFUTED"),
          ("low-noise amplifier", "part of", "transmitter", "REFUTED"),
          ("mixer", "driven by", "antenna", "REFUTED"),
          ("band-pass filter", "driven by", "local oscillator", "REFUTED")]
CONFIG = """name: {name}
seed: 0
output_dir: {out}
models:
  chat: {{spec: fake, options: {{name: verifier, script: "kgv_scripted:verifier"}}}}
agent: {{pack: kgv, data: {data}, retriever: keyword, search_k: 2, policy: free,
        conditions: [rag, agent], chunk: 4}}
"""
_STOP = {"a", "an", "the", "of", "is", "by", "and", "to", "its"}


def make_kg(root: Path, embedder) -> tuple[Path, Path]:
    """(the KG folder: graph.tsv and claims.tsv, no documents; the index folder built from
    the documents with the library, as `workbench rag build DOCS -o INDEX` builds it)."""
    from workbench.corpus import ingest
    from workbench.retrieval.index import RagConfig, RagIndex

    docs, kg = root / "docs", root / "kg"
    docs.mkdir(parents=True)
    kg.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    (kg / "graph.tsv").write_text("\n".join(GRAPH) + "\n")
    (kg / "claims.tsv").write_text("".join(f"{s}\t{p}\t{o}\t{label}\tdev\n"
                                           for s, p, o, label in CLAIMS))
    index = root / "index"
    RagIndex.build(ingest(docs).sections, index, config=RagConfig(), embedder=embedder)
    return kg, index


def write_config(path: Path, *, data: Path, out: Path, name: str = "kgi") -> Path:
    path.write_text(CONFIG.format(name=name, out=out, data=data))
    return path


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP}


def verifier(conv) -> dict:
    """A scripted verifier (free policy): search the claim as it is, then call it SUPPORTED
    when the first passage found holds every word of it, REFUTED otherwise, citing that
    passage (by the id shown in brackets)."""
    claim = next(m["content"].split("true? ", 1)[1] for m in conv
                 if m["role"] == "user" and "true? " in (m.get("content") or ""))
    results = [m["content"] for m in conv if m["role"] == "tool"]
    if not results:
        return {"tool_calls": [{"name": "search", "arguments": {"query": claim}}]}
    first = re.search(r"^\[(\S+)\] (.*)$", results[-1], flags=re.MULTILINE)
    if first is None:
        return {"tool_calls": [{"name": "answer", "arguments": {"label": "REFUTED"}}]}
    label = "SUPPORTED" if _words(claim) <= _words(first.group(2)) else "REFUTED"
    return {"tool_calls": [{"name": "answer", "arguments": {
        "label": label, "evidence": [first.group(1)]}}]}
