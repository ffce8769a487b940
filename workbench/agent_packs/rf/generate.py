"""Seeded design items generated from the calculators, beside the 40 shipped ones.

For each family of the shipped benchmark (`bench.SHIPPED`), the values are drawn from a
family's grid of round, realistic values: loads from the E12 series and round resistances
on 50, 75, 100 and 300 ohm lines, frequencies from the common bands, distances from 10 m to
50 km, receiver stages as LNAs, amplifiers and lossy passives, coaxial dimensions in mm
with the usual dielectrics. The question is one of the family's wordings (`bench.WORDINGS`,
the shipped one first) and the answer is the calculator's, made by `bench.make_item` as the
shipped items are. A draw is skipped when the calculator refuses it, when its answer is out
of the family's sensible range (`RANGES`: a matched load, VSWR past 20, a Q under 0.3, a
received power under -120 dBm, ...), when a trivial reading is already within tolerance
(a cascade whose noise figure is the first stage's), or when it repeats an item, shipped or
drawn: items are told apart by the values the answer depends on (a quarter-wave section or
an L-section's Q at another frequency is the same item; a load and line swapped, or the two
antennas' gains swapped, too).

Each family walks its own seeded shuffle of its grid, so a larger `per_family` extends a
smaller one (the first N items are the same) and the families do not depend on each other.
Ids say the item is generated and carry the seed: `rfg-s0-vswr-007`.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workbench.agent_packs.rf import tools as T
from workbench.agent_packs.rf.bench import (
    FAMILIES,
    SHIPPED,
    TOLERANCE,
    DesignItem,
    build,
    make_item,
)
from workbench.agents.tools import ToolError
from workbench.errors import WorkbenchError
from workbench.io import atomic_write_json, check_made_here, write_jsonl

MARKER = "design_generated.json"  # written last into a folder of generated items

E12 = (10, 12, 15, 18, 22, 27, 33, 39, 47, 56, 68, 82)
LOADS = tuple(sorted({5, 6.8, 8.2, *E12, *(10 * x for x in E12), 20, 25, 30, 40, 60, 75,
                      200, 300, 500, 1000}))
LINES = (50, 75, 100, 300)  # coax, video coax, differential pairs, twin-lead
FREQS = ("13.56 MHz", "27 MHz", "50 MHz", "100 MHz", "144 MHz", "433 MHz", "500 MHz",
         "868 MHz", "900 MHz", "915 MHz", "1 GHz", "1.2 GHz", "1.575 GHz", "1.8 GHz", "2 GHz",
         "2.4 GHz", "3.5 GHz", "5 GHz", "5.8 GHz", "10 GHz", "24 GHz", "28 GHz")
MATCH_FREQS = FREQS[:-2]  # lumped and quarter-wave matching up to 10 GHz
DISTANCES = ("10 m", "20 m", "50 m", "100 m", "200 m", "250 m", "500 m", "1 km", "1.5 km",
             "2 km", "3 km", "5 km", "10 km", "20 km", "50 km")
TX_DBM = (0, 10, 14, 17, 20, 23, 27, 30, 33)
GAINS_DBI = (0, 2, 3, 5, 6, 8, 10, 12, 15, 18, 21, 24, 30)
LNA = list(itertools.product((10, 12, 15, 18, 20, 25, 30),
                             (0.5, 0.6, 0.8, 1, 1.2, 1.5, 2, 2.5, 3)))
LATER = [*itertools.product((6, 10, 12, 15, 20, 25), (3, 4, 5, 6, 8, 10, 12, 15)),
         *((-loss, loss) for loss in (1, 2, 3, 4, 5, 6, 7, 8, 10))]  # amplifiers, passives
LAST = [(20, 10), (30, 12), (15, 8), (-3, 3), (-6, 6)]  # IF amplifiers and filters
COAX_D = (0.3, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.1, 1.2, 1.4, 1.5, 1.6, 2, 2.4, 3)
COAX_DD = (1.5, 1.7, 2, 2.4, 2.95, 3, 3.5, 3.7, 4, 4.6, 5, 6, 7.2, 8, 10, 12, 15)
COAX_ER = (1.0, 1.3, 1.4, 1.6, 2.1, 2.25)  # air, foams, PTFE, polyethylene
RX_DRAWS = 1_000_000  # received-power draws before a family counts as exhausted

# family -> (lowest, highest) sensible answer; a draw outside is skipped
RANGES: dict[str, tuple[float, float]] = {
    "vswr": (1.0, 20.0), "return_loss": (1.0, 40.0), "quarter_wave": (15.0, 150.0),
    "l_match_q": (0.3, 10.0), "cascade_nf": (0.3, 20.0), "fspl": (40.0, 160.0),
    "rx_power": (-120.0, -20.0), "coax": (25.0, 150.0)}


def _mm(x: float) -> str:
    return f"{x:g} mm"


def _si(x: Any, kind: str) -> float:
    return T.quantity(x, kind, "x") if isinstance(x, str) else float(x)


def _max_gain(f_hz: float) -> float:
    """The largest antenna gain drawn at a frequency: small antennas below 1 GHz, no dishes
    below 3 GHz."""
    return 10 if f_hz < 1e9 else 24 if f_hz < 3e9 else 30


def _space(family: str) -> Iterator[tuple[Any, ...]]:
    """The family's grid, without the matching families' frequency (drawn per item)."""
    if family in ("vswr", "return_loss"):
        yield from ((zl, z0) for zl in LOADS for z0 in LINES)
    elif family == "quarter_wave":
        yield from ((rl, z0) for rl in LOADS for z0 in LINES[:3])
    elif family == "l_match_q":
        yield from ((rs, rl) for rs in LINES for rl in LOADS)
    elif family == "cascade_nf":
        yield from ((((g, n), s2),) for (g, n), s2 in itertools.product(LNA, LATER))
        yield from ((((g, n), s2, s3),) for (g, n), s2, s3 in itertools.product(LNA, LATER,
                                                                                LAST))
    elif family == "fspl":
        yield from itertools.product(FREQS, DISTANCES)
    elif family == "rx_power":  # half a million: counted by `capacity`, sampled by `_draws`
        for f in FREQS:
            gains = [g for g in GAINS_DBI if g <= _max_gain(_si(f, "frequency"))]
            yield from ((pt, gt, gr, f, d) for pt, gt, gr, d in itertools.product(
                TX_DBM, gains, gains, DISTANCES))
    elif family == "coax":
        yield from ((_mm(d), _mm(dd), er) for d in COAX_D for dd in COAX_DD for er in COAX_ER
                    if dd >= 1.5 * d)
    else:
        raise WorkbenchError(f"family: unknown RF design family {family!r}")


def key(family: str, params: tuple[Any, ...]) -> tuple[Any, ...]:
    """What tells two items of a family apart: the values the answer depends on, in SI,
    in an order that does not matter where the formula is symmetric."""
    if family in ("vswr", "return_loss", "quarter_wave", "l_match_q"):
        return tuple(sorted(float(x) for x in params[:2]))
    if family == "cascade_nf":
        return tuple((float(g), float(n)) for g, n in params[0])
    if family == "fspl":
        return _si(params[0], "frequency"), _si(params[1], "length")
    if family == "rx_power":
        pt, gt, gr, f, d = params
        return (float(pt), *sorted((float(gt), float(gr))), _si(f, "frequency"),
                _si(d, "length"))
    if family == "coax":
        return _si(params[0], "length"), _si(params[1], "length"), float(params[2])
    raise WorkbenchError(f"family: unknown RF design family {family!r}")


def sound(family: str, params: tuple[Any, ...], answer: float) -> bool:
    """The answer is finite, in the family's range and not a trivial reading of the
    question (a matched load; a cascade whose first stage's noise figure is already right)."""
    lo, hi = RANGES[family]
    if not (math.isfinite(answer) and lo <= answer <= hi):
        return False
    if family in ("vswr", "return_loss", "quarter_wave", "l_match_q") and \
            float(params[0]) == float(params[1]):
        return False
    if family == "vswr" and answer <= 1.0:
        return False
    if family == "cascade_nf":
        first_nf = float(params[0][0][1])
        return abs(answer - first_nf) > TOLERANCE * abs(answer)
    return True


def _walk(family: str, seed: int) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """(params, item fields) of the family's sound, distinct draws, in the seed's order."""
    rng = random.Random(f"rfg:{seed}:{family}")
    taken = {key(family, p) for p in SHIPPED[family]}
    for cand in _draws(family, rng):
        params = (*cand, rng.choice(MATCH_FREQS)) if family in ("quarter_wave", "l_match_q") \
            else cand
        k = key(family, params)
        if k in taken:
            continue
        wording = rng.randrange(2)
        try:
            row = make_item(family, params, wording)
        except ToolError:
            continue
        if not sound(family, params, row["answer"]):
            continue
        taken.add(k)
        yield params, row


def _draws(family: str, rng: random.Random) -> Iterator[tuple[Any, ...]]:
    """The family's grid in a seeded shuffle; the received-power grid, too large to shuffle
    at each call, as seeded draws of its axes (repeats are skipped by the caller)."""
    if family != "rx_power":
        grid = list(_space(family))
        rng.shuffle(grid)
        yield from grid
        return
    gains = {f: [g for g in GAINS_DBI if g <= _max_gain(_si(f, "frequency"))] for f in FREQS}
    for _ in range(RX_DRAWS):
        f = rng.choice(FREQS)
        yield (rng.choice(TX_DBM), rng.choice(gains[f]), rng.choice(gains[f]), f,
               rng.choice(DISTANCES))


def capacity(families: tuple[str, ...] = FAMILIES) -> dict[str, int]:
    """How many distinct items each family can give beside the shipped ones (the same for
    every seed; received power, counted over its whole grid, takes a while)."""
    out = {}
    for family in families:
        taken = {key(family, p) for p in SHIPPED[family]}
        for cand in _space(family):
            params = (*cand, MATCH_FREQS[0]) if family in ("quarter_wave", "l_match_q") \
                else cand
            k = key(family, params)
            if k in taken:
                continue
            try:
                answer = make_item(family, params)["answer"]
            except ToolError:
                continue
            if sound(family, params, answer):
                taken.add(k)
        out[family] = len(taken) - len({key(family, p) for p in SHIPPED[family]})
    return out


def _check_int(value: Any, field: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise WorkbenchError(f"{field}: must be a whole number of at least {low}, got "
                             f"{value!r}")
    return value


def generate(per_family: int, seed: int) -> list[DesignItem]:
    """`per_family` generated items of each family, the same for the same seed; ids
    `rfg-s{seed}-{family}-{k:03d}`, never a shipped `rfd-*` id or question."""
    _check_int(per_family, "per_family", 1)
    _check_int(seed, "seed", 0)
    width = max(3, len(str(per_family - 1)))
    out: list[DesignItem] = []
    for family in FAMILIES:
        rows = [row for _, row in itertools.islice(_walk(family, seed), per_family)]
        if len(rows) < per_family:
            most = min(capacity(tuple(f for f in FAMILIES if f != "rx_power")).values())
            raise WorkbenchError(f"per_family: {per_family} asked, but {family} has only "
                                 f"{len(rows)} distinct items; at most {most} per family")
        out += [DesignItem(id=f"rfg-s{seed}-{family}-{k:0{width}d}", **row)
                for k, row in enumerate(rows)]
    return out


def write_generated(out: str | Path, per_family: int, seed: int) -> dict[str, Any]:
    """Write `generate(per_family, seed)` as `OUT/design.jsonl` (a folder `agent.data` can
    name), then `OUT/design_generated.json` saying how. Refuses a folder the workbench did
    not make (one that is not empty and holds no `design_generated.json`), such as the
    shipped `datasets/rf_design`. Returns what the marker says."""
    folder = Path(out)
    check_made_here(folder, (MARKER,))  # before any work: never a user's folder
    items = generate(per_family, seed)
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "design.jsonl", items)
    info = {"generator": "workbench.agent_packs.rf.generate", "seed": seed,
            "per_family": per_family, "items": len(items), "families": list(FAMILIES),
            "file": str(folder / "design.jsonl")}
    atomic_write_json(folder / MARKER, info)  # written last
    return info


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """`OUT`: rebuild the shipped file there; `OUT --per-family N [--seed S]`: write N
    generated items per family into the folder OUT instead."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m workbench.agent_packs.rf.generate",
                                 description=main.__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--per-family", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.per_family is None:
        return {"items": build(a.out)}
    return write_generated(a.out, a.per_family, a.seed)


if __name__ == "__main__":
    try:
        print(json.dumps(main()))
    except WorkbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
