"""GGUF export of an adapter: file size, time and whether the file, loaded back through the
workbench's GGUF path, answers as the merged model does, for each weight type.

    python benchmarks/gguf_export.py ADAPTER [--types f16 f32 q8_0] [--out FILE.json]

ADAPTER is an adapter folder trained on a GGUF base (the main job's `runs/rf_demo/adapter`).
Each type is one `workbench.train.gguf_export.export_gguf` call with its check (greedy answers
to the four check prompts, 32 tokens each, compared word for word with the merged model's):
the time includes the merge, the write, and the check's two model loads and generations.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("adapter", type=Path)
    ap.add_argument("--types", nargs="+", default=["f16", "f32", "q8_0"])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "gguf.json")
    args = ap.parse_args(argv)
    from workbench.progress import quiet_libraries
    from workbench.train.gguf_export import export_gguf

    quiet_libraries()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for t in args.types:
            t0 = time.perf_counter()
            rep = export_gguf(args.adapter, Path(tmp) / f"model-{t}.gguf", out_type=t,
                              log=lambda m: print(m, file=sys.stderr))
            rows.append({"type": t, "seconds": round(time.perf_counter() - t0, 1),
                         "megabytes": round(rep["bytes"] / 1e6, 1),
                         "same_answers": rep["check"]["same_answers"],
                         "prompts": rep["check"]["prompts"],
                         "top1_agree": rep["check"]["top1_agree"],
                         "top1_tokens": rep["check"]["top1_tokens"],
                         "answers": rep["check"]["answers"]})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "answers"}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"adapter": str(args.adapter), "machine": platform.node(),
                                    "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
