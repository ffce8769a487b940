"""Trajectory synthesis: verified data-agent trajectories by Monte Carlo tree search.

The recipe over two libraries: the sandboxed data runtime (`workbench.dataenv`) and the task
pool, grammar and search built on it (`workbench.datatasks`). Here: which tasks to spend the
search on (`select`, `costmodel`), the pipeline's run (`api`: tasks, explore), the exports
(`export`: SFT conversations, step-level preference pairs, the ICL bank) and the downstream
check on held-out tasks (`downstream`, `downstream_report`).
"""
