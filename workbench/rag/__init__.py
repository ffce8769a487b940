"""Retrieval: keyword (BM25), semantic (FAISS) and hybrid retrievers over sectioned corpora."""
