"""The RF pack's tools+grpo condition (issue 44) end to end on the tiny random-init model:
`workbench agent eval rf` with the condition trains the adapter as its own stage on the
training items' rollouts, keeps the best by dev reward, scores every condition on the same
test items only, and reports the training beside the paired test against the prompted tools
agent; a re-run finds everything up to date."""

import json

import pytest

from conftest import REPO, cli_in_process

CONFIG = """name: rfg
seed: 0
output_dir: {out}
corpus: {corpus}
models:
  chat: {{spec: {model}}}
agent:
  pack: rf
  data: {data}
  policy: guided
  dev_limit: 10
  conditions: [tools, tools+grpo]
  grpo:
    test_share: 0.4
    dev_share: 0.2
    max_steps: 2
    batch_size: 2
    settings: {{group_size: 2, tasks_per_step: 1, temperature: 1.0, eval_every: 1}}
"""


def test_tools_grpo_trains_keeps_the_best_and_scores_the_test_items(tmp_path, tiny_model):
    conf = tmp_path / "rfg.yaml"
    conf.write_text(CONFIG.format(out=tmp_path / "runs", corpus=REPO / "datasets" / "rf",
                                  model=tiny_model, data=REPO / "datasets" / "rf_design"))
    res = cli_in_process("agent", "eval", "rf", str(conf), env={"TQDM_DISABLE": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    agent = tmp_path / "runs" / "rfg" / "agent"
    report = json.loads((agent / "rf_report.json").read_text())
    # 10 items: 4 test (every condition), 2 dev (choose the adapter), 4 trained on
    assert report["items"] == 4 and set(report["conditions"]) == {"tools", "tools+grpo"}
    assert all(c["n"] == 4 for c in report["conditions"].values())
    tools = [json.loads(x)["id"] for x in (agent / "rf_tools.jsonl").read_text().splitlines()]
    tuned = [json.loads(x)["id"] for x in (agent / "rf_tools+grpo.jsonl").read_text()
             .splitlines()]
    assert tools == tuned  # the paired test's items
    training = report["training"]["tools+grpo"]
    assert (training["train_items"], training["dev_items"], training["test_items"]) == (4, 2, 4)
    assert training["steps"] == 2 and training["adapter_step"] in (0, 1, 2)
    assert "tools+grpo vs tools" in report["paired"]
    rolled = "".join(f.read_text() for f in (agent / "rf_grpo.rollouts").iterdir())
    assert rolled and not [i for i in tools if f'"{i}"' in rolled]  # test items: never
    manifest = json.loads((agent / "rf_grpo" / "manifest.json").read_text())
    assert manifest["outputs"]["eval_examples"] == 2
    md = (agent / "rf_report.md").read_text()
    assert "tools+grpo: trained 2 steps on the rollouts of 4 items" in md
    again = cli_in_process("agent", "eval", "rf", str(conf), env={"TQDM_DISABLE": "1"})
    assert again.returncode == 0 and "rf_grpo: up to date" in again.stderr


def test_a_split_with_nothing_to_train_on_is_one_clear_error():
    from workbench.agent_packs.rf.api import load_items
    from workbench.agent_packs.rf.grpo import split_items
    from workbench.errors import ConfigError

    items = load_items(REPO / "datasets" / "rf_design")[:4]
    with pytest.raises(ConfigError, match="4 design items leave 1 to train"):
        split_items(items, 0.5, 0.25, seed=0)
    s = split_items(load_items(REPO / "datasets" / "rf_design"), 0.4, 0.2, seed=3)
    assert (len(s.test), len(s.dev), len(s.train)) == (16, 8, 16)
    assert not {i.id for i in s.test} & {i.id for i in s.train + s.dev}
