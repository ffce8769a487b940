"""Distillation under constrained decoding (issue 28, item 5): every output with a fixed shape
is generated under its grammar, so no sample is rejected for its format. The teacher is the
tiny random-init model: unconstrained it writes noise and every sample fails its format;
every well-formed output here is the grammar's doing."""

import pytest

from workbench.distill import parse, shapes
from workbench.distill.config import AgentModel, DistillConfig
from workbench.distill.pipeline import run_distill
from workbench.errors import WorkbenchError
from workbench.models import load_model
from workbench.models.base import GenerationParams

ASK = [{"role": "user", "content": "Write an exam question about impedance matching."}]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return load_model(tiny_model, device="cpu")


def _gen(model, constraint, n=4, max_tokens=700):
    return model.generate([ASK] * n, GenerationParams(max_tokens=max_tokens, temperature=1.0,
                                                      seed=5, constraint=constraint))


def _format_reason(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except parse.Reject as r:
        return r.reason if r.reason in shapes.FORMAT_REASONS else None
    return None


def test_each_shape_is_what_its_parser_reads(tiny):
    """Sampled noise under each shape parses: the parsers find no format fault (content
    checks such as 'grounded' may still refuse what a random model writes)."""
    n = 40  # the shapes' lengths follow max_tokens, so the frame closes within it
    cases = [
        (shapes.mc_block(n), lambda t: parse.parse_mc_block(t)),
        (shapes.written_question(n), lambda t: parse.parse_question(t)),
        (shapes.question(n, "How"), lambda t: parse.parse_question(t)),
        (shapes.sentence(n), lambda t: parse.parse_sentence(t)),
        (shapes.answerer(n, True), lambda t: parse.parse_answerer(t, multiple_choice=True)),
        (shapes.answerer(n, False), lambda t: parse.parse_answerer(t, multiple_choice=False)),
        (shapes.postprocess(n, False), lambda t: parse.parse_postprocess_json(t)),
        (shapes.postprocess(n, True),
         lambda t: parse.normalise_letters(parse.parse_postprocess_json(t)["answer"])),
        (shapes.letter(), lambda t: parse.normalise_letters(t)),
    ]
    for constraint, read in cases:
        gens = _gen(tiny, constraint, max_tokens=n * 3)
        for g in gens:
            assert g.finish_reason == "stop", (constraint.value[:40], g.text[-80:])
            assert _format_reason(read, g.text) is None, (constraint.value[:40], g.text)
    # the question shape starts with the perspective's word
    assert all(g.text.startswith("How ") for g in _gen(tiny, shapes.question(n, "How"),
                                                          max_tokens=n * 3))
    # unconstrained, the same sampling fails the MC format
    free = tiny.generate([ASK] * 4, GenerationParams(max_tokens=60, temperature=1.0, seed=5))
    assert all(_format_reason(parse.parse_mc_block, g.text) for g in free)


def _run(tiny_model, tmp_path, name, **kw):
    # 50 tokens, not 100: the same 4 tasks, all refused for their format when free and none
    # when held, with the same content refusals (measured), in half the time
    cfg = DistillConfig(corpus="datasets/rf", domain="rf", max_sections=1,
                        perspectives=["concepts", "design"], benchmark_fraction=0.0,
                        writer_max_tokens=50, answer_max_tokens=50, writer_temperature=1.0,
                        answer_temperature=1.0, verifier={"method": "generate"},
                        mode="single", **kw)
    return run_distill(cfg, tmp_path / name, default_model=AgentModel(spec=tiny_model),
                       seed=1).report


def test_single_mode_under_constraints_loses_no_sample_to_its_format(tiny_model, tmp_path):
    free = _run(tiny_model, tmp_path, "free")
    held = _run(tiny_model, tmp_path, "held", constrained=True)
    assert free.constrained == [] and free.rejects_format == free.stages["tasks"]
    assert held.constrained == ["writer", "answerer", "verifier"]
    assert held.rejects_format == 0, held.rejects
    assert held.rejects_format + held.rejects_content + held.accepted.total \
        == held.stages["tasks"]
    # the JSON post-processor holds too
    pp = _run(tiny_model, tmp_path, "pp", constrained=True, llm_postprocess=True)
    assert pp.rejects_format == 0 and "postprocess" in pp.constrained, pp.rejects


def test_composed_mode_questions_start_with_the_perspectives_word(tiny_model, tmp_path):
    cfg = DistillConfig(corpus="datasets/rf", domain="rf", max_sections=1, mode="composed",
                        answer_source="text", perspectives=["concepts", "design"],
                        benchmark_fraction=0.0, verifier={"enabled": False},
                        writer_max_tokens=40, answer_max_tokens=40, constrained="auto")
    res = run_distill(cfg, tmp_path / "c", default_model=AgentModel(spec=tiny_model), seed=2)
    rep = res.report
    assert rep.constrained and rep.rejects.get("no_question_mark", 0) == 0
    assert "Rejected for their format" in (tmp_path / "c" / "report.md").read_text()


def test_constrained_on_names_the_agent_that_cannot(tmp_path):
    cfg = DistillConfig(corpus="datasets/rf", domain="rf", max_sections=1, mode="single",
                        constrained=True)
    with pytest.raises(WorkbenchError, match="writer's model \\(fake\\) cannot generate"):
        run_distill(cfg, tmp_path / "x", default_model=AgentModel(
            spec="fake", options={"script": "fake_teacher:reply"}))
    # auto falls back to free text where the backend cannot
    rep = run_distill(cfg.model_copy(update={"constrained": "auto"}), tmp_path / "y",
                      default_model=AgentModel(spec="fake",
                                               options={"script": "fake_teacher:reply"})).report
    assert rep.constrained == [] and rep.accepted.total > 0
