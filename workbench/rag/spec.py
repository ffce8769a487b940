"""The retrieval pipeline as the registry sees it."""

from workbench.registry import Artifact, Pipeline, Stage

PIPELINE = Pipeline(
    name="rag",
    help="Retrieval: keyword (BM25), semantic (FAISS) and hybrid indexes over the corpus; "
         "query them, evaluate them against qrels.",
    config="workbench.retrieval.index:RagConfig",
    run="workbench.rag.api:run",
    folder="index",
    stages=(Stage("index", help="chunk the corpus, build BM25 and FAISS, write the manifest",
                  outputs=(Artifact("manifest", "manifest.json"),
                           Artifact("chunks", "chunks.jsonl", "Chunk"))),),
    cli="workbench.rag.cli:register",
    page="retrieval.py", page_title="Retrieval playground", page_icon=":material/search:",
    order=30,
)
