"""The shape the architecture page promises, checked rather than remembered (issue 26): no
module under `workbench/` over 600 lines, no function over 80 (the typer `register`
containers of the pipeline CLIs aside: a list of commands, each a few lines over its api), and
the sandbox child's modules import nothing of the workbench (they run as `python -I -B`)."""

import ast
import sys
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "workbench"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80
CHILD = PACKAGE / "dataenv" / "child"


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _is_typer_container(path: Path, fn: ast.FunctionDef) -> bool:
    """`register(app)` in a pipeline's cli.py: it only declares the group's commands."""
    return path.name == "cli.py" and fn.name == "register"


def test_no_module_is_over_600_lines():
    long = {str(p.relative_to(REPO)): n for p in _modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, long


def test_no_function_is_over_80_lines_but_the_typer_containers():
    long = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                    not _is_typer_container(p, node):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(REPO)}::{node.name}"] = n
    assert not long, long


def test_the_sandbox_child_imports_only_the_standard_library_and_its_own_modules():
    own = {p.stem for p in CHILD.glob("sandbox_*.py")}
    assert own == {"sandbox_main", "sandbox_confine", "sandbox_hook", "sandbox_worker"}
    allowed = set(sys.stdlib_module_names) | own | {"numpy", "pandas", "__future__"}
    for p in CHILD.glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                assert name.split(".")[0] in allowed, f"{p.name} imports {name}"
    # the names it appends to sys.path shadow nothing an agent's code or pandas imports
    assert not own & set(sys.stdlib_module_names)
