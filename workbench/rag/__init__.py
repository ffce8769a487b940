"""The retrieval pipeline: the run's index over the corpus, its CLI (build, query, evaluate
against qrels) and the retrieval metrics; the retrievers are the library `workbench.retrieval`."""
