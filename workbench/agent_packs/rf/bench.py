"""The RF numeric design benchmark: questions written from the shipped RF corpus's formulas,
answers computed by the calculators (whose values the tests check against the corpus's own
worked examples), accepted within a relative tolerance.

`python -m workbench.agent_packs.rf.generate datasets/rf_design` rewrites the shipped file (40
hand-picked items, `SHIPPED`); `python -m workbench.agent_packs.rf.generate OUT --per-family
25 --seed 0` writes seeded generated items instead (`workbench.agent_packs.rf.generate`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, StrictStr

from workbench.agent_packs.rf import tools as T
from workbench.io import write_jsonl
from workbench.records import Record

TOLERANCE = 0.02


class DesignItem(Record):
    id: StrictStr
    question: StrictStr
    answer: float
    unit: StrictStr = ""
    quantity: StrictStr  # the calculator's output field that answers it
    tool: StrictStr
    family: StrictStr
    tolerance: float = Field(TOLERANCE, gt=0)
    source: StrictStr = ""  # the corpus file with the formula


# The shipped benchmark's hand-picked values, five per family, in the file's order.
SHIPPED: dict[str, list[tuple[Any, ...]]] = {
    "vswr": [(75, 50), (100, 50), (25, 50), (150, 75), (30, 50)],  # (load, z0)
    "return_loss": [(75, 50), (100, 50), (20, 50), (120, 75), (60, 50)],  # (load, z0)
    "quarter_wave": [(100, 50, "1 GHz"), (200, 50, "500 MHz"), (25, 50, "2.4 GHz"),
                     (300, 75, "100 MHz"), (150, 50, "900 MHz")],  # (load, z0, frequency)
    "l_match_q": [(50, 200, "100 MHz"), (50, 500, "1 GHz"), (50, 10, "2.4 GHz"),
                  (75, 300, "50 MHz"), (50, 150, "433 MHz")],  # (source, load, frequency)
    "cascade_nf": [(((15, 1), (10, 6)),), (((20, 0.8), (12, 8)),), (((10, 2), (10, 10)),),
                   (((25, 1.5), (-6, 6)),), (((12, 3), (20, 12)),)],  # ((gain, nf), ...)
    "fspl": [("2.4 GHz", "100 m"), ("900 MHz", "1 km"), ("5.8 GHz", "50 m"),
             ("28 GHz", "100 m"), ("433 MHz", "10 km")],  # (frequency, distance)
    "rx_power": [(20, 3, 3, "2.4 GHz", "100 m"), (30, 10, 10, "5.8 GHz", "2 km"),
                 (10, 0, 2, "900 MHz", "500 m"), (27, 6, 6, "433 MHz", "5 km"),
                 (14, 2, 2, "868 MHz", "1 km")],  # (tx dBm, tx dBi, rx dBi, frequency, distance)
    "coax": [("0.9 mm", "2.95 mm", 2.25), ("1 mm", "3.5 mm", 2.25), ("0.5 mm", "1.7 mm", 1.0),
             ("1.2 mm", "7.2 mm", 2.1), ("0.6 mm", "3.7 mm", 2.25)],  # (d, D, er)
}
FAMILIES = tuple(SHIPPED)

# The question wordings of each family: the first is the shipped items'; the others say the
# same with the same quantities (used by the generator).
WORDINGS: dict[str, list[str]] = {
    "vswr": ["A {z0} ohm line is terminated in a {zl} ohm resistive load. What is the VSWR on "
             "the line?",
             "What VSWR does a {zl} ohm resistive load produce on a {z0} ohm line?"],
    "return_loss": ["What is the return loss in dB of a {zl} ohm load on a {z0} ohm line?",
                    "A {z0} ohm line feeds a {zl} ohm resistive load. What is the return loss "
                    "in dB?"],
    "quarter_wave": ["What characteristic impedance must a quarter-wave section have to match "
                     "a {rl} ohm load to a {z0} ohm line at {f}?",
                     "A quarter-wave transformer matches a {rl} ohm load to a {z0} ohm line "
                     "at {f}. What characteristic impedance must its section have?"],
    "l_match_q": ["An L-section matches a {rl} ohm load to a {rs} ohm source at {f}. What is "
                  "the loaded Q of the network?",
                  "What is the loaded Q of an L-section network that matches a {rl} ohm load "
                  "to a {rs} ohm source at {f}?"],
    "cascade_nf": ["A receiver has {text}. What is the total noise figure in dB?",
                   "What is the total noise figure in dB of a receiver chain made of {text}?"],
    "fspl": ["What is the free-space path loss in dB at {f} over {d}?",
             "Over {d} at {f}, what is the free-space path loss in dB?"],
    "rx_power": ["A {pt} dBm transmitter with a {gt} dBi antenna sends at {f} over {d} in free "
                 "space to a {gr} dBi antenna. What power in dBm is received?",
                 "A {pt} dBm transmitter feeds a {gt} dBi antenna at {f}; the receiving antenna, "
                 "{d} away in free space, has {gr} dBi gain. What power in dBm is received?"],
    "coax": ["A coaxial line has an inner conductor of {d} diameter and an outer conductor of "
             "{dd} inner diameter, filled with a dielectric of relative permittivity {er}. What "
             "is its characteristic impedance?",
             "What is the characteristic impedance of a coaxial line whose inner conductor is "
             "{d} in diameter and whose outer conductor has a {dd} inner diameter, with a "
             "dielectric of relative permittivity {er} between them?"],
}


def _vswr(zl, z0) -> tuple[float, dict[str, Any]]:
    return T.reflection(f"{zl} ohm", f"{z0} ohm")["vswr"], {"zl": zl, "z0": z0}


def _return_loss(zl, z0) -> tuple[float, dict[str, Any]]:
    return T.reflection(f"{zl} ohm", f"{z0} ohm")["return_loss_db"], {"zl": zl, "z0": z0}


def _quarter_wave(rl, z0, f) -> tuple[float, dict[str, Any]]:
    return T.quarter_wave(f"{rl} ohm", f"{z0} ohm", f)["z_section_ohm"], \
        {"rl": rl, "z0": z0, "f": f}


def _l_match_q(rs, rl, f) -> tuple[float, dict[str, Any]]:
    return T.l_match(f"{rs} ohm", f"{rl} ohm", f)["q"], {"rs": rs, "rl": rl, "f": f}


def _cascade_nf(stages) -> tuple[float, dict[str, Any]]:
    spec = [{"gain": f"{g} dB", "nf": f"{n} dB"} for g, n in stages]
    text = " followed by ".join(f"a stage with {g} dB gain and {n} dB noise figure"
                                for g, n in stages)
    return T.cascade_noise_figure(spec)["nf_db"], {"text": text}


def _fspl(f, d) -> tuple[float, dict[str, Any]]:
    return T.link_budget("0 dBm", f, d)["fspl_db"], {"f": f, "d": d}


def _rx_power(pt, gt, gr, f, d) -> tuple[float, dict[str, Any]]:
    return T.link_budget(f"{pt} dBm", f, d, f"{gt} dBi", f"{gr} dBi")["rx_power_dbm"], \
        {"pt": pt, "gt": gt, "gr": gr, "f": f, "d": d}


def _coax(d, dd, er) -> tuple[float, dict[str, Any]]:
    return T.coax_impedance(d, dd, er)["z0_ohm"], {"d": d, "dd": dd, "er": er}


# family -> (calculator, its output field, unit, corpus file, answer and question fields)
FAMILY: dict[str, tuple[str, str, str, str, Callable[..., tuple[float, dict[str, Any]]]]] = {
    "vswr": ("reflection", "vswr", "", "02_reflection_and_vswr.md", _vswr),
    "return_loss": ("reflection", "return_loss_db", "dB", "02_reflection_and_vswr.md",
                    _return_loss),
    "quarter_wave": ("quarter_wave", "z_section_ohm", "ohm", "05_impedance_matching.md",
                     _quarter_wave),
    "l_match_q": ("l_match", "q", "", "05_impedance_matching.md", _l_match_q),
    "cascade_nf": ("cascade_noise_figure", "nf_db", "dB", "06_noise.md", _cascade_nf),
    "fspl": ("link_budget", "fspl_db", "dB", "12_antennas_and_links.md", _fspl),
    "rx_power": ("link_budget", "rx_power_dbm", "dBm", "12_antennas_and_links.md", _rx_power),
    "coax": ("coax_impedance", "z0_ohm", "ohm", "01_transmission_lines.md", _coax),
}


def make_item(family: str, params: tuple[Any, ...], wording: int = 0) -> dict[str, Any]:
    """One item's fields but its id: `params` as in `SHIPPED`, the answer from the
    calculator (a refused value raises its `ToolError`), the question in `wording`."""
    tool, quantity, unit, source, calc = FAMILY[family]
    value, fields = calc(*params)
    return {"family": family, "tool": tool, "quantity": quantity, "unit": unit,
            "question": WORDINGS[family][wording].format(**fields), "answer": value,
            "source": source}


def _items() -> list[dict[str, Any]]:
    return [make_item(family, params) for family, values in SHIPPED.items()
            for params in values]


def build(out: str | Path) -> int:
    rows = [DesignItem(id=f"rfd-{i:03d}", **r) for i, r in enumerate(_items())]
    Path(out).mkdir(parents=True, exist_ok=True)
    write_jsonl(Path(out) / "design.jsonl", rows)
    return len(rows)


def correct(value: float | None, item: DesignItem) -> bool:
    if value is None:
        return False
    return abs(value - item.answer) <= item.tolerance * max(abs(item.answer), 1e-9)
