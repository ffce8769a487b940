"""Every file a pipeline writes is declared (issue 45 item 1): a string literal under
`workbench/` that looks like a file name (`x.jsonl`, `a/b.json`, `m.safetensors`, ...) must
be a name some spec declares (`Artifact`), or be on the short allow-list below, each entry
with its reason. Code reaches a run's files through the declared artifact
(`RunLayout.artifact / read / write`, `runs.outputs_at`), so a new literal is either a new
artifact to declare or a format that is not a run's."""

from __future__ import annotations

import ast
import re
from fnmatch import fnmatch
from pathlib import Path

from workbench import registry

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"

FILE_NAME = re.compile(
    r"^[\w{}*-][\w{}*.-]*(/[\w{}*.-]+)*\.(jsonl|json|md|txt|log|yaml|yml|csv|png|safetensors"
    r"|sqlite|gguf|bin|pt|npy|pkl|parquet|faiss)$")

# modules whose own format is not a run's file: the names inside them are that format's
ALLOWED_MODULES = {
    "workbench/models/*": "model folders (Hugging Face, GGUF, CTranslate2, the embedder) "
                          "and their converted copies in the model cache, not a run's",
    "workbench/retrieval/*": "an index folder's own files (BM25 arrays, tokens, params); "
                             "the folder is declared (rag's index, trajsynth's icl_index)",
    "workbench/train/checkpoint.py": "a resumable checkpoint's files inside the declared "
                                     "adapter folder (optimizer, RNG, trainer state)",
    "workbench/jobs/*": "a workspace's job folder (job.json, log.txt, progress.json): a "
                        "job's record, not a run's",
    "workbench/dataenv/*": "the sample data environments and an environment's profile "
                           "cache, not a run's",
    "workbench/federated/deploy.py": "a deployment's home folder (pids.json, the "
                                     "SuperLink's log), not a run's",
    "workbench/federated/weights.py": "the global store's own layout inside the declared "
                                      "federated/global folder (round-NNNN/adapter...)",
    "workbench/federated/sites.py": "a site folder's own layout (site.json and its rows), "
                                    "written in the declared sites/ and read on each "
                                    "site's machine in a deployment, where there is no run",
    "workbench/federated/knowledge/site.py": "the same site folder layout, track B "
                                             "(site.json, env.sqlite, agent_outcomes)",
}

# an agent pack's data folder (`agent.data`): what a person gives a run, or what the
# pack's `data` command builds for one, not a file a run writes
PACK_DATA = "an agent pack's data folder (agent.data), a run's input, not its output"
RF_CHAPTER = "a chapter of the RF sample corpus that RF bench items are drawn from " \
             "(agent_packs/rf/bench.py), a corpus file, not a run's"

# single names that stay literal, each with its reason
ALLOWED_NAMES = {
    "claims.jsonl": PACK_DATA + " (kgv: the claims, the pack's own shape)",
    "claims.txt": PACK_DATA + " (kgv: claims as sentences)",
    "documents.jsonl": PACK_DATA + " (kgv: the evidence passages)",
    "design.jsonl": PACK_DATA + " (rf: the design questions)",
    "design_generated.json": "the marker of a folder of generated RF design items "
                             "(`workbench agent generate-design OUT`): a folder the "
                             "workbench made, not a run's",
    "01_transmission_lines.md": RF_CHAPTER,
    "02_reflection_and_vswr.md": RF_CHAPTER,
    "05_impedance_matching.md": RF_CHAPTER,
    "06_noise.md": RF_CHAPTER,
    "12_antennas_and_links.md": RF_CHAPTER,
    "papers.jsonl": PACK_DATA + " (litsearch: the library)",
    "anchors.jsonl": PACK_DATA + " (litsearch: the intents and their anchor papers)",
    "workbench-published.json": "the marker of a folder of adapters published to a GRPO "
                                "rollout server (train.grpo_publish: published/ in the "
                                "checkpoints, or rollout_server.publish_dir), not a run's",
    "stages.json": "the run layout's own record of finished stages (RunLayout.stages_file)",
    "ratings.jsonl": "the workspace's chat/ folder (chat is no pipeline: its files are not "
                     "a run's) and the default of evaluate.agreement's ratings file",
    "pairs.jsonl": "the workspace's chat/ folder (preference pairs from ratings)",
    "sft.jsonl": "the workspace's chat/ folder (SFT rows from ratings)",
    "site.json": "a site folder's own metadata (see federated/sites.py above)",
    "round-*.json": "the knowledge bases inside the declared federated/kb folder",
    "*/open*.jsonl": "the loop's cached open-question evaluations inside the declared "
                     "evals/ folder",
    "export.json": "workbench.io's list of the files that mark a folder as made by the "
                   "workbench (an lm-eval export, a merge, a model copy)",
    "merge_report.json": "what `workbench train merge` writes beside a merged model "
                         "(its own output folder, not a run's)",
    "workbench-source.json": "the marker file of a model copy made by the workbench",
    "readme.md": "corpus ingestion skips a folder's readme",
    "README.md": "the model card `workbench train export` writes into an adapter folder",
    "best_adapter.safetensors": "the best checkpoint inside the declared adapter folder",
}


# files of a change still being written beside this one: not checked for use
PENDING: dict[str, str] = {}


def declared_names() -> list[str]:
    """The base names of every declared artifact ({value} as a wildcard)."""
    return sorted({a.path.rsplit("/", 1)[-1].replace("{value}", "*")
                   for p in registry.pipelines() for s in p.stages for a in s.outputs})


def literal_file_names(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every string constant that looks like a file name; f-string
    pieces and docstrings are not names."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skip.add(id(node.value))  # docstrings and bare strings
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in skip and FILE_NAME.match(node.value)
            and not node.value.startswith("*.")]  # a suffix glob is not a name


def undeclared(rel: str, source: str, names: list[str]) -> list[str]:
    if any(fnmatch(rel, m) for m in [*ALLOWED_MODULES, *PENDING]):
        return []
    out = []
    for line, lit in literal_file_names(source):
        base = lit.rsplit("/", 1)[-1]
        if lit in ALLOWED_NAMES or base in ALLOWED_NAMES:
            continue
        if any(fnmatch(base, n) for n in names):
            continue
        out.append(f"{rel}:{line}: {lit!r}")
    return out


def test_no_undeclared_file_name_literal_under_workbench():
    names = declared_names()
    found = []
    for f in sorted(PACKAGE.rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        found += undeclared(rel, f.read_text(encoding="utf-8"), names)
    assert not found, ("file names no spec declares (declare them as an Artifact of the "
                       "pipeline that writes them, or add them to the allow-list with a "
                       "reason):\n" + "\n".join(found))


def test_the_check_finds_a_planted_literal():
    names = declared_names()
    planted = 'from pathlib import Path\n\ndef f(out):\n    """x.jsonl in a docstring"""\n' \
              '    return Path(out) / "secret_output.jsonl", f"{out}.jsonl", "*.yaml"\n'
    assert undeclared("workbench/x.py", planted, names) == [
        "workbench/x.py:5: 'secret_output.jsonl'"]
    # a declared name passes, and so does a per-value one
    assert undeclared("workbench/x.py", 'p = "benchmark.jsonl"\nq = "rf_x.jsonl"\n',
                      names) == []


def test_the_allow_list_is_used():
    """An entry nothing needs any more goes (so the list stays short)."""
    names = declared_names()
    used_modules, used_names = set(), set()
    for f in sorted(PACKAGE.rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        lits = literal_file_names(f.read_text(encoding="utf-8"))
        undecl = [lit for _, lit in lits
                  if not any(fnmatch(lit.rsplit("/", 1)[-1], n) for n in names)]
        for m in ALLOWED_MODULES:
            if fnmatch(rel, m) and undecl:
                used_modules.add(m)
        if any(fnmatch(rel, m) for m in ALLOWED_MODULES):
            continue
        for lit in undecl:
            used_names.update({lit, lit.rsplit("/", 1)[-1]} & ALLOWED_NAMES.keys())
    assert set(ALLOWED_MODULES) - used_modules == set()
    assert set(ALLOWED_NAMES) - used_names == set()
