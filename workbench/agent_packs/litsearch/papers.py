"""The literature-search corpus's records: a paper (with its headings and in-corpus
references) and an intent (an anchor paper, the visible query, the hidden graded
relevance). A leaf that `pack` and `library` share."""

from __future__ import annotations

from pydantic import Field, StrictStr

from workbench.records import Record, StrictModel


class Paper(StrictModel):
    pmid: StrictStr
    title: StrictStr
    abstract: StrictStr = ""
    year: int | None = None
    journal: StrictStr = ""
    mesh: list[StrictStr] = Field(default_factory=list)
    major: list[StrictStr] = Field(default_factory=list)
    refs: list[StrictStr] = Field(default_factory=list)


class Intent(Record):
    """An anchor paper, the visible query, and the hidden graded relevance."""

    id: StrictStr
    anchor: StrictStr
    query: StrictStr
    intent: list[StrictStr] = Field(default_factory=list)
    relevance: dict[str, int]
    part: str = "dev"
