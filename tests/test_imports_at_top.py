"""Imports of the workbench's own modules sit at the top of the file (issue 45 item 2): an
import of a project module inside a function or method is an error unless it saves something,
or is allow-listed below with its reason. Pure AST over `workbench/` (nothing of the workbench
is imported), well under a second.

A function-level import of a project module may stay there when it is *heavy*: its static
top-level import closure (module-level imports followed, `if TYPE_CHECKING:` blocks and
function bodies not, the packages above each module counted since importing `a.b.c` runs
`a` and `a.b` first) reaches a package of HEAVY that the importing module's own closure does
not already reach. So a light module (the CLI, the job supervisor, the config) keeps torch,
numpy, flwr, streamlit... lazy; a module that already imports numpy at its top must hoist
what brings only numpy more, and keeps lazy only what would add torch. A lazy import that
adds no heavy package saves nothing and moves to the top.

ruff's PLC0415 (`import-outside-top-level`) is not used: it flags every import inside a
function, the heavy third-party ones that keep `workbench --help` fast included, and cannot
tell a project module that pulls torch from one that pulls nothing; its per-file ignores would
have to list most of the package. This rule checks only project imports and decides by what
each would actually load.

`test_the_light_entry_points_stay_light` holds the other half: the CLI and the job supervisor
reach no heavy package at their top, so hoisting cannot make `workbench --help` heavy.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

try:
    from conftest import REPO
except ImportError:  # run as a script (the hoisting helper reads the analysis from here)
    REPO = Path(__file__).resolve().parents[1]

PACKAGE = REPO / "workbench"

# Third-party packages slow to import (`python -X importtime -c "import X"`, cumulative, on the
# CI machine; none is loaded by `workbench --help` today), or that load one that is. A dotted
# entry is a submodule heavier than its package (safetensors.torch imports torch).
HEAVY = {
    # seconds: the model stack
    "torch", "transformers", "peft", "sentence_transformers", "safetensors.torch", "accelerate",
    "trl", "datasets", "llama_index", "flwr", "streamlit", "sklearn", "pandas", "matplotlib",
    # 100 to 500 ms: engines, numerics, servers, document readers
    "llguidance", "xllamacpp", "ctranslate2", "onnx", "onnxruntime", "gguf", "faiss", "numpy",
    "scipy", "pyarrow", "rank_bm25", "fastapi", "starlette", "uvicorn", "httpx", "jsonschema",
    "rdflib", "pptx", "openpyxl", "pdfplumber", "pypdf", "lxml", "docx", "ebooklib",
    "mcts_simple", "PIL", "jinja2", "cryptography", "huggingface_hub", "tensorboard",
}

# Light modules whose static closure must reach no HEAVY package: what `workbench --help`
# ([project.scripts] workbench = workbench.cli.main:entry) and `python -m workbench.jobs` (a
# job's supervisor, started for every job) load before they do anything. The CLI also loads
# by name, at start-up, every pipeline's spec and agent pack's declaration (pyproject's entry
# points) and each pipeline's `cli` module (`startup_modules` adds them).
LIGHT_ENTRY_POINTS = ("workbench.cli.main", "workbench.__main__", "workbench.jobs.__main__")
STARTUP_GROUPS = ("workbench.pipelines", "workbench.agent_packs")

# (importing module, imported module) -> why the import stays inside its function.
ALLOWED: dict[tuple[str, str], str] = {
}


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    top: list[ast.Import | ast.ImportFrom] = field(default_factory=list)
    lazy: list[ast.Import | ast.ImportFrom] = field(default_factory=list)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _collect(body: list[ast.stmt], mod: Module, in_function: bool) -> None:
    """The imports of a block, walking statements only (an import is never inside an
    expression), which keeps the whole package's scan well under a second."""
    for stmt in body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            (mod.lazy if in_function else mod.top).append(stmt)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            _collect(stmt.body, mod, True)
        elif not in_function and isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
            _collect(stmt.orelse, mod, False)  # the body runs for the type checker only
        else:
            for name in ("body", "orelse", "finalbody", "handlers", "cases"):
                for block in getattr(stmt, name, ()):
                    _collect(block.body if isinstance(block, ast.excepthandler | ast.match_case)
                             else [block], mod, in_function)


@cache
def modules() -> dict[str, Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        mod = Module(".".join(parts), path, is_package)
        _collect(ast.parse(path.read_text(encoding="utf-8")).body, mod, False)
        found[mod.name] = mod
    return found


def _base(mod: Module, node: ast.ImportFrom) -> str:
    """The absolute module a `from` import names (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    package = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def targets(mod: Module, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules one import statement loads, by dotted name (a `from x import y` loads x.y
    too when y is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = _base(mod, node)
    known = modules()
    subs = [f"{base}.{a.name}" for a in node.names]
    return [base] + [s for s in subs if s in known or not base.startswith("workbench")]


def is_project(name: str) -> bool:
    return name == "workbench" or name.startswith("workbench.")


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _heavy_of(name: str) -> str | None:
    return next((p for p in _with_parents(name) if p in HEAVY), None)


@cache
def _edges(name: str) -> tuple[frozenset[str], frozenset[str]]:
    """What module `name`'s own top level imports: (project modules, heavy packages)."""
    mod, project, heavy = modules()[name], set(), set()
    for node in mod.top:
        for t in targets(mod, node):
            if is_project(t):
                project.update(_with_parents(t))
            elif (h := _heavy_of(t)) is not None:
                heavy.add(h)
    return frozenset(project), frozenset(heavy)


@cache
def closure(name: str) -> frozenset[str]:
    """The heavy packages loading module `name` loads through module-level imports."""
    known = modules()
    seen, heavy = set(), set()
    stack = [m for m in _with_parents(name) if m in known]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        project, direct = _edges(current)
        heavy |= direct
        stack.extend(m for m in project if m in known and m not in seen)
    return frozenset(heavy)


def statement_heavy(mod: Module, node: ast.Import | ast.ImportFrom) -> frozenset[str]:
    """The heavy packages a function-level import would load on top of its module's own."""
    loaded: set[str] = set()
    for t in targets(mod, node):
        loaded |= closure(t) if is_project(t) else {h for h in [_heavy_of(t)] if h}
    return frozenset(loaded - closure(mod.name))


def project_base(mod: Module, node: ast.Import | ast.ImportFrom) -> str | None:
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [_base(mod, node)]
    return next((n for n in names if is_project(n)), None)


def classify():
    """Every function-level project import: (module, node, base, verdict) with verdict one
    of 'heavy', 'allowed', 'error'."""
    rows = []
    for mod in modules().values():
        for node in mod.lazy:
            base = project_base(mod, node)
            if base is None:
                continue
            if statement_heavy(mod, node):
                verdict = "heavy"
            elif (mod.name, base) in ALLOWED:
                verdict = "allowed"
            else:
                verdict = "error"
            rows.append((mod, node, base, verdict))
    return rows


def _where(mod: Module, node: ast.AST) -> str:
    return f"{mod.path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}"


def test_project_imports_are_at_the_top_unless_heavy_or_allowed():
    errors = [_where(mod, node) for mod, node, _, verdict in classify() if verdict == "error"]
    assert not errors, (
        f"{len(errors)} imports of the workbench's own modules inside functions; move them to "
        "the top of the file (a lazy import must bring in a heavy package its module does "
        "not already load, or be in ALLOWED with its reason):\n" + "\n".join(errors))


def test_allow_list_entries_are_still_needed():
    used = {(mod.name, base) for mod, _, base, verdict in classify() if verdict == "allowed"}
    assert not set(ALLOWED) - used, sorted(set(ALLOWED) - used)


def startup_modules() -> list[str]:
    """LIGHT_ENTRY_POINTS and the modules the CLI loads by name when it starts."""
    entry_points = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "entry-points"]
    specs = [ref.partition(":")[0] for group in STARTUP_GROUPS
             for ref in entry_points[group].values()]
    clis = [kw.value.value.partition(":")[0] for spec in specs
            for node in ast.walk(ast.parse(modules()[spec].path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) for kw in node.keywords
            if kw.arg == "cli" and isinstance(kw.value, ast.Constant)]
    return [*LIGHT_ENTRY_POINTS, *specs, *clis]


def test_the_light_entry_points_stay_light():
    names = startup_modules()
    assert {"workbench.train.spec", "workbench.train.cli"} <= set(names)
    heavy = {name: sorted(closure(name)) for name in names if closure(name)}
    assert not heavy, heavy


def test_the_rule_sees_what_it_should(tmp_path):
    """The analysis itself: a relative import resolves, TYPE_CHECKING imports are not loaded,
    and a lazy import is judged by what it adds to its module's own closure."""
    mods = modules()
    assert {"workbench.cli.main", "workbench.config", "workbench.__main__"} <= set(mods)
    cli = mods["workbench.cli.main"]
    assert any(project_base(cli, n) == "workbench.config" for n in cli.top)
    lazy = {project_base(cli, n): statement_heavy(cli, n) for n in cli.lazy}
    assert lazy["workbench.serve"]  # only `workbench serve` loads the web stack (starlette)
    tree = ast.parse("from .loop import x\nfrom ..records import y\n")
    loop = Module("workbench.loop.api", PACKAGE / "loop" / "api.py", False)
    assert [_base(loop, n) for n in tree.body] == ["workbench.loop.loop", "workbench.records"]
    probe = Module("workbench.probe", tmp_path / "probe.py", False)
    _collect(ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
                       "else:\n    import json\ndef f():\n    import numpy\n").body, probe, False)
    assert [ast.unparse(n) for n in probe.top] == ["from typing import TYPE_CHECKING",
                                                  "import json"]
    assert [ast.unparse(n) for n in probe.lazy] == ["import numpy"]


if __name__ == "__main__":  # a summary for whoever hoists next
    from collections import Counter
    rows = classify()
    print(Counter(v for *_, v in rows))
    for mod, node, _, verdict in rows:
        if verdict in sys.argv[1:]:
            print(verdict, _where(mod, node))
