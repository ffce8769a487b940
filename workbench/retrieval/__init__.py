"""Retrieval as a library below the pipelines: chunking, keyword (BM25), semantic (FAISS) and
hybrid retrievers, the index folder (`index`), search over it and retrieval contexts
(`search`, `context`). The rag pipeline (`workbench.rag`) builds the run's index with it;
evaluation, the agent packs, trajectory synthesis, chat, the loop and compare import it."""
