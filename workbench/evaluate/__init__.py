"""Evaluation core: metrics as plain functions, benchmark runners, reports.

- `benchmark`: multiple-choice benchmarks as they come (MCItem, MMLU/ARC JSONL, CSV)
- `mc`: scoring in OLMES's letter and cloze formulations, and generation
- `contexts`: the `ContextProvider` protocol RAG conditions are scored through
- `stats`: Wilson and bootstrap intervals, exact McNemar, paired bootstrap, Holm
- `summary`: the typed summary (summary.json), headline rule, paired comparisons
- `report`: the evaluation folder written and read back, markdown and plots
- `run`: conditions, open answers, and `run_eval` for `workbench eval`
- `metrics`: ranking and classification metrics as plain functions
"""
