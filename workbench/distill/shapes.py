"""The shapes of the agents' outputs, as constraints for constrained decoding.

With `distill.constrained`, every call whose output has a fixed shape is generated under a
grammar of that shape, so a writer can no longer lose a sample to its format: single mode's
MC block (`Question:`, four options, `Correct:`), its open question, the answerer's
`<think>` / `<answer>` tags, the post-processor's JSON and composed mode's one question or
one sentence. The grammar fixes only the frame; what goes in it is still checked by
`workbench.distill.parse` (self-contained, grounded, distinct options...), and the report
counts format and content rejections apart (`FORMAT_REASONS`).

A question is one line that starts with a capital letter and ends with its first "?"; free
text never holds "<" inside tags, so the model cannot open a second tag; lengths are bounded
as the parsers bound them, and by the call's `max_tokens` (at `CHARS_PER_TOKEN`), so that a
model writing at length is rarely cut before the frame is closed.
"""

from __future__ import annotations

import re

from workbench.models.constrain import Constraint

# why a sample was rejected for its format (the parsers' reasons); everything else the
# parsers and checks reject is about content
FORMAT_REASONS = frozenset({
    "empty_output", "no_question", "no_question_mark", "not_four_options",
    "duplicate_option_letter", "no_correct_letter", "unbalanced_tags", "think_tag_count",
    "answer_tag_count", "answer_before_thinking", "empty_thinking", "empty_solution",
    "empty_answer", "answer_not_letters", "answer_too_short", "answer_too_long",
    "rationale_too_short", "postprocess_no_json", "postprocess_bad_json",
    "postprocess_wrong_keys", "postprocess_empty_field", "question_too_short",
    "question_too_long", "question_not_text", "empty_option", "echoed_marker", "echo_only",
})

# characters a token holds at the least, on average, in the text these calls write: a field
# bounded at CHARS_PER_TOKEN x max_tokens is rarely cut by max_tokens
CHARS_PER_TOKEN = 3


def _q(chars: int) -> str:
    """A question of at most `chars` characters (and the parser's 600)."""
    return rf"[A-Z][^\n?<]{{11,{max(12, min(598, chars - 2))}}}\?"


def question(max_tokens: int, start: str | None = None) -> Constraint:
    """One question on one line, ending at its "?" (starting with `start` when given)."""
    chars = CHARS_PER_TOKEN * max_tokens
    if start:
        n = max(9, min(580, chars - len(start) - 2))
        return Constraint.regex(re.escape(start) + rf" [^\n?<]{{8,{n}}}\?")
    return Constraint.regex(_q(chars))


def written_question(max_tokens: int) -> Constraint:
    """Single mode's open question: `Question: <question>`."""
    return Constraint.regex("Question: " + _q(CHARS_PER_TOKEN * max_tokens - 10))


def mc_block(max_tokens: int) -> Constraint:
    """Single mode's MC item, in the prompt's format: the question takes up to 40% of the
    budget, each option up to 12%."""
    chars = CHARS_PER_TOKEN * max_tokens - 40  # the frame's own characters
    line = rf"[^\n<]{{1,{max(8, min(200, chars * 12 // 100))}}}"
    opts = "".join(rf"\n{x}\) {line}" for x in "ABCD")
    return Constraint.regex("Question: " + _q(chars * 40 // 100) + opts + r"\nCorrect: [ABCD]")


def sentence(max_tokens: int) -> Constraint:
    """A one-sentence answer on one line (composed mode's reference answer)."""
    n = max(7, min(398, CHARS_PER_TOKEN * max_tokens - 2))
    return Constraint.regex(rf"[A-Z][^\n<]{{6,{n}}}[.!]")


def answerer(max_tokens: int, multiple_choice: bool) -> Constraint:
    """RF-Agent's answerer: reasoning in <think>, a solution, the final answer in <answer>
    (option letters for an MC item); reasoning and solution share the budget."""
    part = max(21, min(2000, (CHARS_PER_TOKEN * max_tokens - 40) // 2))
    answer = r"[A-D](, [A-D]){0,3}" if multiple_choice else rf"[^\n<]{{1,{min(300, part)}}}"
    return Constraint.regex(rf"<think>[^<]{{20,{part}}}</think>\n[^<]{{10,{part}}}<answer>"
                            + answer + "</answer>")


def postprocess(max_tokens: int, multiple_choice: bool) -> Constraint:
    """The post-processor's strict JSON: the four QTSA fields, non-empty strings (option
    letters for an MC item's answer)."""
    keys = ["question", "thinking", "solution", "answer"]
    each = max(8, min(2000, (CHARS_PER_TOKEN * max_tokens - 60) // 4))
    props = {k: {"type": "string", "minLength": 1, "maxLength": each} for k in keys}
    if multiple_choice:
        props["answer"] = {"type": "string", "pattern": "^[A-D](, [A-D]){0,3}$"}
    return Constraint.json_schema({"type": "object", "additionalProperties": False,
                                   "required": keys, "properties": props})


def letter() -> Constraint:
    """The verifier's generated answer: one option letter."""
    return Constraint.choice(list("ABCD"))
