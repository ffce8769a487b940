import pytest

from workbench.distill import parse
from workbench.distill.parse import Reject

GOOD_MC = """Question: What is the VSWR for a reflection coefficient magnitude of 0.2?
A) 1.2
B) 1.5
C) 2.0
D) 0.8
Correct: B"""


def reason(fn, *a, **k):
    with pytest.raises(Reject) as e:
        fn(*a, **k)
    return e.value.reason


def test_mc_block_good_and_bad():
    q, opts, gold = parse.parse_mc_block(GOOD_MC)
    assert q.startswith("What is the VSWR") and opts == ["1.2", "1.5", "2.0", "0.8"]
    assert gold == "B"
    assert reason(parse.parse_mc_block, "") == "empty_output"
    assert reason(parse.parse_mc_block, GOOD_MC.replace("D) 0.8\n", "")) == "not_four_options"
    assert reason(parse.parse_mc_block, GOOD_MC.replace("Correct: B", "")) == \
        "no_correct_letter"
    assert reason(parse.parse_mc_block, GOOD_MC.replace("C) 2.0", "C) 1.5")) == \
        "duplicate_options"
    assert reason(parse.parse_mc_block, GOOD_MC.replace(
        "What is", "According to the text, what is")) == "not_self_contained"
    assert reason(parse.parse_mc_block, GOOD_MC.replace(
        "magnitude of 0.2", "given in Equation (2)")) == "numbered_reference"
    assert reason(parse.parse_mc_block, GOOD_MC.replace("D) 0.8", "D) None of the above")) \
        == "meta_option"


def test_answer_leak_is_removed_from_stem():
    text = "Question: Which class is most linear?\nAnswer: A\nA) class A\nB) class B\n" \
           "C) class C\nD) class E\nCorrect: A"
    q, _, _ = parse.parse_mc_block(text)
    assert q == "Which class is most linear?"
    assert parse.strip_answer_leaks("Which?\nCorrect answer: C") == "Which?"


def test_answerer_tags():
    out = "<think>VSWR = (1+0.2)/(1-0.2) = 1.5.</think>\nCompute VSWR.\n<answer>b</answer>"
    assert parse.parse_answerer(out, multiple_choice=True) == (
        "VSWR = (1+0.2)/(1-0.2) = 1.5.", "Compute VSWR.", "B")
    assert parse.parse_answerer("<think>x</think> s <answer>B, a</answer>",
                                multiple_choice=True)[2] == "AB"
    assert reason(parse.parse_answerer, "<think>x s <answer>B</answer>",
                  multiple_choice=True) == "unbalanced_tags"
    assert reason(parse.parse_answerer, "<think>x</think><answer>B</answer>",
                  multiple_choice=True) == "empty_solution"
    # each tag once, but a pair closed before it opens: a rejected reply, not a crash
    assert reason(parse.parse_answerer, "</think>a<think> s <answer>B</answer>",
                  multiple_choice=True) == "unbalanced_tags"
    assert reason(parse.parse_answerer, "<think>a</think> s </answer>B<answer>",
                  multiple_choice=True) == "unbalanced_tags"
    assert reason(parse.parse_answerer, "<think>a</think>s<answer>B</answer><answer>C</answer>",
                  multiple_choice=True) == "answer_tag_count"
    assert reason(parse.parse_answerer, "<think>a</think> s <answer>maybe B</answer>",
                  multiple_choice=True) == "answer_not_letters"
    assert reason(parse.parse_answerer, "<answer>B</answer> s <think>a</think>",
                  multiple_choice=True) == "answer_before_thinking"
    assert parse.parse_answerer("<think>a</think> s <answer>1.5</answer>",
                                multiple_choice=False)[2] == "1.5"


def test_letters_question_sentence_rationale_postprocess():
    assert parse.normalise_letters("(c)") == "C"
    assert parse.normalise_letters("options A and D") == "AD"
    assert reason(parse.normalise_letters, "E") == "answer_not_letters"
    assert parse.parse_question("What limits PA efficiency?\nextra") == \
        "What limits PA efficiency?"
    assert reason(parse.parse_question, "Explain the text.") == "no_question_mark"
    assert reason(parse.parse_question, "What is the main concept of the text?") == \
        "not_self_contained"
    assert reason(parse.parse_question, "") == "empty_output"
    assert parse.parse_sentence("Answer: Z0 is sqrt(L/C).") == "Z0 is sqrt(L/C)."
    assert reason(parse.parse_sentence, "ok") == "answer_too_short"
    assert reason(parse.parse_rationale, "Because.") == "rationale_too_short"
    good = '{"question": "q?", "thinking": "t", "solution": "s", "answer": "A"}'
    assert parse.parse_postprocess_json("Here: " + good)["answer"] == "A"
    assert reason(parse.parse_postprocess_json, "{bad json}") == "postprocess_bad_json"
    assert reason(parse.parse_postprocess_json, '{"question": "q"}') == \
        "postprocess_wrong_keys"


def test_numbered_references_rewritten():
    text, changed = parse.rewrite_numbered_refs("From Equation (2) and Fig. 3 we get Z0.")
    assert changed and text == "From the relevant equation and the relevant figure we get Z0."
    assert parse.rewrite_numbered_refs("No refs here.") == ("No refs here.", False)


def test_chatty_and_ungrounded_questions_rejected():
    assert reason(parse.check_question, "I'm ready to help. What's on your mind?") == \
        "chat_not_question"
    parse.check_grounded("What sets the characteristic impedance?",
                         "The characteristic impedance of a line is sqrt(L/C).")
    assert reason(parse.check_grounded, "What is the capital of France?",
                  "The characteristic impedance of a line is sqrt(L/C).") == "not_grounded"
