"""RF calculators (checked against the RF corpus's own worked examples), unit checking, how
a question's quantities bind to calculator arguments, and the tools agent on a scripted
model."""

import json
import math

import pytest

from workbench.agents.runner import AgentSetup, AgentTask, Budget, FreePolicy, run_agents
from workbench.agents.tools import ToolError
from workbench.agent_packs.rf import tools as T
from workbench.agent_packs.reports import report_json
from workbench.agent_packs.rf.report import read_report
from workbench.agent_packs.rf.api import bindings, parse_number, quantities, rf_report, \
    toolbox
from workbench.agent_packs.rf.bench import DesignItem, correct
from workbench.models import load_model
from workbench.records import ToolCall


def test_calculators_reproduce_the_corpus_examples():
    # 02: a 75-ohm load on 50 ohms: |Γ| = 0.2, VSWR 1.5
    r = T.reflection("75 ohm", "50 ohm")
    assert r["gamma"] == 0.2 and r["vswr"] == 1.5
    assert r["return_loss_db"] == pytest.approx(13.98, abs=0.01)
    assert T.reflection("30+40j ohm", "50 ohm")["gamma"] == pytest.approx(0.5, abs=1e-3)
    # 05: 200 ohm to 50 ohm: Q = sqrt(3), shunt 115 ohm, series 87 ohm, 13.8 pF, 138 nH
    m = T.l_match("50 ohm", "200 ohm", "100 MHz")
    assert m["q"] == pytest.approx(1.732, abs=1e-3)
    assert m["shunt_c_pf"] == pytest.approx(13.8, abs=0.05)
    assert m["series_l_nh"] == pytest.approx(138, abs=0.5)
    # 05: 100 ohm to 50 ohm needs a 70.7-ohm quarter-wave section
    assert T.quarter_wave("100 ohm", "50 ohm", "1 GHz")["z_section_ohm"] == 70.71
    # 12: FSPL at 2.4 GHz over 100 m is about 80 dB
    assert T.link_budget("0 dBm", "2.4 GHz", "100 m")["fspl_db"] == pytest.approx(80.05,
                                                                                  abs=0.01)
    # 06: Friis by hand: F = 1.259 + (3.981 - 1) / 31.62
    nf = T.cascade_noise_figure([{"gain": "15 dB", "nf": "1 dB"},
                                 {"gain": "10 dB", "nf": "6 dB"}])
    assert nf["nf_db"] == pytest.approx(10 * math.log10(1.2589 + 2.9811 / 31.623), abs=1e-3)
    # 01: coax 60/sqrt(er) ln(D/d); a 1.6 mm FR-4 board's 50-ohm trace is about 3 mm wide
    assert T.coax_impedance("1 mm", "3.5 mm", 2.25)["z0_ohm"] == pytest.approx(
        40 * math.log(3.5), abs=0.01)
    assert 48 < T.microstrip_impedance("3 mm", "1.6 mm", 4.4)["z0_ohm"] < 53


def test_units_are_checked():
    assert T.quantity("2.4 GHz", "frequency", "f") == 2.4e9
    assert T.quantity("1.6 mm", "length", "h") == pytest.approx(1.6e-3)
    assert T.quantity("20 dBm", "power_dbm", "p") == 20
    for text, kind, part in [("50 ohm", "frequency", "expected frequency"),
                             (50, "impedance", "give the unit"),
                             ("fifty ohm", "impedance", "not a number"),
                             ("3 furlong", "length", "unknown unit"),
                             ("20 dB", "power_dbm", "expected power dbm")]:
        with pytest.raises(ToolError, match=part):
            T.quantity(text, kind, "x")
    box = toolbox()
    obs = box.call(ToolCall.make("quarter_wave", {"load": "100 ohm", "z0": "50 ohm",
                                                  "frequency": "50 ohm"}))
    assert obs.error and "frequency" in obs.error  # the model sees why, the run goes on


def test_bindings_follow_units_and_reach_every_benchmark_answer():
    q = "A 50 ohm line is terminated in a 75 ohm resistive load. What is the VSWR?"
    assert quantities(q) == [("50 ohm", "impedance"), ("75 ohm", "impedance")]
    calls = bindings(q)
    assert {c.function.name for c in calls} == {"reflection"}  # no frequency: no matching
    assert len(calls) == 2  # both orders
    from workbench.agent_packs.rf.api import load_items

    items = load_items("datasets/rf_design")
    assert len(items) == 40
    for it in items:
        values = []
        for c in bindings(it.question):
            if c.function.name == it.tool:
                try:
                    values.append(getattr(T, it.tool)(**json.loads(c.function.arguments))[
                        it.quantity])
                except ToolError:
                    pass
        assert any(correct(v, it) for v in values), it.id


def test_tools_agent_on_a_scripted_model():
    q = "What is the return loss in dB of a 75 ohm load on a 50 ohm line?"
    replies = ['<tool_call>\n{"name": "reflection", "arguments": {"load": "75 ohm", "z0": '
               '"50 ohm"}}\n</tool_call>',
               '<tool_call>\n{"name": "answer", "arguments": {"quantity": "return_loss_db", '
               '"value": 13.98}}\n</tool_call>']
    setup = AgentSetup(toolbox=toolbox(), policy=FreePolicy(), budget=Budget(max_tool_calls=2))
    (t,) = run_agents(load_model("fake", responses=replies), [AgentTask("q", q)], setup)
    assert t.ok and t.final["value"] == 13.98 and t.tool_calls == 1
    assert '"return_loss_db": 13.98' in t.messages[3].content


def test_numbers_and_report(tmp_path):
    assert parse_number("The VSWR is 1.5:1") == 1.5
    assert parse_number("about -60.1 dBm") == -60.1 and parse_number("no idea") is None
    items = [DesignItem(id=f"i{k}", question="q", answer=10.0, quantity="x", tool="t",
                        family="f") for k in range(4)]
    rows = {"alone": [{"id": f"i{k}", "family": "f", "prediction": p, "tool_calls": 0,
                       "errors": 0} for k, p in enumerate([10.1, 12.0, None, 9.0])],
            "tools": [{"id": f"i{k}", "family": "f", "prediction": 10.0, "tool_calls": 1,
                       "errors": 0, "tool": "t"} for k in range(4)]}
    rep = rf_report(tmp_path, items, rows, {"alone": 4.0, "tools": 8.0}, model="m")
    assert rep.conditions["alone"].accuracy == 0.25  # 10.1 within 2%, 9.0 not
    assert rep.conditions["tools"].accuracy == 1.0
    assert rep.conditions["tools"].right_tool == 4
    assert rep.paired["tools vs alone"].p == 0.25  # 3 discordant, all one way
    assert "| tools | 100.0" in (tmp_path / "rf_report.md").read_text()
    assert report_json(read_report(tmp_path / "rf_report.json")) == \
        (tmp_path / "rf_report.json").read_text() == report_json(rep)


def test_passive_loads_only_and_free_text_units():
    with pytest.raises(ToolError, match="passive"):
        T.reflection("-50 ohm", "50 ohm")
    assert quantities("a 1e-3 m wire into a 75 Ω load at 2.4GHz, 1.6 cm wide") == [
        ("1e-3 m", "length"), ("75 Ω", "impedance"), ("2.4GHz", "frequency"),
        ("1.6 cm", "length")]
    assert T.quantity("1 kΩ", "impedance", "z") == 1000
    assert T.quantity("50 Ohm", "impedance", "z") == 50
