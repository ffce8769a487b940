"""workbench.text writes every report's numbers and tables by one precision rule, and no module
under workbench/ formats a percentage, an interval or a markdown table of its own."""

import ast

from conftest import REPO

from workbench.text import (
    accuracy,
    interval,
    markdown_table,
    number,
    number_interval,
    p_value,
    percent,
    percent_interval,
    points,
    points_interval,
)

# Files still formatting on their own, with how many sites they may keep
ALLOWED = {"workbench/text.py": 10**6,
           # document conversion writes the tables of a source document, not a report
           "workbench/corpus/formats.py": 1}
LOCAL_FORMATTERS = {"pct", "_pct", "fmt", "_fmt", "acc_text", "_acc", "_ci", "fmt_pct"}


def test_one_precision_for_percentages_intervals_and_differences():
    assert percent(0.1875) == "18.8%"
    assert interval(0.18789, 0.70412) == "[18.8, 70.4]"
    assert percent_interval(0.4286, 0.18789, 0.70412) == "42.9% [18.8, 70.4]"
    assert points(0.06) == "+6.0" and points(-0.125) == "-12.5"
    assert points(0.2, signed=False) == "20.0"
    assert points_interval(0.06, -0.012, 0.134) == "+6.0 [-1.2, +13.4]"
    assert number_interval(0.41234, 0.3, 0.52) == "0.412 [0.300, 0.520]"
    assert number_interval(0.05, -0.01, 0.11, signed=True) == "+0.050 [-0.010, +0.110]"


def test_p_values_have_two_significant_digits():
    assert p_value(0.0012843) == "0.0013"
    assert p_value(0.04567) == "0.046"
    assert p_value(1.0) == "1"
    assert p_value(2.4e-7) == "2.4e-07"


def test_missing_values_are_a_dash():
    assert percent(None) == points(None) == interval(None, 0.5) == p_value(None) == "-"
    assert percent_interval(None, None, None) == accuracy(None) == number(None) == "-"
    assert number(float("nan")) == "-" and number(1.23456, 2) == "1.23"


def test_an_accuracy_record_reads_as_its_percentage_and_interval():
    class Acc:
        value, ci_low, ci_high = 0.5, 0.25, 0.75

    assert accuracy(Acc()) == "50.0% [25.0, 75.0]"


def test_markdown_table_escapes_pipes_and_writes_missing_cells():
    t = markdown_table(["rule", "n"], [["a | b", 3], ["two\nlines", None]])
    assert t.splitlines() == ["| rule | n |", "|---|---|", "| a \\| b | 3 |",
                              "| two lines | - |"]
    assert markdown_table(["x"], []) == "| x |\n|---|"


def _local_formatting(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each percent or interval formatted in place: an f-string field with a
    `%` format, `100 * x` formatted as a float, a `|---` table rule, a local formatter."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            spec = "".join(v.value for v in getattr(node.format_spec, "values", [])
                           if isinstance(v, ast.Constant) and isinstance(v.value, str))
            scaled = isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Mult) \
                and any(isinstance(s, ast.Constant) and s.value == 100
                        for s in (node.value.left, node.value.right))
            if spec.endswith("%") or (scaled and spec.endswith("f")):
                found.append((node.lineno, f"{ast.unparse(node.value)}:{spec}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "|---" in node.value:
            found.append((node.lineno, "a markdown table rule"))
        elif isinstance(node, ast.FunctionDef) and node.name in LOCAL_FORMATTERS:
            found.append((node.lineno, f"def {node.name}"))
    return found


def test_no_module_formats_percentages_intervals_or_tables_of_its_own():
    offenders = []
    for path in sorted((REPO / "workbench").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        found = _local_formatting(ast.parse(path.read_text(encoding="utf-8")))
        if len(found) > ALLOWED.get(rel, 0):
            offenders += [f"{rel}:{line}: {what}" for line, what in found]
    assert not offenders, ("format with workbench.text (percent, interval, points, p_value, "
                           "markdown_table):\n" + "\n".join(offenders))


def test_the_check_finds_a_planted_formatter():
    planted = ('def _pct(x):\n    return f"{100 * x:.0f}%"\n'
               'share = f"{0.5:.1%}"\nrule = "|---|---|"\n')
    assert sorted(w for _, w in _local_formatting(ast.parse(planted))) == sorted(
        ["def _pct", "100 * x:.0f", "0.5:.1%", "a markdown table rule"])
