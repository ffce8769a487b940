"""Domain-Agent Workbench: turn a domain's knowledge into better small agents.

Importing this package is cheap: no torch, transformers or network at import time. It sets
one environment variable, OMP_WAIT_POLICY=passive, unless the environment chose a policy:
OpenMP threads (llama.cpp's, torch's) that spin-wait collapse generation when another
process uses the CPU (`workbench.openmp`).
"""

from workbench.openmp import quiet_waits as _quiet_waits

__version__ = "0.1.0"
_quiet_waits()
