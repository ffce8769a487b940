"""What a loop measures with: its suites and domain pack, the model with an adapter, the
rubric judge, retrieval over the training sections, and the evaluation of an adapter on
every suite, cached under `evals/` per adapter and suite settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from workbench.io import read_jsonl, write_jsonl
from workbench.loop.pack import loop_pack
from workbench.loop.records import KeptAdapter
from workbench.loop.rubric import KeywordJudge, ModelJudge
from workbench.loop.suites import Suites, evaluate_suites, load_suites
from workbench.loop.synth import LoopPack
from workbench.loop.train import adapter_hash
from workbench.models.factory import open_chat_model
from workbench.records import EvalResult
from workbench.runs import Outputs, hash_inputs


class Evaluator:
    """The loop's suites and models for `cfg` (its `loop` section is `lc`), with the
    evaluation cache and the search index in the loop's folder (`files`)."""

    def __init__(self, cfg, files: Outputs, *, log: Callable[[str], None] = print):
        self.cfg, self.lc = cfg, cfg.loop
        self.files = files
        self.log = log
        self._suites: Suites | None = None
        self._pack: LoopPack | None = None
        self._searcher: Callable[[list[str], int], list] | None = None  # a rag Searcher
        self._judge = None

    @property
    def suites(self) -> Suites:
        if self._suites is None:
            self._suites = load_suites(self.lc.suites, seed=self.cfg.seed)
        return self._suites

    @property
    def pack(self) -> LoopPack:
        if self._pack is None:
            self._pack = loop_pack(self.lc.pack)
        return self._pack

    # ------------------------------------------------------------------ models
    def _model_config(self, adapter: KeptAdapter | Path | None):
        mc = self.cfg.models.chat
        path = adapter.path if isinstance(adapter, KeptAdapter) else adapter
        if path is None:
            return mc
        return mc.model_copy(update={"options": {**mc.options, "adapter": str(path),
                                                 "merge_adapter": True}})

    def open_model(self, adapter: KeptAdapter | Path | None):
        return open_chat_model(self._model_config(adapter), self.cfg)

    def judge(self):
        """The rubric judge: the same for every adapter (a model judge is `judge_model`, or
        the base model without any adapter), so a delta measures the answers only."""
        s = self.lc.suites
        if s.judge == "keyword":
            return KeywordJudge()
        if self._judge is None:
            self._judge = ModelJudge(open_chat_model(s.judge_model or self.cfg.models.chat,
                                                     self.cfg))
        return self._judge

    def search(self, queries: list[str], k: int):
        if self._searcher is None:
            # the test terms' sections are never searched: nothing is made from them
            from workbench.retrieval.search import Searcher

            # a keyword search: built in memory, nothing embedded or written
            self._searcher = Searcher(self.suites.training_sections(), None,
                                      retriever="keyword", log=self.log)
        return self._searcher(queries, k)

    # ------------------------------------------------------------------ evaluation (cached)
    def evaluation(self, adapter: KeptAdapter | Path | None, *, model=None,
                   name: str | None = None,
                   suites: tuple[str, ...] = ("dev", "open_dev", *("test", "retention",
                                                                    "open"))
                   ) -> list[EvalResult]:
        """The rows of `suites` for the base model plus `adapter`; each suite is computed once
        per adapter and suite settings (a candidate's dev rows only when a plan needs them)."""
        sha = (adapter.sha256 if isinstance(adapter, KeptAdapter)
               else adapter_hash(adapter) if adapter is not None else "base")
        s = self.lc.suites
        key = hash_inputs(sha, self.suites.digest, self.cfg.models.chat.model_dump(),
                          s.model_dump(mode="json"))[:12]
        folder = self.files.path("evals") / f"{sha[:12]}-{key}"
        rows: list[EvalResult] = []
        todo = [x for x in suites if not (folder / f"{x}.jsonl").exists()]
        if todo:
            who = "the base model" if sha == "base" else "adapter " + sha[:12]
            self.log(f"== evaluating {who} on {', '.join(todo)}")
            model = model or self.open_model(adapter)
            judge = self.judge() if {"open", "open_dev"} & set(todo) else None
            for suite in todo:
                got = evaluate_suites(model, self.suites, s, judge=judge, suites_run=(suite,),
                                      name=name or sha[:12], log=self.log)
                write_jsonl(folder / f"{suite}.jsonl", got)
        for suite in suites:
            rows += read_jsonl(folder / f"{suite}.jsonl", EvalResult.model_validate)
        return rows
