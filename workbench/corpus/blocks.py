"""A document as blocks: headings that the format itself marks (HTML heading tags, Word heading
styles and outline levels, EPUB navigation, a PDF's outline) and body text between them.

Headings are never guessed from the text: a body line that starts with `#` (a code comment, a
shell prompt) stays body text. Markdown files are the one format whose headings are `#` lines
(`formats.split_marked`, which skips code fences); every other reader builds `Block`s and
`split_blocks` turns them into sections with heading paths.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import ClassVar

from workbench.corpus.formats import Part, markdown_table

Block = tuple[int, str]  # (heading level 1-6, title) or (0, body text)


def split_blocks(blocks: list[Block], title: str, meta: dict | None = None) -> list[Part]:
    """Sections from blocks: each heading starts one, its path the open headings above it;
    text before the first heading is titled by the document."""
    path: list[tuple[int, str]] = []
    out: list[Part] = []
    buf: list[str] = []

    def flush():
        body = "\n".join(buf).strip()
        body = re.sub(r"\n{3,}", "\n\n", body)
        if body:
            out.append(([h for _, h in path] or [title], body, meta))
        buf.clear()

    for level, text in blocks:
        if level:
            flush()
            path = [(lv, h) for lv, h in path if lv < level] + [(level, text)]
        else:
            buf.append(text)
    flush()
    return out


def blocks_to_markdown(blocks: list[Block]) -> str:
    """Markdown of the blocks; a body line that starts with `#` is escaped (`\\#`) so that it
    cannot read as a heading."""
    lines = []
    for level, text in blocks:
        if level:
            lines.append("#" * level + " " + text)
        else:
            lines.append(re.sub(r"(?m)^(\s*)#", r"\1\\#", text))
    return "\n".join(lines)


class HTMLBlocks(HTMLParser):
    """HTML (or XHTML) into blocks: h1-h6 are headings; `pre` keeps its lines in a code
    fence; tables become markdown tables; list items `- ` lines; scripts, styles and
    navigation menus dropped; a heading's permalink sign (¶) dropped."""

    BLOCK: ClassVar[set[str]] = {
        "p", "div", "li", "br", "section", "article", "blockquote", "dd", "dt", "ul", "ol",
        "table", "figure", "figcaption", "header", "footer", "aside", "main", "hr", "dl",
        "address", "caption"}
    # a page's navigation menu (a manual's sidebar) is not its text
    SKIP: ClassVar[set[str]] = {"script", "style", "noscript", "head", "template", "svg", "math",
                                "nav"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.blocks: list[Block] = []
        self.cur: list[str] = []
        self.skip = 0
        self.skip_tags: list[list] = []  # open skipped elements [tag, same tags inside]
        self.heading: int | None = None
        self.head_text: list[str] = []
        self.pre = 0
        self.pre_text: list[str] = []
        self.tables: list[dict] = []  # open tables: {"rows": [[cell]], "cell": [str] | None}

    # -- helpers
    def _text(self, parts: list[str]) -> str:
        return " ".join("".join(parts).split())

    def _end_line(self, blank: bool = False):
        text = self._text(self.cur)
        self.cur = []
        if text:
            self.blocks.append((0, text))
        if blank:
            self.blocks.append((0, ""))

    def _end_cell(self):
        t = self.tables[-1]
        if t["cell"] is not None:
            if t["rows"] is not None and t["rows"]:
                t["rows"][-1].append(self._text(t["cell"]))
            t["cell"] = None

    # -- parser callbacks
    def _skipped(self, tag: str, attrs) -> bool:
        """Whether the element is not text: a script, a style, a navigation menu (`nav`, or
        `role="navigation"` as Sphinx writes its sidebars), a heading's permalink."""
        if tag in self.SKIP:
            return True
        a = dict(attrs)
        if (a.get("role") or "") in ("navigation", "search"):
            return True
        return tag == "a" and self.heading is not None and bool(re.search(
            r"\b(headerlink|anchor|permalink)\b", a.get("class") or ""))

    def handle_starttag(self, tag, attrs):
        if self.skip and tag == self.skip_tags[-1][0]:
            self.skip_tags[-1][1] += 1  # the same element nested inside a skipped one
            return
        if self._skipped(tag, attrs):
            self.skip_tags.append([tag, 0])
            self.skip = len(self.skip_tags)
            return
        if self.skip:
            return
        if self.pre:
            if tag == "br":
                self.pre_text.append("\n")
            elif tag == "pre":
                self.pre += 1
            return
        if self.tables and self.tables[-1]["cell"] is not None and tag != "table":
            if tag in ("td", "th", "tr"):
                self._end_cell()
            else:
                if tag in ("br", "p", "div", "li"):
                    self.tables[-1]["cell"].append(" ")
                return
        if re.fullmatch(r"h[1-6]", tag) and not self.tables:
            self._end_line()
            self.heading = int(tag[1])
            self.head_text = []
        elif tag == "pre" and self.heading is None:
            self._end_line()
            self.pre = 1
            self.pre_text = []
        elif tag == "table":
            self._end_line()
            if len(self.tables) < 8:
                self.tables.append({"rows": [], "cell": None})
        elif self.tables and tag == "tr":
            self._end_cell()
            self.tables[-1]["rows"].append([])
        elif self.tables and tag in ("td", "th"):
            self._end_cell()
            if not self.tables[-1]["rows"]:
                self.tables[-1]["rows"].append([])
            self.tables[-1]["cell"] = []
        elif self.heading is None and tag in self.BLOCK:
            self._end_line()
            if tag == "li":
                self.cur.append("- ")

    def handle_endtag(self, tag):
        if self.skip and tag == self.skip_tags[-1][0] and self.skip_tags[-1][1]:
            self.skip_tags[-1][1] -= 1
            return
        if any(t == tag for t, _ in self.skip_tags):  # it, and any left open inside it
            while self.skip_tags and self.skip_tags.pop()[0] != tag:
                pass
            self.skip = len(self.skip_tags)
            return
        if self.skip:
            return
        if self.pre:
            if tag == "pre":
                self.pre -= 1
                if not self.pre:
                    code = "".join(self.pre_text).strip("\n")
                    if code.strip():
                        self.blocks.append((0, "```\n" + code + "\n```"))
            return
        if tag == "table" and self.tables:
            self._end_cell()
            t = self.tables.pop()
            md = markdown_table(t["rows"], spaced=True)
            if self.tables and self.tables[-1]["cell"] is not None:
                self.tables[-1]["cell"].append(" " + " ".join(" ".join(r) for r in t["rows"]))
            elif md:
                self.blocks.append((0, md))
                self.blocks.append((0, ""))
            return
        if self.tables and tag in ("td", "th"):
            self._end_cell()
            return
        if self.heading is not None and re.fullmatch(r"h[1-6]", tag):
            # a permalink sign after the title (Sphinx's ¶, MkDocs' #) is not part of it
            text = re.sub(r"(\s*[¶§]|\s+#)+$", "", self._text(self.head_text))
            if text:
                self.blocks.append((self.heading, text))
            self.heading = None
        elif self.heading is None and tag in self.BLOCK:
            self._end_line(blank=tag == "p")

    def handle_data(self, data):
        if self.skip:
            return
        if self.pre:
            self.pre_text.append(data)
        elif self.heading is not None:
            self.head_text.append(data)
        elif self.tables and self.tables[-1]["cell"] is not None:
            self.tables[-1]["cell"].append(data)
        else:
            self.cur.append(data)

    def result(self) -> list[Block]:
        self.close()
        if self.pre:  # an unclosed pre: its text still counts
            self.blocks.append((0, "".join(self.pre_text)))
        while self.tables:
            self._end_cell()
            md = markdown_table(self.tables.pop()["rows"], spaced=True)
            if md:
                self.blocks.append((0, md))
        if self.heading is not None:
            self.cur = self.head_text + self.cur
            self.heading = None
        self._end_line()
        return self.blocks


def html_blocks(html: str) -> list[Block]:
    parser = HTMLBlocks()
    parser.feed(html)
    return parser.result()
