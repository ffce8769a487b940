"""The RF numeric design benchmark: questions written from the shipped RF corpus's formulas,
answers computed by the calculators (whose values the tests check against the corpus's own
worked examples), accepted within a relative tolerance.

`python -m workbench.agent_packs.rf.bench datasets/rf_design` rewrites the shipped file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import Field, StrictStr

from workbench.agent_packs.rf import tools as T
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


def _items() -> list[dict[str, Any]]:
    out = []

    def add(family, tool, quantity, unit, question, value, source):
        out.append({"family": family, "tool": tool, "quantity": quantity, "unit": unit,
                    "question": question, "answer": value, "source": source})

    for zl, z0 in [(75, 50), (100, 50), (25, 50), (150, 75), (30, 50)]:
        r = T.reflection(f"{zl} ohm", f"{z0} ohm")
        add("vswr", "reflection", "vswr", "", f"A {z0} ohm line is terminated in a {zl} ohm "
            "resistive load. What is the VSWR on the line?", r["vswr"],
            "02_reflection_and_vswr.md")
    for zl, z0 in [(75, 50), (100, 50), (20, 50), (120, 75), (60, 50)]:
        r = T.reflection(f"{zl} ohm", f"{z0} ohm")
        add("return_loss", "reflection", "return_loss_db", "dB", f"What is the return loss in "
            f"dB of a {zl} ohm load on a {z0} ohm line?", r["return_loss_db"],
            "02_reflection_and_vswr.md")
    for rl, z0, f in [(100, 50, "1 GHz"), (200, 50, "500 MHz"), (25, 50, "2.4 GHz"),
                      (300, 75, "100 MHz"), (150, 50, "900 MHz")]:
        r = T.quarter_wave(f"{rl} ohm", f"{z0} ohm", f)
        add("quarter_wave", "quarter_wave", "z_section_ohm", "ohm", f"What characteristic "
            f"impedance must a quarter-wave section have to match a {rl} ohm load to a {z0} "
            f"ohm line at {f}?", r["z_section_ohm"], "05_impedance_matching.md")
    for rs, rl, f in [(50, 200, "100 MHz"), (50, 500, "1 GHz"), (50, 10, "2.4 GHz"),
                      (75, 300, "50 MHz"), (50, 150, "433 MHz")]:
        r = T.l_match(f"{rs} ohm", f"{rl} ohm", f)
        add("l_match_q", "l_match", "q", "", f"An L-section matches a {rl} ohm load to a {rs} "
            f"ohm source at {f}. What is the loaded Q of the network?", r["q"],
            "05_impedance_matching.md")
    for stages in [((15, 1), (10, 6)), ((20, 0.8), (12, 8)), ((10, 2), (10, 10)),
                   ((25, 1.5), (-6, 6)), ((12, 3), (20, 12))]:
        spec = [{"gain": f"{g} dB", "nf": f"{n} dB"} for g, n in stages]
        r = T.cascade_noise_figure(spec)
        text = " followed by ".join(f"a stage with {g} dB gain and {n} dB noise figure"
                                    for g, n in stages)
        add("cascade_nf", "cascade_noise_figure", "nf_db", "dB", f"A receiver has {text}. "
            "What is the total noise figure in dB?", r["nf_db"], "06_noise.md")
    for f, d in [("2.4 GHz", "100 m"), ("900 MHz", "1 km"), ("5.8 GHz", "50 m"),
                 ("28 GHz", "100 m"), ("433 MHz", "10 km")]:
        r = T.link_budget("0 dBm", f, d)
        add("fspl", "link_budget", "fspl_db", "dB", f"What is the free-space path loss in dB at "
            f"{f} over {d}?", r["fspl_db"], "12_antennas_and_links.md")
    for pt, gt, gr, f, d in [(20, 3, 3, "2.4 GHz", "100 m"), (30, 10, 10, "5.8 GHz", "2 km"),
                             (10, 0, 2, "900 MHz", "500 m"), (27, 6, 6, "433 MHz", "5 km"),
                             (14, 2, 2, "868 MHz", "1 km")]:
        r = T.link_budget(f"{pt} dBm", f, d, f"{gt} dBi", f"{gr} dBi")
        add("rx_power", "link_budget", "rx_power_dbm", "dBm", f"A {pt} dBm transmitter with a "
            f"{gt} dBi antenna sends at {f} over {d} in free space to a {gr} dBi antenna. "
            "What power in dBm is received?", r["rx_power_dbm"], "12_antennas_and_links.md")
    for d, dd, er in [("0.9 mm", "2.95 mm", 2.25), ("1 mm", "3.5 mm", 2.25),
                      ("0.5 mm", "1.7 mm", 1.0), ("1.2 mm", "7.2 mm", 2.1),
                      ("0.6 mm", "3.7 mm", 2.25)]:
        r = T.coax_impedance(d, dd, er)
        add("coax", "coax_impedance", "z0_ohm", "ohm", f"A coaxial line has an inner conductor "
            f"of {d} diameter and an outer conductor of {dd} inner diameter, filled with a "
            f"dielectric of relative permittivity {er}. What is its characteristic impedance?",
            r["z0_ohm"], "01_transmission_lines.md")
    return out


def build(out: str | Path) -> int:
    from workbench.io import write_jsonl

    rows = [DesignItem(id=f"rfd-{i:03d}", **r) for i, r in enumerate(_items())]
    Path(out).mkdir(parents=True, exist_ok=True)
    write_jsonl(Path(out) / "design.jsonl", rows)
    return len(rows)


def correct(value: float | None, item: DesignItem) -> bool:
    if value is None:
        return False
    return abs(value - item.answer) <= item.tolerance * max(abs(item.answer), 1e-9)


if __name__ == "__main__":
    print(json.dumps({"items": build(sys.argv[1])}))
