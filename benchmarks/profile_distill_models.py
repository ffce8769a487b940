"""Where a distillation's seconds go, per model method, on one generation engine (issue 42).

    python benchmarks/profile_distill_models.py llamacpp [--config configs/rf_demo.yaml]

Runs `distill` on the config (call cache off, a temporary output folder) with the model
classes' `generate`, `score` and constructors timed, and prints seconds, calls and rows per
method beside the wall time: what is generation, what is the verifier's log-likelihood (on
transformers for every engine) and what is loading.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import threading
import time

SECONDS: dict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()
ROWS: collections.Counter = collections.Counter()
_LOCK = threading.Lock()


def timed(cls, name: str) -> None:
    f = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return f(self, *args, **kwargs)
        finally:
            key = f"{cls.__name__}.{name}"
            with _LOCK:
                SECONDS[key] += time.perf_counter() - t0
                CALLS[key] += 1
                if args and isinstance(args[0], list | tuple):
                    ROWS[key] += len(args[0])

    setattr(cls, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("backend", help="transformers, llamacpp, ctranslate2")
    ap.add_argument("--config", default="configs/rf_demo.yaml")
    a = ap.parse_args()
    from workbench.config import load_config
    from workbench.distill.api import distill_from_config
    from workbench.models.llamacpp import LlamaCppChatModel
    from workbench.models.local import LocalChatModel
    from workbench.progress import quiet_libraries

    quiet_libraries()
    for cls in (LlamaCppChatModel, LocalChatModel):
        for name in ("__init__", "generate", "score"):
            timed(cls, name)
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(a.config, [f"output_dir={out}", f"models.chat.backend={a.backend}",
                                     "cache.enabled=false"])
        t0 = time.perf_counter()
        distill_from_config(cfg, progress=lambda m: None)
        wall = time.perf_counter() - t0
    print(json.dumps({"backend": a.backend, "wall_s": round(wall, 1),
                      "seconds": {k: round(v, 1) for k, v in SECONDS.items()},
                      "calls": CALLS, "rows": ROWS}, indent=1))


if __name__ == "__main__":
    main()
