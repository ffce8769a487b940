"""Federated track B in one package: knowledge units evolved across data-agent sites
(FedAgentKE), without raw data leaving them.

- `units`: the protocol. Unit records, the operations' wire form, the privacy filter, the A/B
  gate, the knowledge base and how a round's operations fold into it (votes, `k_min`).
- `site`: one data-agent site. Its environment and task pool (`workbench.datatasks`), its
  scaffold, the workflows it abstracts from verified plans and the operations it proposes.
- `agent`: the prompted agent a site can run instead of the grammar search (`agent: prompted`).
- `workflows`: what a workflow is (a verified plan's transferable steps, in words) and a
  task's `Outcome`, shared by the site's search and the prompted agent.
- `client`: the site's Flower handler (`query.knowledge`). `server`: the rounds on the
  server. `api`: the experiment (federated, local-only, no units). `report`: its report.

The LoRA track (track A) is the rest of `workbench.federated`; both share its guarded round
loop (`guards.run_rounds`, whose `Track` each server is), site-name checks, run layout
(`results`), wire audit (`wire`) and deployment. This package sits below the Flower apps and
`serving`, which dispatch to both tracks: its experiment is handed the ClientApp it runs in
process.
"""
