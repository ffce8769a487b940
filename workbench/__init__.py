"""Domain-Agent Workbench: turn a domain's knowledge into better small agents.

Importing this package is cheap: no torch, transformers or network at import time. It sets
one environment variable, GOMP_SPINCOUNT=1000, unless the environment chose a policy:
OpenMP threads (llama.cpp's, torch's) that spin-wait long collapse generation when another
process uses the CPU, and ones that sleep at once halve it on an idle machine
(`workbench.openmp`).
"""

from workbench.openmp import quiet_waits as _quiet_waits

__version__ = "0.1.0"
_quiet_waits()
