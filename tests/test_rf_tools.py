"""RF calculators (checked against the RF corpus's own worked examples), unit checking, how
a question's quantities bind to calculator arguments, and the tools agent on a scripted
model."""

import json
import math

import pytest

from workbench.agent_packs.reports import report_json
from workbench.agent_packs.rf import tools as T
from workbench.agent_packs.rf.api import bindings, parse_number, quantities, rf_report, toolbox
from workbench.agent_packs.rf.bench import DesignItem, correct
from workbench.agent_packs.rf.report import read_report
from workbench.agents.runner import AgentSetup, AgentTask, Budget, FreePolicy, run_agents
from workbench.agents.tools import ToolError
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


def calculator_values(it) -> list[float]:
    """What the item's calculator gives, called as the guided agent binds the question's
    quantities (every binding the calculator accepts)."""
    values = []
    for c in bindings(it.question):
        if c.function.name == it.tool:
            try:
                values.append(getattr(T, it.tool)(**json.loads(c.function.arguments))[
                    it.quantity])
            except ToolError:
                pass
    return values


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
        values = calculator_values(it)
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


# Generated design items (issue 44): seeded, answered by the calculators, never a shipped item.

SHIPPED_SHA256 = "d4afcd081176c1713cbdb39aeb757425a3185792f18df4f53c539d66560bf639"


def _sha256(path) -> str:
    import hashlib
    from pathlib import Path

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_generated_items_are_seeded_distinct_and_never_shipped(tmp_path):
    from workbench.agent_packs.rf.api import load_items
    from workbench.agent_packs.rf.bench import FAMILIES, build
    from workbench.agent_packs.rf.generate import RANGES, generate

    a = generate(20, 0)
    assert [x.model_dump() for x in a] == [x.model_dump() for x in generate(20, 0)]
    other = generate(20, 1)
    assert {x.question for x in a} != {x.question for x in other}
    assert all(x.id.startswith("rfg-s1-") for x in other)
    # a larger draw extends a smaller one, family by family
    small = generate(5, 0)
    assert [x.model_dump() for x in small] == [x.model_dump() for x in a
                                               if int(x.id.rsplit("-", 1)[1]) < 5]
    assert len(a) == 160 and [x.family for x in a] == [f for f in FAMILIES for _ in range(20)]
    assert [x.id for x in a[:2]] == ["rfg-s0-vswr-000", "rfg-s0-vswr-001"]
    shipped = load_items("datasets/rf_design")
    assert len({x.id for x in a}) == len(a) and not {x.id for x in a} & {x.id for x in shipped}
    assert len({x.question for x in a}) == len(a)
    assert not {x.question for x in a} & {x.question for x in shipped}
    # the same physics is not asked twice, in other words or beside a shipped item: the
    # numbers the answer depends on differ (a matching network's frequency does not count)
    def numbers(it):
        qs = [(k, T.quantity(t, k, "x") if k != "number" else float(t))
              for t, k in quantities(it.question)]
        if it.family in ("vswr", "return_loss", "quarter_wave", "l_match_q"):
            return it.family, tuple(sorted(x for _, x in qs[:2]))
        if it.family == "rx_power":  # the two antennas' gains in either order
            return it.family, tuple(sorted(qs))
        return it.family, tuple(qs)  # cascaded stages in their order
    seen = [numbers(x) for x in [*shipped, *generate(79, 0)]]
    assert len(set(seen)) == len(seen) == 40 + 8 * 79
    for it in a:  # no degenerate item: in the family's range, not matched, not trivial
        lo, hi = RANGES[it.family]
        assert lo <= it.answer <= hi and math.isfinite(it.answer), it.id
        assert it.family != "vswr" or it.answer > 1
        assert it.tool and it.quantity and it.source and it.tolerance == 0.02
    # generating writes nothing of the shipped file, which `build` still makes byte for byte
    assert _sha256("datasets/rf_design/design.jsonl") == SHIPPED_SHA256
    build(tmp_path)
    from pathlib import Path

    assert (tmp_path / "design.jsonl").read_bytes() == \
        Path("datasets/rf_design/design.jsonl").read_bytes()


def test_generated_answers_are_the_calculators_and_the_checker_takes_them():
    from workbench.agent_packs.rf.generate import generate

    items = generate(79, 3)
    assert len(items) == 8 * 79
    by_family: dict[str, int] = {}
    for it in items:
        qs = [(T.quantity(t, k, "x") if k != "number" else float(t), k)
              for t, k in quantities(it.question)]
        v = [x for x, _ in qs]
        # recomputed here from the question's own numbers, not through the generator
        if it.family == "vswr":
            g = abs(v[1] - v[0]) / (v[1] + v[0])
            assert it.answer == pytest.approx((1 + g) / (1 - g), rel=1e-3), it.id
        elif it.family == "return_loss":
            assert it.answer == pytest.approx(-20 * math.log10(abs(v[1] - v[0]) / (v[1] + v[0])),
                                              rel=1e-3), it.id
        elif it.family == "quarter_wave":
            ohms = [x for x, k in qs if k == "impedance"]
            assert it.answer == pytest.approx(math.sqrt(ohms[0] * ohms[1]), rel=1e-3), it.id
        elif it.family == "l_match_q":
            hi, lo = max(v[:2]), min(v[:2])
            assert it.answer == pytest.approx(math.sqrt(hi / lo - 1), rel=1e-3), it.id
        elif it.family == "cascade_nf":
            f_total, g_total = 0.0, 1.0
            for i in range(0, len(v), 2):
                gain, nf = 10 ** (v[i] / 10), 10 ** (v[i + 1] / 10)
                f_total += nf if i == 0 else (nf - 1) / g_total
                g_total *= gain
            assert it.answer == pytest.approx(10 * math.log10(f_total), rel=1e-3), it.id
            assert not correct(v[1], it)  # the first stage's figure alone is not the answer
        elif it.family in ("fspl", "rx_power"):
            f = next(x for x, k in qs if k == "frequency")
            d = next(x for x, k in qs if k == "length")
            fspl = 20 * math.log10(4 * math.pi * d * f / 299_792_458.0)
            if it.family == "fspl":
                assert it.answer == pytest.approx(fspl, rel=1e-3), it.id
            else:
                pt = next(x for x, k in qs if k == "power_dbm")
                gains = sum(x for x, k in qs if k == "gain_dbi")
                assert it.answer == pytest.approx(pt + gains - fspl, rel=1e-3), it.id
                assert -120 <= it.answer <= -20
        elif it.family == "coax":
            d, dd, er = v
            assert it.answer == pytest.approx(60 / math.sqrt(er) * math.log(dd / d),
                                              rel=1e-3), it.id
        by_family[it.family] = by_family.get(it.family, 0) + 1
        # the calculator the item names, called as the guided agent binds the question's
        # quantities, gives exactly the item's answer; the checker takes it, and the number
        # a model would write
        values = calculator_values(it)
        assert it.answer in values, it.id
        assert correct(it.answer, it) and correct(parse_number(f"about {it.answer} {it.unit}"),
                                                  it), it.id
        assert not correct(it.answer * 1.05, it)
    assert by_family == {f: 79 for f in by_family} and len(by_family) == 8


def test_generated_items_are_written_only_where_the_workbench_may(tmp_path, cli):
    import shutil

    from workbench.agent_packs.rf.api import load_items
    from workbench.agent_packs.rf.generate import (
        MARKER,
        capacity,
        generate,
        main,
        write_generated,
    )
    from workbench.errors import WorkbenchError

    out = tmp_path / "gen"
    info = main([str(out), "--per-family", "3", "--seed", "7"])
    assert info["items"] == 24 and (out / MARKER).is_file()
    items = load_items(out)  # a folder the rf pack's agent.data can name
    assert [x.model_dump() for x in items] == [x.model_dump() for x in generate(3, 7)]
    assert write_generated(out, 4, 7)["items"] == 32  # its own folder: replaced
    r = cli("agent", "generate-design", str(out), "--per-family", "2", "--seed", "1")
    assert r.returncode == 0 and "16 items" in r.stdout, r
    assert len(load_items(out)) == 16 and load_items(out)[0].id == "rfg-s1-vswr-000"
    # never the shipped folder, a user's folder or a file
    shipped = tmp_path / "rf_design"
    shutil.copytree("datasets/rf_design", shipped)
    for target in (shipped, out / "design.jsonl"):
        with pytest.raises(WorkbenchError, match="not made by the workbench|not a folder the "
                                                 "workbench made"):
            write_generated(target, 2, 0)
    assert _sha256(shipped / "design.jsonl") == SHIPPED_SHA256
    assert not (shipped / MARKER).exists()
    r = cli("agent", "generate-design", str(shipped), "--per-family", "2")
    assert r.returncode != 0 and "refusing" in r.stderr and r.stderr.count("\n") <= 1, r
    # bad sizes: one line naming the field; the most there is, said
    for bad, field in ((0, "per_family"), (True, "per_family")):
        with pytest.raises(WorkbenchError, match=f"^{field}: "):
            generate(bad, 0)
    with pytest.raises(WorkbenchError, match="^seed: "):
        generate(2, -1)
    cap = capacity(("vswr", "return_loss", "quarter_wave", "l_match_q", "fspl"))
    assert min(cap.values()) == cap["quarter_wave"] == 79  # as the CLI's help says
    with pytest.raises(WorkbenchError, match="^per_family: 80 asked, but quarter_wave has only "
                                             "79 distinct items; at most 79 per family$"):
        generate(80, 0)
