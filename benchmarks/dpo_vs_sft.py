"""SFT alone vs SFT then DPO on the bundled SmolLM2-135M.

    python benchmarks/dpo_vs_sft.py [--data rf|litsearch] [--sft-steps 16] [--dpo-steps 16]
        [--pairs 96] [--held-out 64] [--max-length 512] [--agent]

1. Pairs. rf (default, minutes): a question made from a paragraph's first words, that
   paragraph (chosen) against another section's (rejected); SFT alone trains on the chosen
   sides. litsearch (~2k tokens a side, hours on 2 cores): the oracle teacher's dialogues on
   the pack's training intents (no model), gold SFT rows and chosen/rejected pairs per turn
   against controlled corruptions. Pairs are split by group (question / intent): a quarter
   of the groups are held out.
2. LoRA SFT of the bundled model on the gold rows; then DPO from that adapter on (a sample
   of) the training pairs; the SFT adapter is the reference policy.
3. Preference accuracy (chosen log-probability above rejected, whole side) on the held-out
   pairs for the base model, SFT and SFT+DPO, with Wilson intervals, and an exact McNemar
   test of SFT vs SFT+DPO on the same pairs.
4. With --agent: the litsearch agent condition (guided policy, 3 turns) on the dev intents
   with each adapter: nDCG@10 and execution errors, with a paired bootstrap of the nDCG
   difference.
Commands run in-process through the CLI's main(argv); the run folder is /tmp/wb-dpo-ls.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path("/tmp/wb-dpo-vs-sft")


def cli(*argv: str) -> None:
    from workbench.cli.main import main

    print("$ workbench " + " ".join(argv), flush=True)
    t0 = time.perf_counter()
    try:
        main(list(argv))
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)


def side_logps(model_spec: str, adapter: str | None, pairs) -> list[tuple[float, float]]:
    """(log p(chosen side), log p(rejected side)) per pair under the model (+ adapter)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.local import model_folder
    from workbench.models.resolve import resolve_chat_model
    from workbench.train.preference import pair_batches, sequence_logps, tokenize_pair

    folder = model_folder(resolve_chat_model(model_spec))
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if adapter:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    toks = [tokenize_pair(tok, p, i) for i, p in enumerate(pairs)]
    out = []
    with torch.no_grad():
        for b in pair_batches(toks, batch_size=4, pad_id=tok.pad_token_id or 0, seed=0,
                              epoch=0, shuffle=False):
            lp, _ = sequence_logps(model, b, "cpu")
            n = b.pairs
            out += [(float(lp[i]), float(lp[n + i])) for i in range(n)]
    return out


def mcnemar_exact(a: list[bool], b: list[bool]) -> dict:
    from math import comb

    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    n = only_a + only_b
    p = min(1.0, 2 * sum(comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n) \
        if n else 1.0
    return {"only_sft": only_a, "only_dpo": only_b, "p_value": p}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/dpo_vs_sft.json")
    ap.add_argument("--sft-steps", type=int, default=16)
    ap.add_argument("--dpo-steps", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=96, help="training pairs sampled for DPO")
    ap.add_argument("--held-out", type=int, default=64, help="held-out pairs scored")
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--agent", action="store_true", help="also run the agent condition "
                                                         "(litsearch)")
    ap.add_argument("--data", choices=("rf", "litsearch"), default="rf",
                    help="rf: short pairs from the RF corpus (minutes); litsearch: the "
                         "teacher's turn pairs (~2k tokens a side: hours on 2 cores)")
    ap.add_argument("--max-length", type=int, default=512)
    a = ap.parse_args()
    from workbench.evaluate.stats import wilson_interval
    from workbench.formats import read_preferences
    from workbench.progress import quiet_libraries
    from workbench.runs import RunLayout

    quiet_libraries()
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    t_all = time.perf_counter()
    base = ["-s", f"output_dir={ROOT}"]
    rng = random.Random(0)
    if a.data == "litsearch":
        # 1. the teacher's data, no model
        cli("agent", "eval", "litsearch", "configs/litsearch_demo.yaml", *base, "-s",
            "name=teacher", "-s", "agent.conditions=[oracle]")
        files = RunLayout.at(ROOT / "teacher").outputs("agent")
        pairs = read_preferences(files.path("preferences"))
        groups = [p.metadata["intent"] for p in pairs]
        sft_rows = [json.loads(x) for x in files.path("litsearch_sft_data").read_text().splitlines()]
    else:  # rf: a question; its own paragraph against another section's
        import sys

        sys.path.insert(0, str(Path(__file__).parent))
        from dpo_throughput import make_pairs

        make_pairs(ROOT / "rf_pairs.jsonl", n=160)
        pairs = read_preferences(ROOT / "rf_pairs.jsonl")
        groups = [p.prompt[0].content for p in pairs]
        sft_rows = None
    intents = sorted(set(groups))
    rng.shuffle(intents)
    held = set(intents[:max(1, len(intents) // 4)])
    train_pairs = [p for p, g in zip(pairs, groups, strict=True) if g not in held]
    test_pairs = [p for p, g in zip(pairs, groups, strict=True) if g in held]
    rng.shuffle(train_pairs)
    rng.shuffle(test_pairs)
    train_pairs, test_pairs = train_pairs[:a.pairs], test_pairs[:a.held_out]
    pf = ROOT / "train_pairs.jsonl"
    pf.write_text("".join(json.dumps(p.to_json()) + "\n" for p in train_pairs))
    # SFT alone: the teacher's rows of the training intents, or the chosen sides
    if sft_rows is None:
        sft_rows = [p.example("chosen").to_json() for p in train_pairs]
    else:
        sft_rows = [r for r in sft_rows if r["id"] not in held]
    sf = ROOT / "sft_train.jsonl"
    sf.write_text("".join(json.dumps(r) + "\n" for r in sft_rows))
    # 2. SFT, then DPO from it
    common = [*base, "-s", "models.chat.spec=default", "-s",
              f"train.max_length={a.max_length}",
              "-s", "train.batch_size=2", "-s", "train.lora.r=8", "-s", "train.lora.alpha=16",
              "-s", "train.eval_fraction=0"]
    t0 = time.perf_counter()
    cli("train", "run", *common, "-s", "name=sft", "-s", f"train.data={sf}",
        "-s", f"train.max_steps={a.sft_steps}", "-s", "train.learning_rate=3e-4")
    sft_s = time.perf_counter() - t0
    sft = str(ROOT / "sft" / "adapter")
    t0 = time.perf_counter()
    cli("train", "run", *common, "-s", "name=dpo", "-s", "train.method=dpo",
        "-s", f"train.data={pf}", "-s", f"train.init_adapter={sft}",
        "-s", f"train.max_steps={a.dpo_steps}", "-s", f"train.learning_rate={a.lr}",
        "-s", f"train.dpo.beta={a.beta}")
    dpo_s = time.perf_counter() - t0
    dpo = str(ROOT / "dpo" / "adapter")
    metrics = [json.loads(x) for x in (Path(dpo) / "metrics.jsonl").read_text().splitlines()]
    # 3. preference accuracy on held-out pairs
    res: dict = {"data": a.data, "pairs_total": len(pairs), "groups": len(intents),
                 "held_out_groups": len(held), "train_pairs": len(train_pairs), "held_out_pairs":
                 len(test_pairs), "sft_rows": len(sft_rows), "sft_steps": a.sft_steps,
                 "dpo_steps": a.dpo_steps, "beta": a.beta, "dpo_lr": a.lr,
                 "sft_seconds": round(sft_s), "dpo_seconds": round(dpo_s),
                 "dpo_train_curve": [{k: r.get(k) for k in ("step", "loss", "reward_accuracy",
                                                            "reward_margin")}
                                     for r in metrics]}
    wins = {}
    for name, adapter in (("base", None), ("sft", sft), ("sft_dpo", dpo)):
        lps = side_logps("default", adapter, test_pairs)
        w = [c > r for c, r in lps]
        wins[name] = w
        lo, hi = wilson_interval(sum(w), len(w))
        res[f"preference_accuracy_{name}"] = {"accuracy": sum(w) / len(w), "ci95": [lo, hi],
                                              "n": len(w)}
        by_kind = defaultdict(list)
        for p, x in zip(test_pairs, w, strict=True):
            by_kind[p.kind].append(x)
        res[f"preference_accuracy_{name}"]["by_kind"] = {
            k: f"{sum(v)}/{len(v)}" for k, v in sorted(by_kind.items())}
        print(name, json.dumps(res[f"preference_accuracy_{name}"]), flush=True)
    res["sft_vs_sft_dpo_mcnemar"] = mcnemar_exact(wins["sft"], wins["sft_dpo"])
    # 4. the agent with each adapter
    if a.agent and a.data == "litsearch":
        import numpy as np

        from workbench.evaluate.stats import bootstrap_interval

        per = {}
        for name, adapter in (("sft", sft), ("sft_dpo", dpo)):
            cli("agent", "eval", "litsearch", "configs/litsearch_demo.yaml", *base,
                "-s", f"name=agent_{name}", "-s", "agent.conditions=[agent]",
                "-s", f"models.chat.options.adapter={adapter}")
            rows = [json.loads(x) for x in (ROOT / f"agent_{name}" / "agent" /
                                            "litsearch_agent.jsonl").read_text().splitlines()]
            per[name] = [r["turns"][-1]["ndcg10"] for r in rows]
            turns = [t for r in rows for t in r["turns"]]
            errs = sum(t["error"] is not None for t in turns)
            res[f"agent_{name}"] = {
                "ndcg10_final": float(np.mean(per[name])),
                "ndcg10_ci95": list(bootstrap_interval(per[name], n_resamples=2000)),
                "execution_errors": f"{errs}/{len(turns)}",
                "execution_error_ci95": list(wilson_interval(errs, len(turns)))}
        d = [y - x for x, y in zip(per["sft"], per["sft_dpo"], strict=True)]
        res["agent_ndcg10_difference"] = {"mean": float(np.mean(d)), "ci95": list(
            bootstrap_interval(d, n_resamples=2000)), "n": len(d)}
    res["seconds_total"] = round(time.perf_counter() - t_all)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))
    print(json.dumps({k: v for k, v in res.items() if k != "dpo_train_curve"}, indent=1))


if __name__ == "__main__":
    main()
