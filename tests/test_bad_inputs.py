"""The bad-input catalogue: every case ends in one line that names the file, line or field,
with a documented exit code (2 usage or config, 3 data, 1 other) and no traceback.

The catalogue runs in-process (`main(argv)`, fast tier); a few cases run again as real
processes (full tier) for what only a process shows: its exit status and its stderr."""

import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO, cli_in_process

TESTS = str(Path(__file__).parent)
FAKE = ["-s", "models.chat.spec=fake", "-s", "models.chat.options={script: 'fake_teacher:reply'}"]


def _files(root: Path) -> dict[str, Path]:
    f = {}
    f["folder"] = root / "afolder"
    f["folder"].mkdir()
    f["nonutf8"] = root / "bad.yaml"
    f["nonutf8"].write_bytes(b"name: \xff\xfe\n")
    f["badyaml"] = root / "broken.yaml"
    f["badyaml"].write_text("name: a\nseed: [1,\n")
    f["bomb"] = root / "bomb.yaml"  # 443 bytes that expand to 9**7 values
    f["bomb"].write_text("".join(
        f"{a}: &{a} [" + ", ".join([f"*{b}"] * 9 if b else ['"x"'] * 9) + "]\n"
        for a, b in zip("abcdefg", [None, *"abcdef"], strict=True))
        + "models: {chat: {options: {x: *g}}}\n")
    f["dupkey"] = root / "dup.yaml"
    f["dupkey"].write_text("seed: 1\nname: a\nseed: 2\n")
    f["huge"] = root / "huge.yaml"
    f["huge"].write_bytes(b"#" * 2_000_000)
    f["listyaml"] = root / "list.yaml"
    f["listyaml"].write_text("- a\n- b\n")
    f["unknownkey"] = root / "unknown.yaml"
    f["unknownkey"].write_text("name: a\ntrian: {max_steps: 3}\n")
    good = json.dumps({"messages": [{"role": "user", "content": "q"},
                                    {"role": "assistant", "content": "a"}]})
    f["badjson3"] = root / "badjson.jsonl"
    f["badjson3"].write_text(f"{good}\n{good}\n{{oops\n{good}\n")
    f["badutf8"] = root / "badutf8.jsonl"
    f["badutf8"].write_bytes((good + "\n").encode() * 6 + b'{"messages": "\xff"}\n')
    f["empty"] = root / "empty.jsonl"
    f["empty"].write_text("")
    f["badrole"] = root / "role.jsonl"
    f["badrole"].write_text(json.dumps({"messages": [{"role": "wizard", "content": "q"},
                                                     {"role": "assistant", "content": "a"}]})
                            + "\n")
    f["int_content"] = root / "int.jsonl"
    f["int_content"].write_text(json.dumps({"messages": [{"role": "user", "content": 5},
                                                         {"role": "assistant", "content": "a"}
                                                         ]}) + "\n")
    f["pack"] = root / "pack.yaml"
    import yaml

    from workbench.domain_packs import PACKS

    pack = yaml.safe_load((PACKS / "generic.yaml").read_text())
    pack["distill"]["prompts"]["verifier"] = "Q: {question} {opts}"
    f["pack"].write_text(yaml.safe_dump(pack))
    f["bench_csv"] = root / "bench.csv"
    f["bench_csv"].write_text("question,A,B,C,D,answer\nq1,a,b,c,d,A\nq2,a,b,c,d,Z\n")
    f["bench_short"] = root / "bench.jsonl"
    f["bench_short"].write_text(json.dumps({"question": "q", "choices": ["a", "b"],
                                            "answer": 1}) + "\n"
                                + json.dumps({"question": "q2", "choices": ["a"],
                                              "answer": 0}) + "\n")
    f["unsupported"] = root / "only_pickles"
    f["unsupported"].mkdir()
    (f["unsupported"] / "model.pkl").write_bytes(b"\x80\x04")
    ws = root / "ws"
    (ws / "jobs" / "broken").mkdir(parents=True)
    (ws / "jobs" / "broken" / "job.json").write_text('{"id": "broken", "kin')
    f["ws"] = ws
    return f


def _index_variants(rf_index: Path, root: Path) -> dict[str, Path]:
    out = {}

    def variant(name, change):
        d = root / f"idx_{name}"
        shutil.copytree(rf_index, d)
        m = json.loads((d / "manifest.json").read_text())
        m = change(m)
        (d / "manifest.json").write_text(json.dumps(m))
        out[name] = d

    variant("files_empty", lambda m: {**m, "files": {}})
    variant("dotdot", lambda m: {**m, "files": {**m["files"], "../../x": {"bytes": 1,
                                                                          "sha256": "0"}}})
    variant("absolute", lambda m: {**m, "files": {**m["files"], "/etc/passwd": {
        "bytes": 1, "sha256": "0"}}})
    variant("as_list", lambda m: [m])
    variant("no_files", lambda m: {k: v for k, v in m.items() if k != "files"})
    d = root / "idx_nomanifest"
    shutil.copytree(rf_index, d)
    (d / "manifest.json").unlink()
    out["no_manifest"] = d
    return out


# (case id, argv builder, expected exit code, text the one line must contain)
CASES = [
    ("config-missing", lambda f, i: ["config", "show", "nope.yaml"], 2, "nope.yaml"),
    ("config-folder", lambda f, i: ["config", "show", str(f["folder"])], 2, "not a file"),
    ("config-non-utf8", lambda f, i: ["config", "show", str(f["nonutf8"])], 2, "UTF-8"),
    ("config-bad-yaml", lambda f, i: ["config", "show", str(f["badyaml"])], 2, "line 3"),
    ("config-list", lambda f, i: ["config", "show", str(f["listyaml"])], 2, "mapping"),
    ("config-alias-bomb", lambda f, i: ["config", "show", str(f["bomb"])], 2,
     "aliases expand to more than"),
    ("override-alias-bomb", lambda f, i: ["config", "show", "-s", "generation.stop={" + ", ".join(
        f["bomb"].read_text().splitlines()[:-1]) + ", x: *g}"], 2, "aliases expand"),
    ("override-recursive-alias", lambda f, i: ["config", "show", "-s",
                                               "models.chat.options={a: &a [*a]}"], 2,
     "contains itself"),
    ("config-duplicate-key", lambda f, i: ["config", "show", str(f["dupkey"])], 2,
     "duplicate key 'seed'"),
    ("config-too-large", lambda f, i: ["config", "show", str(f["huge"])], 2, "too large"),
    ("config-unknown-key", lambda f, i: ["config", "show", str(f["unknownkey"])], 2, "trian"),
    ("override-empty-key", lambda f, i: ["config", "show", "-s", "=5"], 2, "key path"),
    ("override-dot-key", lambda f, i: ["config", "show", "-s", ".=5"], 2, "key path"),
    ("override-double-dot", lambda f, i: ["config", "show", "-s", "a..b=1"], 2, "key path"),
    ("override-no-equals", lambda f, i: ["config", "show", "-s", "seed"], 2, "key=value"),
    ("override-wrong-type", lambda f, i: ["config", "show", "-s", "seed=abc"], 2, "seed"),
    ("override-negative", lambda f, i: ["config", "show", "-s", "train.max_steps=-1"], 2,
     "train.max_steps"),
    ("override-bad-literal", lambda f, i: ["config", "show", "-s", "distill.kinds=[xx]"], 2,
     "distill.kinds"),
    ("run-name-absolute", lambda f, i: ["config", "show", "-s", "name=/etc"], 2, "name"),
    ("run-name-dotdot", lambda f, i: ["config", "show", "-s", "name=../x"], 2, "name"),
    ("run-name-slash", lambda f, i: ["config", "show", "-s", "name=a/b"], 2, "name"),
    ("data-bad-json", lambda f, i: ["data", "validate", str(f["badjson3"])], 3, ":3:"),
    ("data-bad-utf8", lambda f, i: ["data", "validate", str(f["badutf8"])], 3, ":7:"),
    ("data-empty", lambda f, i: ["data", "validate", str(f["empty"])], 3, "no records"),
    ("data-missing", lambda f, i: ["data", "validate", "nope.jsonl"], 3, "nope.jsonl"),
    ("data-folder", lambda f, i: ["data", "validate", str(f["folder"])], 3, "not a file"),
    ("data-unknown-role", lambda f, i: ["data", "validate", str(f["badrole"])], 3, ":1:"),
    ("data-int-content", lambda f, i: ["data", "validate", str(f["int_content"])], 3, ":1:"),
    ("convert-into-folder", lambda f, i: ["data", "convert", str(f["badrole"]),
                                          str(f["folder"])], 3, "folder"),
    ("convert-empty", lambda f, i: ["data", "convert", str(f["empty"]),
                                    str(f["folder"].parent / "out.jsonl")], 3, "no records"),
    ("convert-bad-line", lambda f, i: ["data", "convert", str(f["badjson3"]),
                                       str(f["folder"].parent / "out2.jsonl")], 3, ":3:"),
    ("ingest-missing", lambda f, i: ["data", "ingest", "nope", "-o", "x.jsonl"], 3, "nope"),
    ("ingest-nothing-readable", lambda f, i: ["data", "ingest", str(f["unsupported"]), "-o",
                                              str(f["folder"].parent / "s.jsonl")], 3,
     "no sections found"),
    ("rag-query-negative-k", lambda f, i: ["rag", "query", str(i["files_empty"]), "x", "-k",
                                           "-5"], 2, "-k"),
    ("pack-placeholder", lambda f, i: ["distill", "run", "-s", f"domain={f['pack']}",
                                       "-s", f"output_dir={f['folder'].parent}", *FAKE], 2,
     "{opts}"),
    ("pack-missing", lambda f, i: ["distill", "run", "-s", "domain=nopack", *FAKE], 1,
     "nopack"),
    ("index-files-empty", lambda f, i: ["rag", "query", str(i["files_empty"]), "x"], 3,
     "does not list"),
    ("index-dotdot", lambda f, i: ["rag", "query", str(i["dotdot"]), "x"], 3, "plain names"),
    ("index-absolute", lambda f, i: ["rag", "query", str(i["absolute"]), "x"], 3,
     "plain names"),
    ("index-list", lambda f, i: ["rag", "query", str(i["as_list"]), "x"], 3, "JSON object"),
    ("index-no-files", lambda f, i: ["rag", "query", str(i["no_files"]), "x"], 3, "'files'"),
    ("chat-index-no-manifest", lambda f, i: ["chat", "--model", "fake", "--index",
                                              str(i["no_manifest"]), "-q", "x"], 1,
     "no manifest.json"),
    ("chat-setup-unknown-key", lambda f, i: ["chat", "--setup", "model=fake;colour=blue", "-q",
                                              "x"], 2, "'colour=blue' is not key=value"),
    ("chat-setup-bad-k", lambda f, i: ["chat", "--setup", "model=fake;k=0", "-q", "x"], 2,
     "k: Input should be greater than or equal to 1"),
    ("index-no-manifest", lambda f, i: ["rag", "query", str(i["no_manifest"]), "x"], 1,
     "manifest"),
    ("index-missing", lambda f, i: ["rag", "query", "nope-idx", "x"], 1, "nope-idx"),
    ("jobs-show-dotdot", lambda f, i: ["jobs", "show", "../../x", "--workspace",
                                       str(f["ws"])], 1, "job id"),
    ("jobs-show-unknown", lambda f, i: ["jobs", "show", "nope", "--workspace", str(f["ws"])],
     1, "no such job"),
    ("jobs-start-kind", lambda f, i: ["jobs", "start", "dance", "--workspace", str(f["ws"])],
     1, "dance"),
    ("bench-csv-answer", lambda f, i: ["eval", "run", "-s", f"eval.benchmark={f['bench_csv']}",
                                       "-s", "eval.conditions=[none]", *FAKE], 3, ":3"),
    ("bench-one-option", lambda f, i: ["eval", "run", "-s",
                                       f"eval.benchmark={f['bench_short']}",
                                       "-s", "eval.conditions=[none]", *FAKE], 3, ":2"),
    ("bench-missing", lambda f, i: ["eval", "run", "-s", "eval.benchmark=nope.jsonl",
                                    "-s", "eval.conditions=[none]", *FAKE], 3, "nope.jsonl"),
    ("eval-rag-no-index", lambda f, i: ["eval", "run", "-s", f"eval.benchmark={f['bench_csv']}",
                                        "-s", f"output_dir={f['folder'].parent}", *FAKE], 1,
     "eval.index"),
    ("train-no-data", lambda f, i: ["train", "run", "-s", f"output_dir={f['folder'].parent}",
                                    "-s", "name=nodata"], 1, "train.data"),
    ("distill-report-not-run", lambda f, i: ["distill", "report", str(f["folder"])], 1,
     "not a finished distillation"),
    ("models-resolve", lambda f, i: ["models", "resolve", "no/such-model"], 1, "no/such-model"),
    ("compare-config-missing", lambda f, i: ["compare", "run", "nope.yaml"], 2, "nope.yaml"),
    ("smoke-bad-yaml", lambda f, i: ["smoke", str(f["badyaml"])], 2, "line 3"),
    ("trajsynth-env-missing", lambda f, i: ["trajsynth", "profile", "nope.sqlite"], 3,
     "nope.sqlite"),
    ("agent-unknown-pack", lambda f, i: ["agent", "eval", "nope"], 1, "available: kgv"),
    ("agent-config-missing", lambda f, i: ["agent", "eval", "kgv", "nope.yaml"], 2,
     "nope.yaml"),
    ("fed-split-no-rows", lambda f, i: ["fed", "split", str(f["folder"]),
                                        str(f["folder"].parent / "sites")], 1, "no mcQTSA"),
    ("loop-config-missing", lambda f, i: ["loop", "history", "nope.yaml"], 2, "nope.yaml"),
    ("app-workspace-file", lambda f, i: ["app", "--workspace", str(f["badyaml"])], 1,
     "not a folder"),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, rf_index):
    root = tmp_path_factory.mktemp("bad")
    return _files(root), _index_variants(rf_index, root)


def _check(r, code, needle):
    err = r.stderr.strip()
    assert "Traceback" not in err, err[-2000:]
    assert r.returncode == code, (r.returncode, err[-500:])
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 or lines[-1].startswith("error:") or code == 2, err[-800:]
    assert needle in err, err[-500:]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_ends_in_one_line(inputs, case):
    files, indexes = inputs
    _, argv, code, needle = case
    _check(cli_in_process(*argv(files, indexes), env={"TQDM_DISABLE": "1"}), code, needle)


PROCESS_CASES = ["config-bad-yaml", "data-bad-json", "index-no-manifest", "override-negative"]


@pytest.mark.parametrize("name", PROCESS_CASES)
def test_bad_input_as_a_process_exits_with_its_code(inputs, name, cli_process):
    """What only a real process shows: the exit status, the error on stderr and no
    traceback on either stream."""
    files, indexes = inputs
    _, argv, code, needle = next(c for c in CASES if c[0] == name)
    r = cli_process(*argv(files, indexes), env={"PYTHONPATH": TESTS, "TQDM_DISABLE": "1"},
                    cwd=REPO, timeout=180)
    _check(r, code, needle)
    assert "Traceback" not in r.stdout and "error:" not in r.stdout


def test_catalogue_covers_every_exit_code_and_command_group(inputs):
    """Each documented exit code is produced by some case, and every command group of the
    CLI that reads a user's file or setting has at least one case."""
    import typer.main

    from workbench.cli.main import app

    files, indexes = inputs
    assert {c[2] for c in CASES} == {1, 2, 3}
    groups = set(typer.main.get_command(app).commands)
    covered = {c[1](files, indexes)[0] for c in CASES}
    untested = groups - covered - {"serve"}  # serve's bad requests: test_serve_hardening
    assert not untested, f"command groups with no bad-input case: {sorted(untested)}"


def test_unreadable_job_does_not_hide_the_others(inputs, cli):
    files, _ = inputs
    from workbench.jobs import Job, list_jobs

    ws = files["ws"]
    Job(id="ok1", kind="distill", workspace=str(ws), config={}, status="completed").save()
    r = cli("jobs", "list", "--workspace", str(ws))
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert "ok1" in r.stdout and "unreadable" in r.stdout and "broken" in r.stdout
    jobs = {j.id: j for j in list_jobs(ws)}
    assert jobs["broken"].status == "unreadable" and "job.json" in jobs["broken"].error


def test_a_run_refused_before_its_first_output_leaves_nothing(tmp_path, cli):
    """Bad input found after the run folder's lock was taken: the lock, the run folder and
    the folders made for it are gone again; a folder that was already there stays."""
    r = cli("train", "run", "-s", f"output_dir={tmp_path / 'new' / 'deep'}", "-s", "name=x")
    assert r.returncode == 1 and "train.data" in r.stderr
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "runs").mkdir()
    r = cli("train", "run", "-s", f"output_dir={tmp_path / 'runs'}", "-s", "name=x")
    assert r.returncode == 1 and [p.name for p in tmp_path.iterdir()] == ["runs"]
    assert list((tmp_path / "runs").iterdir()) == []
