"""RF design calculators with unit-checked inputs, as agent tools.

Every dimensional argument is a string with its unit ("75 ohm", "2.4 GHz", "1.6 mm",
"20 dBm"); `quantity` parses it, applies the SI prefix and refuses a value of the wrong kind
("expected a frequency (Hz), got '50 ohm'"), which the agent sees as a `ToolError`. The
formulas are those of the shipped RF corpus (datasets/rf): reflection coefficient and VSWR,
quarter-wave and L-section matching, Friis cascaded noise figure, free-space link budget,
coaxial and microstrip characteristic impedance (Hammerstad's closed form).
"""

from __future__ import annotations

import cmath
import math
import re
from typing import Any

from workbench.agents.tools import Tool, ToolError

C = 299_792_458.0
PREFIX = {"p": 1e-12, "n": 1e-9, "u": 1e-6, "µ": 1e-6, "μ": 1e-6, "m": 1e-3, "c": 1e-2,
          "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}
# unit -> (dimension, the SI unit it is expressed in)
UNITS = {"ohm": "impedance", "ohms": "impedance", "Ω": "impedance", "Hz": "frequency",
         "m": "length", "dB": "ratio_db", "dBm": "power_dbm", "dBi": "gain_dbi",
         "W": "power_w", "F": "capacitance", "H": "inductance"}
DIMENSION_UNIT = {"impedance": "ohm", "frequency": "Hz", "length": "m", "ratio_db": "dB",
                  "power_dbm": "dBm", "gain_dbi": "dBi", "power_w": "W"}
_Q = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*([a-zA-Zµμ Ω]*)\s*$")
_COMPLEX = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+)\s*([-+])\s*j?\s*([0-9]*\.?[0-9]+)\s*j?\s*"
                      r"(ohms?|Ω)?\s*$")


def quantity(text: Any, dimension: str, field: str) -> float:
    """A value of `dimension` in SI units from "2.4 GHz"-style text."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        raise ToolError(f"{field}: give the unit too, e.g. \"{text} "
                        f"{DIMENSION_UNIT.get(dimension, '')}\"")
    m = _Q.match(str(text))
    if not m:
        raise ToolError(f"{field}: {text!r} is not a number with a unit")
    value, unit = float(m.group(1)), m.group(2).replace(" ", "")
    unit = re.sub(r"(?i)ohms?$|Ω$", "ohm", unit)  # 50 Ohm, 50 ohms, 50 Ω, 1 kΩ
    for base in sorted(UNITS, key=len, reverse=True):  # dBm before dB before m
        if unit.endswith(base) and unit[:len(unit) - len(base)] in PREFIX:
            prefix = unit[:len(unit) - len(base)]
            if base in ("dB", "dBm", "dBi") and prefix:
                continue
            if UNITS[base] != dimension:
                raise ToolError(f"{field}: expected {dimension.replace('_', ' ')} "
                                f"({DIMENSION_UNIT.get(dimension, '?')}), got {text!r}")
            return value * PREFIX[prefix]
    raise ToolError(f"{field}: unknown unit {unit!r} in {text!r}")


def impedance(text: Any, field: str) -> complex:
    """A real ("75 ohm") or complex ("30+40j ohm") impedance."""
    m = _COMPLEX.match(str(text))
    if m:
        sign = 1 if m.group(2) == "+" else -1
        return complex(float(m.group(1)), sign * float(m.group(3)))
    return complex(quantity(text, "impedance", field), 0)


def _r(x: float, n: int = 4) -> float:
    return float(f"{x:.{n}g}")


def reflection(load: str, z0: str = "50 ohm") -> dict[str, float]:
    zl, z = impedance(load, "load"), quantity(z0, "impedance", "z0")
    if z <= 0:
        raise ToolError("z0: must be positive")
    if zl.real < 0 or zl + z == 0:
        raise ToolError("load: a passive load has a non-negative real part")
    g = (zl - z) / (zl + z)
    mag = abs(g)
    vswr = math.inf if mag >= 1 else (1 + mag) / (1 - mag)
    return {"gamma": _r(mag), "gamma_deg": _r(math.degrees(cmath.phase(g))),
            "vswr": _r(vswr), "return_loss_db": _r(-20 * math.log10(mag)) if mag else math.inf,
            "mismatch_loss_db": _r(-10 * math.log10(1 - mag * mag)) if mag < 1 else math.inf}


def vswr_to_gamma(vswr: float) -> dict[str, float]:
    if vswr < 1:
        raise ToolError("vswr: must be at least 1")
    g = (vswr - 1) / (vswr + 1)
    return {"gamma": _r(g), "return_loss_db": _r(-20 * math.log10(g)) if g else math.inf}


def quarter_wave(load: str, z0: str, frequency: str, velocity_factor: float = 1.0
                 ) -> dict[str, float]:
    rl, z, f = (quantity(load, "impedance", "load"), quantity(z0, "impedance", "z0"),
                quantity(frequency, "frequency", "frequency"))
    if rl <= 0 or z <= 0 or f <= 0 or not 0 < velocity_factor <= 1:
        raise ToolError("load, z0 and frequency must be positive; velocity_factor in (0, 1]")
    return {"z_section_ohm": _r(math.sqrt(rl * z)),
            "length_mm": _r(velocity_factor * C / f / 4 * 1000)}


def l_match(source: str, load: str, frequency: str) -> dict[str, float]:
    """Low-pass L-section: shunt C at the larger resistance, series L."""
    rs, rl, f = (quantity(source, "impedance", "source"), quantity(load, "impedance", "load"),
                 quantity(frequency, "frequency", "frequency"))
    if rs <= 0 or rl <= 0 or f <= 0:
        raise ToolError("source, load and frequency must be positive")
    hi, lo = max(rs, rl), min(rs, rl)
    q = math.sqrt(hi / lo - 1)
    x_shunt, x_series = hi / q if q else math.inf, q * lo
    w = 2 * math.pi * f
    return {"q": _r(q), "shunt_reactance_ohm": _r(x_shunt),
            "series_reactance_ohm": _r(x_series),
            "shunt_c_pf": _r(1 / (w * x_shunt) * 1e12) if q else 0.0,
            "series_l_nh": _r(x_series / w * 1e9)}


def cascade_noise_figure(stages: list[dict[str, str]]) -> dict[str, float]:
    if not stages:
        raise ToolError("stages: give at least one {gain, nf}")
    f_total, g_total = 0.0, 1.0
    for i, st in enumerate(stages):
        g = 10 ** (quantity(st.get("gain"), "ratio_db", f"stages.{i}.gain") / 10)
        f = 10 ** (quantity(st.get("nf"), "ratio_db", f"stages.{i}.nf") / 10)
        f_total += f if i == 0 else (f - 1) / g_total
        g_total *= g
    return {"nf_db": _r(10 * math.log10(f_total)), "gain_db": _r(10 * math.log10(g_total))}


def link_budget(tx_power: str, frequency: str, distance: str, tx_gain: str = "0 dBi",
                rx_gain: str = "0 dBi", losses: str = "0 dB") -> dict[str, float]:
    pt = quantity(tx_power, "power_dbm", "tx_power")
    f, d = quantity(frequency, "frequency", "frequency"), quantity(distance, "length",
                                                                    "distance")
    if f <= 0 or d <= 0:
        raise ToolError("frequency and distance must be positive")
    fspl = 20 * math.log10(4 * math.pi * d * f / C)
    pr = pt + quantity(tx_gain, "gain_dbi", "tx_gain") + quantity(rx_gain, "gain_dbi",
                                                                   "rx_gain") \
        - fspl - quantity(losses, "ratio_db", "losses")
    return {"fspl_db": _r(fspl), "rx_power_dbm": _r(pr)}


def coax_impedance(d_inner: str, d_outer: str, er: float = 1.0) -> dict[str, float]:
    d, dd = quantity(d_inner, "length", "d_inner"), quantity(d_outer, "length", "d_outer")
    if not 0 < d < dd or er < 1:
        raise ToolError("need 0 < d_inner < d_outer and er >= 1")
    return {"z0_ohm": _r(60 / math.sqrt(er) * math.log(dd / d))}


def microstrip_impedance(width: str, height: str, er: float) -> dict[str, float]:
    """Hammerstad's closed form (accurate to about 1% for 0.05 < w/h < 20)."""
    w, h = quantity(width, "length", "width"), quantity(height, "length", "height")
    if w <= 0 or h <= 0 or er < 1:
        raise ToolError("width and height must be positive and er >= 1")
    u = w / h
    if u <= 1:
        e_eff = (er + 1) / 2 + (er - 1) / 2 * ((1 + 12 / u) ** -0.5 + 0.04 * (1 - u) ** 2)
        z = 60 / math.sqrt(e_eff) * math.log(8 / u + u / 4)
    else:
        e_eff = (er + 1) / 2 + (er - 1) / 2 * (1 + 12 / u) ** -0.5
        z = 120 * math.pi / (math.sqrt(e_eff) * (u + 1.393 + 0.667 * math.log(u + 1.444)))
    return {"z0_ohm": _r(z), "e_eff": _r(e_eff)}


def _s(desc: str) -> dict[str, str]:
    return {"type": "string", "description": desc}


IMP, FREQ, LEN = (_s("An impedance with unit, e.g. \"75 ohm\" or \"30+40j ohm\"."),
                  _s("A frequency with unit, e.g. \"2.4 GHz\"."),
                  _s("A length with unit, e.g. \"1.6 mm\"."))


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


CALCULATORS: list[Tool] = [
    Tool("reflection", "Reflection coefficient, VSWR, return loss and mismatch loss of a load "
         "on a line.", _obj({"load": IMP, "z0": IMP}, ["load"]), reflection),
    Tool("vswr_to_gamma", "Reflection coefficient magnitude and return loss from a VSWR.",
         _obj({"vswr": {"type": "number", "minimum": 1}}, ["vswr"]), vswr_to_gamma),
    Tool("quarter_wave", "Impedance and physical length of a quarter-wave transformer matching "
         "a real load to a line.", _obj({"load": IMP, "z0": IMP, "frequency": FREQ,
                                         "velocity_factor": {"type": "number"}},
                                        ["load", "z0", "frequency"]), quarter_wave),
    Tool("l_match", "Q and element values of a low-pass L-section matching two resistances.",
         _obj({"source": IMP, "load": IMP, "frequency": FREQ}, ["source", "load",
                                                                "frequency"]), l_match),
    Tool("cascade_noise_figure", "Total noise figure and gain of cascaded stages (Friis).",
         _obj({"stages": {"type": "array", "minItems": 1, "items": _obj(
             {"gain": _s("Stage gain, e.g. \"15 dB\"."),
              "nf": _s("Stage noise figure, e.g. \"1.2 dB\".")}, ["gain", "nf"])}},
             ["stages"]), cascade_noise_figure),
    Tool("link_budget", "Free-space path loss and received power of a radio link.",
         _obj({"tx_power": _s("Transmit power, e.g. \"20 dBm\"."), "frequency": FREQ,
               "distance": LEN, "tx_gain": _s("e.g. \"3 dBi\"."),
               "rx_gain": _s("e.g. \"3 dBi\"."), "losses": _s("e.g. \"2 dB\".")},
              ["tx_power", "frequency", "distance"]), link_budget),
    Tool("coax_impedance", "Characteristic impedance of a coaxial line.",
         _obj({"d_inner": LEN, "d_outer": LEN, "er": {"type": "number", "minimum": 1}},
              ["d_inner", "d_outer"]), coax_impedance),
    Tool("microstrip_impedance", "Characteristic impedance and effective permittivity of a "
         "microstrip trace.", _obj({"width": LEN, "height": LEN,
                                    "er": {"type": "number", "minimum": 1}},
                                   ["width", "height", "er"]), microstrip_impedance),
]

ANSWER = Tool("answer", "Give the final numeric answer. This ends the task.",
              _obj({"quantity": {"type": "string", "description": "What the number is, e.g. "
                                 "\"vswr\"."}, "value": {"type": "number"}},
                   ["value"]), lambda value, quantity="": {"value": value,
                                                           "quantity": quantity}, final=True)
