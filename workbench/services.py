"""Typed services: what one pipeline offers the others without being imported by them.

A pipeline that offers a service names it in its spec (`provides=(("searcher",
"workbench.rag.api:Searcher"),)`); a pipeline that uses one declares it (`requires=
("searcher",)`) and calls the accessor here (`services.searcher()`), which returns the
provider typed by its Protocol below. The signature of every provider is checked against its
Protocol when it is resolved, and `check_required(pipeline)` resolves everything a pipeline
declares before the pipeline runs, so a wrong name or signature stops a run at its start, not
in round 3 of a federated run. `tests/test_registry.py` resolves every declared service and
checks that each package calls only the services its specs declare.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from workbench import registry
from workbench.errors import WorkbenchError

Log = Callable[[str], Any]


# --- retrieval (provided by rag)

class ContextProvider(Protocol):
    """One formatted context per question, from ranks `ranks[0]..ranks[1]` (1-based)."""

    top_k: int  # the ranks given when `ranks` is None (evaluation's hit-vs-miss reads it)

    def __call__(self, questions: Sequence[str],
                 ranks: tuple[int, int] | None = None) -> list[str]: ...


class Contexts(Protocol):
    """One context provider per retrieval condition (keyword, semantic, hybrid) of an index."""

    def __call__(self, index: Any, conditions: Sequence[str]) -> Mapping[str, ContextProvider]:
        ...


class SectionIndex(Protocol):
    """Index ready-made sections in `out` with the default retrieval settings."""

    def __call__(self, sections: Iterable[Any], out: str | Path, log: Log = print) -> Any: ...


class OpenIndex(Protocol):
    """A `Search` over a built index folder, opened once (its files checked, the embedder
    loaded for semantic or hybrid retrieval) and queried in batches; a missing or damaged
    folder raises when it is opened."""

    def __call__(self, index_dir: str | Path, retriever: str = "hybrid") -> Search: ...


class QueryIndex(Protocol):
    """The hits of one query against a built index folder."""

    def __call__(self, index_dir: str | Path, text: str, *, retriever: str = "hybrid",
                 k: int = 10, documents: tuple[str, ...] = (),
                 heading_prefix: tuple[str, ...] = (),
                 weights: dict[str, float] | None = None) -> list[Any]: ...


class Search(Protocol):
    """A batch of queries in, the top `k` hits of each out."""

    def __call__(self, queries: list[str], k: int = 5) -> list[list[Any]]: ...


class SearcherFactory(Protocol):
    """A `Search` over sections, indexed once in `folder` and reused while they are
    unchanged."""

    def __call__(self, sections: Iterable[Any], folder: str | Path, retriever: str = "hybrid",
                 log: Log = print) -> Search: ...


# --- distillation

class QtsaChat(Protocol):
    """A QTSA sample as a chat example (`style`: instruct or thinking)."""

    def __call__(self, s: Any, style: str = "instruct") -> Any: ...


SERVICES: dict[str, type] = {
    "contexts": Contexts, "section_index": SectionIndex, "query_index": QueryIndex,
    "open_index": OpenIndex,
    "searcher": SearcherFactory,
    "qtsa_chat": QtsaChat,
}


# --- checking

def _signature(obj: Any, drop_self: bool) -> inspect.Signature:
    sig = inspect.signature(obj)
    if drop_self:
        params = list(sig.parameters.values())[1:]
        sig = sig.replace(parameters=params)
    return sig


def signature_problems(want: inspect.Signature, have: inspect.Signature) -> list[str]:
    """Why `have` cannot be called as `want` is: a parameter `want` passes that `have` lacks
    (or takes another way), a default `want` relies on that `have` lacks, or a parameter `have`
    requires that `want` never passes."""
    problems = []
    hp = have.parameters
    var_kw = any(p.kind is p.VAR_KEYWORD for p in hp.values())
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in hp.values())
    positional = [p for p in hp.values() if p.kind in (p.POSITIONAL_ONLY,
                                                        p.POSITIONAL_OR_KEYWORD)]
    for i, p in enumerate(want.parameters.values()):
        q = hp.get(p.name)
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if i >= len(positional) and not var_pos:
                problems.append(f"takes no positional parameter {i + 1} ({p.name})")
                continue
            q = positional[i] if i < len(positional) else None
            if q is not None and q.name != p.name and p.kind is p.POSITIONAL_OR_KEYWORD:
                problems.append(f"parameter {i + 1} is {q.name!r}, not {p.name!r}")
        elif p.kind is p.KEYWORD_ONLY and q is None and not var_kw:
            problems.append(f"takes no keyword {p.name!r}")
        if q is not None and p.default is not p.empty and q.default is q.empty:
            problems.append(f"{p.name!r} has no default")
    wanted = set(want.parameters)
    for q in hp.values():
        if q.default is q.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD) \
                and q.name not in wanted:
            problems.append(f"requires {q.name!r}, which callers never pass")
    return problems


def check_provider(name: str, obj: Any) -> None:
    """Raise WorkbenchError when `obj` does not fit the Protocol of service `name`."""
    proto = SERVICES.get(name)
    if proto is None:
        raise WorkbenchError(f"service {name!r} has no Protocol in workbench.services (known: "
                             f"{', '.join(sorted(SERVICES))})")
    want = _signature(proto.__call__, drop_self=True)
    have = _signature(obj.__init__ if inspect.isclass(obj) else obj, inspect.isclass(obj))
    problems = signature_problems(want, have)
    if problems:
        ref = getattr(obj, "__qualname__", repr(obj))
        raise WorkbenchError(f"service {name!r}: {ref} does not fit {proto.__name__}: "
                             + "; ".join(problems))


def resolve(name: str) -> Any:
    """The provider of service `name`, checked against its Protocol."""
    obj = registry.provider(name)
    check_provider(name, obj)
    return obj


def check_required(pipeline: registry.Pipeline) -> None:
    """Resolve and check every service `pipeline` declares in `requires` (before it runs)."""
    for name in pipeline.requires:
        try:
            resolve(name)
        except WorkbenchError as e:
            raise WorkbenchError(f"pipeline {pipeline.name!r} requires service {name!r}: "
                                 f"{e}") from None


# --- typed accessors (the only way code reaches another pipeline's service)

def contexts() -> Contexts:
    return resolve("contexts")


def section_index() -> SectionIndex:
    return resolve("section_index")


def query_index() -> QueryIndex:
    return resolve("query_index")


def open_index() -> OpenIndex:
    return resolve("open_index")


def searcher() -> SearcherFactory:
    return resolve("searcher")


def qtsa_chat() -> QtsaChat:
    return resolve("qtsa_chat")
