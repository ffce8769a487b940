"""`workbench trajsynth tasks|explore|export` over an OUT folder are the pipeline's steps, one
api call each (issue 26's thin shells): run one after the other they make the files
`workbench trajsynth run` makes, and a second `explore` searches nothing again."""

import json

CONFIG = """\
trajsynth:
  env: chinook
  explore: {generator: grammar, prior: uniform, iterations: 60, stop_after: 1}
  split: all
  limit: 3
"""


def _messages(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_step_commands_make_what_the_pipeline_makes(cli, tmp_path):
    cfg = tmp_path / "ts.yaml"
    cfg.write_text(CONFIG)
    out = tmp_path / "steps"

    r = cli("trajsynth", "tasks", "chinook", str(cfg), "-o", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "tasks.jsonl").is_file() and f"wrote {out / 'tasks.jsonl'}" in r.stdout

    r = cli("trajsynth", "explore", "chinook", str(cfg), "-o", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("3/3 tasks verified") and len(r.stdout.splitlines()) == 1, \
        r.stdout
    trees = {p.name: p.stat().st_mtime_ns for p in (out / "trees").glob("*.json")}
    assert len(trees) == 3

    again = cli("trajsynth", "explore", "chinook", "-c", str(cfg), "-o", str(out))
    assert again.returncode == 0 and "3/3 tasks verified" in again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (out / "trees").glob("*.json")} == trees

    (out / "sft.messages.jsonl").unlink()
    r = cli("trajsynth", "export", "chinook", str(cfg), "-o", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("3 SFT conversations, 3 ICL entries"), r.stdout  # progress: stderr
    assert len(r.stdout.splitlines()) == 1

    r = cli("trajsynth", "run", str(cfg), "-s", f"output_dir={tmp_path / 'run'}")
    assert r.returncode == 0, r.stderr[-2000:]
    pipeline = tmp_path / "run" / "experiment" / "trajsynth"  # <output_dir>/<name>
    for name in ("tasks.jsonl", "sft.messages.jsonl", "icl_bank.jsonl", "preferences.jsonl"):
        assert (out / name).read_bytes() == (pipeline / name).read_bytes(), name
    assert len(_messages(out / "sft.messages.jsonl")) == 3
