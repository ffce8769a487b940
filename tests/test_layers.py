"""The layer table (docs/architecture.md, [tool.importlinter] in pyproject.toml) holds, no
package's modules import each other in a cycle (import-linter's `acyclic_siblings`), both with
imports under `if TYPE_CHECKING:` counted, and the check really fails on a forbidden import
and on a cycle."""

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())"]


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(LINT, cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_layer_and_acyclic_contracts_hold():
    r = _lint(REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "2 kept, 0 broken" in r.stdout


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "workbench", tmp_path / "workbench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_a_forbidden_import_fails_the_check(tmp_path):
    _copy(tmp_path)
    bad = tmp_path / "workbench" / "evaluate" / "sneaky.py"
    bad.write_text("from workbench.rag.api import run  # evaluate must not know rag\n")
    r = _lint(tmp_path)
    assert r.returncode != 0
    assert "workbench.evaluate is not allowed to import workbench.rag" in r.stdout
    assert "workbench.evaluate.sneaky -> workbench.rag.api" in r.stdout


def test_a_cycle_inside_a_package_fails_the_check_even_for_type_checking(tmp_path):
    """The loop's verbs take its store and evaluator, never the `Loop`: an annotation naming
    the `Loop` again, though only under TYPE_CHECKING, is a cycle the check reports."""
    _copy(tmp_path)
    plan = tmp_path / "workbench" / "loop" / "plan.py"
    plan.write_text(plan.read_text() + "\nfrom typing import TYPE_CHECKING\n\n"
                    "if TYPE_CHECKING:\n    from workbench.loop.api import Loop\n")
    r = _lint(tmp_path)
    assert r.returncode != 0
    assert "No cycles are allowed in workbench.loop." in r.stdout
    assert "workbench.evaluate" not in r.stdout.split("Broken contracts")[-1]


def test_no_import_cycles_between_packages():
    import grimp

    graph = grimp.build_graph("workbench", exclude_type_checking_imports=False)
    tops = sorted(m for m in graph.find_children("workbench"))
    cycles = [(a, b) for i, a in enumerate(tops) for b in tops[i + 1:]
              if graph.direct_import_exists(importer=a, imported=b, as_packages=True)
              and graph.direct_import_exists(importer=b, imported=a, as_packages=True)]
    assert not cycles, cycles
