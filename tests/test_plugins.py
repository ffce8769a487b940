"""One plugin mechanism (`workbench.plugins`): pipelines, agent packs and model backends are
entries of one entry-point group each; the built-ins are the workbench's own entries, read
from the same table an outside package writes."""

import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from workbench import plugins
from workbench.errors import WorkbenchError

REPO = Path(__file__).resolve().parents[1]


def test_every_built_in_is_an_entry_of_its_group():
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    specs = sorted(p.parent.name for p in (REPO / "workbench").glob("*/spec.py"))
    listed = sorted(v.split(".")[1] for v in table[plugins.PIPELINES].values())
    assert listed == specs  # a new built-in pipeline is registered as a plugin is
    assert plugins.entries(plugins.PIPELINES) == table[plugins.PIPELINES]
    from workbench import registry
    from workbench.agent_packs.api import pack_names
    from workbench.models.backends import available_backends

    assert {"distill", "rag", "train", "eval", "compare", "trajsynth", "agent", "fed",
            "loop"} == set(registry.names())
    assert pack_names() == ["kgv", "litsearch", "rf"]
    assert {"local", "openai", "fake", "ctranslate2"} <= set(available_backends())


class _Dist:
    name = "wb-plugin-example"


def _installed(monkeypatch, group: str, name: str, value: str):
    """An entry point of another installed distribution (as `pip install` of a plugin
    package would leave it)."""
    import importlib.metadata as md

    ep = EntryPoint(name, value, group)._for(_Dist())
    real = md.entry_points
    monkeypatch.setattr(md, "entry_points", lambda group=None, **kw: (
        [*real(group=group), ep] if group == ep.group else real(group=group, **kw)))


def test_an_installed_plugin_adds_a_pack_and_a_backend_and_may_replace_one(monkeypatch):
    from workbench.agent_packs.api import pack_module, pack_names
    from workbench.models.backends import _backend, available_backends

    _installed(monkeypatch, plugins.AGENT_PACKS, "toy", "workbench.agent_packs.rf.api")
    assert "toy" in pack_names()
    assert pack_module("toy").__name__ == "workbench.agent_packs.rf.api"
    _installed(monkeypatch, plugins.BACKENDS, "echo", "workbench.models.fake:FakeChatModel")
    assert "echo" in available_backends() and _backend("echo").__name__ == "FakeChatModel"
    _installed(monkeypatch, plugins.AGENT_PACKS, "kgv", "workbench.agent_packs.rf.api")
    assert pack_module("kgv").__name__ == "workbench.agent_packs.rf.api"


def test_a_broken_entry_or_missing_built_ins_are_one_line(monkeypatch):
    from workbench.agent_packs.api import pack_module

    _installed(monkeypatch, plugins.AGENT_PACKS, "gone", "no_such_module_here.api")
    with pytest.raises(WorkbenchError, match="agent pack 'gone' 'no_such_module_here.api' "
                                             "cannot be loaded"):
        pack_module("gone")
    with pytest.raises(WorkbenchError, match="unknown agent pack 'nope'"):
        pack_module("nope")
    # neither a checkout's table nor installed metadata: say how to install
    monkeypatch.setattr(plugins, "_checkout_entries", lambda group: None)
    import importlib.metadata as md

    monkeypatch.setattr(md, "entry_points", lambda group=None, **kw: [])
    with pytest.raises(WorkbenchError, match=r"entries are not installed: run `pip install \.`"):
        plugins.entries(plugins.BACKENDS)
    with pytest.raises(WorkbenchError, match="unknown plugin group"):
        plugins.entries("workbench.nothing")
