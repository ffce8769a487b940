"""An agent pack from another installed package (issue 45 item 5): it registers through the
entry-point group `workbench.agent_packs` with its own stages and its own report record, and
`workbench agent eval PACK CONFIG` runs it with no edit to the workbench. Also: the built-in
packs declare what their code knows, and every lookup table is one registry type."""

import json
import sys
import textwrap
from pathlib import Path

import pytest

from workbench import plugins
from workbench.errors import WorkbenchError

# the outside package: a declaration (data only), the pack's code, its report record
DECLARE = '''
from workbench.agent_packs.pack import AgentPack, PackReport
from workbench.registry import Artifact, Stage

PACK = AgentPack(
    name="wordpack", entry="wordpack.api", help="counts words of the config's words",
    conditions=("count",),
    stages=(
        Stage("wordpack_count", help="one row per word",
              outputs=(Artifact("wordpack_rows", "wordpack/rows.jsonl", "WordRow"),)),
        Stage("wordpack_report", help="the words counted, a typed report",
              outputs=(Artifact("wordpack_report", "wordpack_report.json", "WordReport"),)),
    ),
    report=PackReport(record="wordpack.report:WordReport",
                      reader="wordpack.report:read_report", artifact="wordpack_report"),
)
'''
REPORT = '''
from workbench.agent_packs.reports import SCHEMA_VERSION, read_report_file, report_file
from workbench.records import ReportPart


class WordReport(ReportPart):
    schema_version: int = SCHEMA_VERSION
    words: int
    letters: int


def read_report(run):
    from workbench import registry

    name = registry.get("agent").artifact("wordpack_report").path
    return read_report_file(report_file(run, name), WordReport, "word report")
'''
API = '''
import json

from workbench.agent_packs.api import conditions
from workbench.agent_packs.reports import report_json
from workbench.io import atomic_write_text, read_jsonl, write_jsonl
from workbench.registry import PipelineResult

from wordpack.declare import PACK
from wordpack.report import WordReport


def evaluate(cfg, ctx):
    conditions(cfg.agent, PACK.conditions)
    words = cfg.name.split("-")
    stages = ctx.stages("agent")
    rows = ctx.layout.artifact("agent", "wordpack_rows")

    def count():
        rows.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(rows, [{"word": w, "letters": len(w)} for w in words])
        return {"rows": len(words)}

    stages.run("wordpack_count", words, count)
    out = ctx.layout.artifact("agent", "wordpack_report")

    def report():
        got = list(read_jsonl(rows))
        rec = WordReport(words=len(got), letters=sum(r["letters"] for r in got))
        atomic_write_text(out, report_json(rec))

    stages.run("wordpack_report", json.dumps(words), report)
    return PipelineResult(pipeline="agent", run_dir=str(ctx.layout.root),
                          outputs={"report_json": str(out)},
                          message=f"wordpack: {len(words)} words")


def run_inputs(cfg, inputs, log=print):
    return []
'''


def _install(site: Path) -> None:
    """The package as `pip install` leaves it in site-packages: its modules and a dist-info
    folder whose entry_points.txt names the pack in the workbench's group."""
    pkg = site / "wordpack"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name, text in (("declare", DECLARE), ("report", REPORT), ("api", API)):
        (pkg / f"{name}.py").write_text(textwrap.dedent(text))
    info = site / "wordpack-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: wordpack\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{plugins.AGENT_PACKS}]\nwordpack = wordpack.declare:PACK\n")
    (info / "RECORD").write_text("")


@pytest.fixture
def wordpack(tmp_path, monkeypatch):
    """The package installed for this test only: afterwards the agent pipeline is as it was
    (a worker runs other test files after this one)."""
    import importlib

    from workbench import registry

    agent = registry.get("agent")
    site = tmp_path / "site"
    _install(site)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield site
    registry.register(agent, replace=True)
    for name in [m for m in sys.modules if m == "wordpack" or m.startswith("wordpack.")]:
        del sys.modules[name]


def test_an_installed_pack_runs_with_its_own_stages_and_report(wordpack, tmp_path, cli):
    from workbench import registry
    from workbench.agent_packs.api import pack_names, read_report, report_packs
    from workbench.runs import RunLayout

    from workbench.agent_packs import pack

    assert "wordpack" in pack_names()
    # a process started now builds the agent pipeline with its stages (agent_packs.spec)
    assert {"wordpack_count", "wordpack_report"} <= {s.name for s in pack.stages()}
    conf = tmp_path / "wp.yaml"
    conf.write_text(f"name: three-small-words\noutput_dir: {tmp_path / 'runs'}\n")
    r = cli("agent", "eval", "wordpack", str(conf))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "wordpack: 3 words" in r.stdout
    # its stages are the agent pipeline's now, recorded in the run's stages.json
    declared = {s.name for s in registry.get("agent").stages}
    assert {"wordpack_count", "wordpack_report"} <= declared
    assert {"closed_book", "rf", "litsearch_report"} <= declared  # the built-ins' stay
    layout = RunLayout.at(tmp_path / "runs" / "three-small-words")
    assert {"agent/wordpack_count", "agent/wordpack_report"} <= set(layout.stages().stages)
    # its files are found through the layout, by the names it declared
    rows = layout.artifact("agent", "wordpack_rows")
    assert rows == layout.root / "agent" / "wordpack" / "rows.jsonl"
    assert [json.loads(x)["word"] for x in rows.read_text().splitlines()] == [
        "three", "small", "words"]
    assert layout.has("agent", "wordpack_report")
    # its report is its own typed record, read through the one dispatcher
    assert report_packs(layout) == ["wordpack"]
    rep = read_report(layout, "wordpack")
    assert type(rep).__name__ == "WordReport" and (rep.words, rep.letters) == (3, 15)
    again = cli("agent", "eval", "wordpack", str(conf))
    assert again.returncode == 0 and "agent/wordpack_count: up to date" in again.stderr
    r = cli("agent", "eval", "wordpack", str(conf), "-s", "agent.conditions=[nope]")
    assert r.returncode != 0 and "not known to pack 'wordpack' (known: count)" in r.stderr


def test_a_stage_name_two_packs_declare_is_refused(wordpack, monkeypatch):
    from dataclasses import replace

    from workbench.agent_packs import pack
    from workbench.registry import Stage

    decl = replace(pack.declaration("wordpack"), name="other",
                   stages=(Stage("wordpack_count", help="another stage of that name"),))
    pack.PACKS.register("other", decl)
    try:
        with pytest.raises(WorkbenchError, match="declares stage 'wordpack_count', which "
                                                 "'wordpack' declares too"):
            pack.stages()
    finally:
        pack.PACKS.unregister("other")


def test_the_agent_pipeline_is_composed_of_the_packs_stages():
    from workbench import registry
    from workbench.agent_packs.pack import declaration

    spec = registry.get("agent")
    by_pack = [s for name in ("kgv", "rf", "litsearch") for s in declaration(name).stages]
    assert spec.stages == tuple(by_pack)  # in the order of the group's entries
    assert {"closed_book", "kgv_grpo", "kgv_report", "rf", "rf_grpo", "rf_report",
            "litsearch", "litsearch_report"} <= {s.name for s in spec.stages}
    assert declaration("kgv").report.artifact == "kgv_report"
    assert spec.artifact("kgv_report").path == "report.json"


def test_the_built_in_packs_declare_what_their_code_knows():
    from workbench.agent_packs.api import pack_module, report_record
    from workbench.agent_packs.kgv import api as kgv
    from workbench.agent_packs.litsearch import api as litsearch
    from workbench.agent_packs.litsearch.tuned import TRAINED
    from workbench.agent_packs.pack import declaration
    from workbench.agent_packs.rf import api as rf
    from workbench.agent_packs.rf.grpo import CONDITION

    known = {"kgv": (*kgv.CONDITIONS, kgv.GRPO), "rf": (*rf.CONDITIONS, CONDITION),
             "litsearch": (*litsearch.CONDITIONS, *TRAINED)}
    for name, conds in known.items():
        decl = declaration(name)
        assert decl.name == name and decl.conditions == conds
        assert pack_module(name).__name__ == decl.entry
        assert report_record(name).__name__ == {"kgv": "KgvReport", "rf": "RfReport",
                                                "litsearch": "LitsearchReport"}[name]


def test_every_lookup_table_is_one_registry_type():
    from workbench import registry
    from workbench.agent_packs.pack import PACKS
    from workbench.agents.runner import SCAFFOLDS, TRIAL_SCAFFOLDS, scaffold
    from workbench.datatasks.templates import TEMPLATES
    from workbench.models.backends import BACKENDS

    for table in (registry._REGISTRY, BACKENDS, PACKS, SCAFFOLDS, TRIAL_SCAFFOLDS, TEMPLATES):
        assert isinstance(table, plugins.Registry)
    with pytest.raises(WorkbenchError, match=r"^unknown scaffold 'x' \(one of react, "
                                             r"plan_execute, reflexion\)$"):
        scaffold("x")
    with pytest.raises(WorkbenchError, match=r"^unknown model backend 'x'; available: ct2, "):
        BACKENDS.get("x")
    with pytest.raises(WorkbenchError, match=r"^unknown pipeline 'x' \(registered: distill, "):
        registry.get("x")
    with pytest.raises(WorkbenchError, match=r"^unknown seed template 'x' \(known: "):
        TEMPLATES.get("x")
    assert BACKENDS.get("transformers") is BACKENDS.get("local")
    # one loader: a string entry is imported once, on first use, with its name in errors
    table: plugins.Registry[object] = plugins.Registry("widget")
    table.register("ok", "workbench.text:percent")
    table.register("gone", "no_such_module_here:thing")
    from workbench.text import percent

    assert table.get("ok") is percent and "ok" in table and list(table) == ["ok", "gone"]
    with pytest.raises(WorkbenchError, match="widget 'gone' 'no_such_module_here:thing' "
                                             "cannot be loaded"):
        table.get("gone")
