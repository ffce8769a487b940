"""One agent loop for every pack: typed steps, JSON-schema tools, scaffolds as strategies,
budgets, model mistakes recorded as steps, trajectories exported as SFT data.

- `tools`: `Tool` (a JSON schema and a function), `Toolbox` (validates and runs calls);
- `loop`: `AgentTask`, `Budget`, `ErrorPolicy`, scaffolds (`ReAct`, `PlanExecute`),
  policies (`FreePolicy`: the model writes its calls; `GuidedPolicy`: the model's
  log-likelihood picks among calls the pack proposes), `run_agents` (all tasks in lockstep,
  one batched model call per turn);
- `records`: `AgentStep`, `AgentTrajectory`;
- `export`: trajectories -> `ChatExample` (tool observations are not trained on).
"""
