"""OpenMP threads that spin only briefly when they wait, set when the workbench is imported
(issue 42).

llama.cpp (the xllamacpp wheel's ggml is built with OpenMP) and torch both run their CPU
threads as an OpenMP team, and at each of the hundreds of barriers of a decoding step (one
per graph node in llama.cpp, one per parallel op in torch) a thread that arrives first
spin-waits for the others (libgomp spins 300,000 times before it sleeps). On a machine where
another process uses the CPU, the thread it waits for is often descheduled, and the spinning
thread burns its own slice waiting, barrier after barrier: measured on the shared 2-core
machine (BENCHMARKS.md, "llama.cpp under load"), a batch of 8 replies on llama.cpp made 3.6
tokens/s with one CPU hog beside it (1.4 with two) and on transformers 2.0, against 46 (29)
and 23 when threads slept at once (OMP_WAIT_POLICY=passive, the setting here until
2026-12-07). Sleeping at once costs on an idle machine, though: each barrier is then a
futex wake-up, and llama.cpp's single stream fell from 61.5 to 27 tokens/s. A thousand spins
(GOMP_SPINCOUNT=1000, microseconds) cover a barrier whose threads all run and give up soon
on one whose thread was put off the CPU: idle 68-74 tokens/s single stream and 105-114 for
8 at once (passive 28-30 and 62-67), with one CPU hog 22 and 45 (passive 28 and 52), with
two 32 and 46 (passive 21 and 44), torch's scoring 0.91x passive's time (BENCHMARKS.md,
"How OpenMP's threads wait").

libgomp reads its wait policy once, when it is loaded, so `import workbench` sets
`GOMP_SPINCOUNT=1000` before any engine is imported, unless the environment already says
(`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT`: that choice is kept). Child processes inherit it, and
the libgomp copies that ctranslate2, faiss and scikit-learn bundle read it too. When
libgomp was loaded before the workbench (torch imported first), the setting comes too late
for this process: `state()` says so, and the llama.cpp backend warns once.
"""

from __future__ import annotations

import os

VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SPINS = "1000"  # spins before a waiting OpenMP thread sleeps (libgomp's default: 300,000)
_STATE = "unset"


def _shared_libgomp_loaded() -> bool:
    """Whether this process has loaded libgomp under its shared name (libgomp.so.1: the
    system's, or torch's copy of it), the one llama.cpp's OpenMP team would use; the copies
    that wheels bundle under hashed names (libgomp-1a2b3c4d.so.1) are separate instances."""
    try:
        with open("/proc/self/maps") as f:
            return any(os.path.basename(line.rstrip()).startswith("libgomp.so") for line in f)
    except OSError:
        return False


def quiet_waits() -> str:
    """Set GOMP_SPINCOUNT=1000 unless the environment chose a policy; returns (and
    remembers) the state: "spin1000" (set here, before libgomp was loaded), "environment"
    (the environment's own choice, kept), or "late" (set here, but libgomp was loaded
    already: its threads in this process keep spinning; child processes get the setting)."""
    global _STATE
    if any(v in os.environ for v in VARIABLES):
        _STATE = "environment"
    else:
        os.environ["GOMP_SPINCOUNT"] = SPINS
        _STATE = "late" if _shared_libgomp_loaded() else f"spin{SPINS}"
    return _STATE


def state() -> str:
    """How OpenMP's threads wait in this process (see `quiet_waits`), e.g. for a manifest."""
    if _STATE == "environment":
        return "environment: " + ", ".join(f"{v}={os.environ[v]}" for v in VARIABLES
                                           if v in os.environ)
    return _STATE
