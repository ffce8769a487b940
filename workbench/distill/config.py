"""Distillation settings (the `distill:` section of an experiment config)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from workbench.config import ConfigSection
from workbench.distill.gates import GATES


class AgentModel(ConfigSection):
    spec: str = Field("default", description="Model spec (see README: bundled, folder, URL).")
    backend: str | None = None
    options: dict = Field(default_factory=dict, description="Backend options, e.g. "
                                                            "concurrency for HTTP servers.")


class AgentModels(ConfigSection):
    """One model per agent; unset agents use `models.chat`."""

    writer: AgentModel | None = None
    answerer: AgentModel | None = None
    verifier: AgentModel | None = None
    postprocess: AgentModel | None = None


class VerifierConfig(ConfigSection):
    enabled: bool = Field(True, description="Check each MC item by answering it with the text.")
    method: Literal["loglik", "generate"] = Field(
        "loglik", description="loglik: pick the most likely letter (robust for small models);"
                              " generate: parse a generated letter.")
    on_disagree: Literal["reject", "flag"] = "reject"


class DedupConfig(ConfigSection):
    method: Literal["minhash", "embedding"] = "minhash"
    threshold: float = Field(0.7, gt=0, le=1, description="Jaccard (minhash) or cosine "
                                                           "(embedding) at which two questions"
                                                           " are duplicates.")


class GatesConfig(ConfigSection):
    """Quality gates on every question before the verifier (`workbench.distill.gates`: each
    rule in one sentence, printed in the report with what each gate removed)."""

    enabled: bool = Field(True, description="Run the gates; false keeps every question the "
                                            "parsers accepted (the report says so).")
    echo_prefix: bool = Field(True, description="Strip echoed 'Q:' / 'Question:' prefixes; "
                                                "refuse questions that still hold a marker.")
    interrogative: bool = Field(True, description="Refuse statements with a question mark "
                                                  "and sentences cut off before it.")
    self_contained: bool = Field(True, description="Refuse questions that point at unseen "
                                                   "context ('this', 'these', 'the above').")
    named_entities: bool = Field(True, description="Refuse a question naming something "
                                                   "(a name, acronym, option, number) its "
                                                   "section never mentions.")
    broken_phrases: bool = Field(True, description="Refuse a word or phrase written twice "
                                                   "in a row, a word spelt letter by letter, "
                                                   "a content word used three times, a full "
                                                   "stop inside the question.")
    content_words: bool = Field(True, description="Refuse a question most of whose content "
                                                  "words are not in its section or answer.")
    foreign_words: bool = Field(True, description="Refuse a question using words its whole "
                                                  "document never uses.")
    min_content_share: float = Field(0.5, ge=0, le=1, description="content_words: the share "
                                                                   "of content words that "
                                                                   "must occur.")
    max_foreign_words: int = Field(0, ge=0, description="foreign_words: how many words absent "
                                                        "from the document are tolerated.")
    foreign_min_letters: int = Field(6, ge=1, description="foreign_words: only words this "
                                                          "long count (shorter ones are "
                                                          "mostly everyday English).")
    likelihood: bool = Field(True, description="Refuse a question the verifier's model "
                                               "finds unlikely after its text (garbled "
                                               "wording): one scoring pass per span, for the "
                                               "questions the rules kept.")
    min_likelihood: float = Field(-2.2, le=0, description="likelihood: the least mean token "
                                                          "log-probability of a question after "
                                                          "its text (tuned on the GNU Diffutils"
                                                          " manual with the bundled 135M "
                                                          "model; BENCHMARKS.md).")
    examples: int = Field(50, ge=0, description="Removed questions listed per gate in the "
                                                "report (every verdict is in gates.jsonl).")

    def active(self) -> list[str]:
        return [g for g in GATES if self.enabled and getattr(self, g)]


class DistillConfig(ConfigSection):
    corpus: str | None = Field(None, description="Corpus folder/file or Section JSONL "
                                                  "(default: the experiment's `corpus`).")
    domain: str | None = Field(None, description="Domain pack name (rf, generic) or a YAML "
                                                 "path (default: the experiment's `domain`).")
    perspectives: list[str] | None = Field(None, description="Perspective ids; all if unset.")
    kinds: list[Literal["mc", "nd"]] = Field(
        default_factory=lambda: list[Literal["mc", "nd"]](["mc", "nd"]))
    mode: Literal["composed", "single"] = Field(
        "composed", description="single: RF-Agent's writer + answerer calls (capable "
                                "teachers); composed: one easy step per call (small models).")
    answer_source: Literal["model", "text"] = Field(
        "model", description="composed mode: 'model' writes a question from the text and "
                             "answers it; 'text' takes a sentence of the text as the answer "
                             "and asks the model for its question (cheaper, correct by "
                             "construction; best for small teachers).")
    max_sections: int | None = Field(None, ge=1, description="Use only the first N sections.")
    min_section_chars: int = Field(200, ge=0, description="Shorter sections are skipped.")
    max_section_chars: int = Field(6000, ge=200, description="Longer sections are split or "
                                                             "skipped.")
    long_sections: Literal["split", "skip"] = "split"
    writer_temperature: float = Field(1.0, ge=0, description="RF-Agent samples questions at "
                                                             "~1.0.")
    answer_temperature: float = Field(0.0, ge=0)
    writer_max_tokens: int = Field(192, ge=8)
    answer_max_tokens: int = Field(384, ge=8)
    llm_postprocess: bool = Field(False, description="Single mode: an LLM rewrites the "
                                                     "answer as JSON before validation.")
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    gates: GatesConfig = Field(default_factory=GatesConfig)
    benchmark_fraction: float = Field(0.2, ge=0, lt=1, description="Share of sections whose "
                                                                    "MC items form the "
                                                                    "benchmark.")
    benchmark_size: int = Field(1000, ge=1, description="Cap on benchmark items (RF-Agent: "
                                                        "1000).")
    benchmark_per_fact: int = Field(
        0, ge=0, le=5, description="Composed mode with answers from the text: on held-out "
                                   "sections every answer-sized sentence is the answer of this "
                                   "many MC items, each asked from a different perspective (0: "
                                   "held-out sections get the same tasks as training ones, one "
                                   "sentence per perspective). More items for a benchmark whose "
                                   "intervals can tell conditions apart; they are MC whatever "
                                   "`kinds` says, and evaluation treats the items of one "
                                   "sentence as one cluster.")
    benchmark_rationales: bool = Field(
        True, description="Write rationales for held-out items too. They are scored, never "
                          "trained on: false saves a long model call per item and leaves "
                          "their `thinking` empty (their difficulty is then judged from the "
                          "question and solution alone).")
    distractors: Literal["siblings", "perturbed"] = Field(
        "siblings", description="Composed mode with answers from the text: where an MC item's "
                                "three wrong options come from. siblings: the answers of other "
                                "questions (true sentences of the same section, so an item can "
                                "be solved by matching words, without knowing the fact); "
                                "perturbed: the answer sentence with a number, an opposite or "
                                "a term changed (two changes, in a 2 x 2 design), checked "
                                "false against the section: only knowing the fact (or reading "
                                "it) tells the options apart.")
    seen_fraction: float = Field(
        0.0, ge=0, le=1, description="Composed mode with answers from the text: the share of "
                                     "training tasks whose sentence also gets a held-out MC "
                                     "item, asked from another perspective (RF-Agent's "
                                     "item-level protocol: the `seen` benchmark measures "
                                     "whether training taught the fact). The item is kept only "
                                     "if its training twin is, and never when its question is "
                                     "a near-duplicate of a training question.")
    benchmark_items: Literal["written", "statement"] = Field(
        "written", description="Composed mode with answers from the text, perturbed "
                               "distractors: how held-out items are asked. written: the "
                               "model writes a question for each held-out sentence (a call "
                               "each; a 135M writer loses most of them to the gates); "
                               "statement: 'Which statement about <section> is correct?' "
                               "over the sentence and its three perturbed copies, no model "
                               "call, so every sentence that can be perturbed becomes an item "
                               "(the unseen benchmark: every such sentence of the held-out "
                               "sections; the seen benchmark: `seen_fraction` of the "
                               "sentences that accepted training samples answer).")
    recall_samples: bool = Field(
        False, description="Composed mode with answers from the text: every answer-sized "
                           "sentence of the training sections that no accepted sample "
                           "answers becomes a training sample too, 'What does the text say "
                           "about <section>?' answered by the sentence, with no model call "
                           "(the facts taught by recall, as continued pretraining teaches "
                           "the text; a 135M writer's questions reach only a fifth of the "
                           "sentences). With benchmark_items: statement, their sentences get "
                           "seen items like the written samples'.")
    max_train_tasks: int | None = Field(
        None, ge=1, description="Training tasks kept, a seeded draw spread evenly over "
                                "perspectives and kinds; None: all. Held-out (benchmark) tasks "
                                "are never cut. A short training run sees only so many "
                                "samples: distilling more than it reads costs minutes for "
                                "nothing.")
    write_attempts: int = Field(
        1, ge=1, le=5, description="Composed mode with answers from the text: a question that "
                                   "fails validation is asked again with the next seed, up to "
                                   "this many calls in all.")
    constrained: bool | Literal["auto"] = Field(
        False, description="Generate every output that has a fixed shape (single mode's MC "
                           "block and question, the answerer's tags, the post-processor's "
                           "JSON, composed mode's question and sentence, a generated verifier "
                           "letter) under a grammar of that shape, so no sample is lost to "
                           "its format. true: every agent's backend must be able to (else an "
                           "error names it); auto: where the backend can; false: free text.")
    models: AgentModels = Field(default_factory=AgentModels)

    @model_validator(mode="after")
    def _by_fact(self) -> DistillConfig:
        if (self.benchmark_per_fact or self.write_attempts > 1 or self.seen_fraction
                or self.distractors != "siblings"
                or not self.benchmark_rationales) and not (
                self.mode == "composed" and self.answer_source == "text"):
            raise ValueError("distill.benchmark_per_fact, write_attempts, seen_fraction, "
                             "distractors and benchmark_rationales need mode: composed with "
                             "answer_source: "
                             "text (questions written for sentences of the text)")
        if self.recall_samples and not (self.mode == "composed"
                                        and self.answer_source == "text"):
            raise ValueError("distill.recall_samples needs mode: composed with answer_source: "
                             "text (the samples are sentences of the text)")
        if self.benchmark_items == "statement" and self.distractors != "perturbed":
            raise ValueError("distill.benchmark_items: statement needs distractors: perturbed "
                             "(its options are the sentence and three perturbed copies)")
        if self.benchmark_items == "statement" and self.benchmark_per_fact:
            raise ValueError("distill.benchmark_items: statement asks every held-out sentence "
                             "once, without a model call: leave benchmark_per_fact at 0")
        return self
