"""`import workbench` bounds how long OpenMP's waiting threads spin (`workbench.openmp`):
libgomp, loaded afterwards by llama.cpp's engine, reads GOMP_SPINCOUNT=1000 and spins 1,000
times; a policy the environment chose is kept; a libgomp loaded before the workbench is
reported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# what libgomp itself says it uses (OpenMP 5's omp_display_env), after `import workbench`
SHOW = ("import workbench, workbench.openmp as o, ctypes, sys\n"
        "{engine}\n"
        "print(o.state(), flush=True)\n"
        "ctypes.CDLL('libgomp.so.1').omp_display_env(1)\n")


def _run(code: str, **env: str) -> tuple[str, str]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=environ | env, timeout=120, check=True)
    spin = [line.split("=", 1)[1].strip(" '") for line in r.stderr.splitlines()
            if line.strip().startswith("GOMP_SPINCOUNT")]
    return r.stdout.strip(), spin[0] if spin else ""


def test_the_engines_openmp_threads_spin_briefly_when_they_wait():
    pytest.importorskip("xllamacpp")
    state, spin = _run(SHOW.format(engine="import xllamacpp"))
    assert (state, spin) == ("spin1000", "1000")


def test_a_policy_the_environment_chose_is_kept():
    state, spin = _run(SHOW.format(engine=""), GOMP_SPINCOUNT="12345")
    assert (state, spin) == ("environment: GOMP_SPINCOUNT=12345", "12345")
    state, _ = _run(SHOW.format(engine=""), OMP_WAIT_POLICY="active")
    assert state == "environment: OMP_WAIT_POLICY=active"


def test_a_libgomp_loaded_before_the_workbench_is_late():
    # loaded first (as torch would), it keeps libgomp's spinning default in this process
    code = "import ctypes; ctypes.CDLL('libgomp.so.1')\n" + SHOW.format(engine="")
    state, spin = _run(code)
    assert state == "late" and spin not in ("", "0", "1000")
