"""Domain-Agent Workbench: turn a domain's knowledge into better small agents.

Importing this package is cheap: no torch, transformers or network at import time.
"""

__version__ = "0.1.0"
