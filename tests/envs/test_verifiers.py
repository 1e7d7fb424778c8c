"""Answer extraction, numeric/symbolic equivalence, exact match and F1."""

from __future__ import annotations

import pytest

from agentrl.envs.verifiers import (
    ExactMatchVerifier,
    MathVerifier,
    answers_equivalent,
    extract_answer,
    f1_score,
    normalize_answer,
    parse_number,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The result is \\boxed{42}.", "42"),
        ("first \\boxed{1} then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("\\boxed {  7 }", "7"),
        ("Let me think.\nAnswer: 1,234.", "1,234"),
        ("**Final Answer:** $-5$", "-5"),
        ("answer: Paris\nsome trailing words", "Paris"),
        ("no marker here, 17", None),
        ("\\boxed{unclosed", None),
        ("\\boxed{9 + 9 = 18}", "18"),
        ("Answer: x = -3", "-3"),
        ("\\boxed{12 + -97 - 75}", "12 + -97 - 75"),
        ("\\boxed{a == b}", "a == b"),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("1,234", "1234"),
        ("3/4", "0.75"),
        ("\\frac{3}{4}", "0.75"),
        ("-\\dfrac{1}{2}", "-0.5"),
        ("12.50", "12.5"),
        ("1e3", "1000"),
        ("$5", "5"),
        ("−4", "-4"),
        ("50%", "50"),
        ("sqrt(8)", "2*sqrt(2)"),
        ("x^2 + 2*x + 1", "(x+1)^2"),
        ("0.333333333", "1/3"),
    ],
)
def test_equivalent(a: str, b: str) -> None:
    assert answers_equivalent(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("214", "2140"),
        ("2140", "214"),
        ("1,23", "123"),  # not a thousands separator
        ("3/4", "4/3"),
        ("1/0", "1"),
        ("__import__('os').getcwd()", "1"),
        ("2^99999999999", "1"),  # refused before sympy, not evaluated
        ("sqrt(2)", "1.41"),
        ("12 + -97 - 75", "-160"),  # the question's expression is not an answer
        ("2*sqrt(2)", "2.8284271247"),
        ("", "0"),
    ],
)
def test_not_equivalent(a: str, b: str) -> None:
    assert not answers_equivalent(a, b)


def test_parse_number_exact() -> None:
    assert parse_number("0.1") + parse_number("0.2") == parse_number("0.3")
    assert parse_number("1,000,000") == 10**6
    assert parse_number("abc") is None


def test_math_verifier() -> None:
    v = MathVerifier()
    task = {"answer": "-61"}
    assert v.score("so \\boxed{-61}", task)[0] == 1.0
    reward, info = v.score("so \\boxed{61}", task)
    assert reward == 0.0 and info["extracted"] == "61" and info["expected"] == "-61"
    reward, info = v.score("-61", task)  # no marker: not an answer
    assert reward == 0.0 and "no answer found" in info["error"]


def test_normalize_and_f1() -> None:
    assert normalize_answer("The  Curaçao, Inc.") == "curacao inc"
    assert normalize_answer("66,078,000") == "66078000"
    assert f1_score("Western Europe", "Europe") == pytest.approx(2 / 3)
    assert f1_score("Paris", "Rome") == 0.0


def test_exact_match_verifier() -> None:
    v = ExactMatchVerifier()
    task = {"answer": "EUR", "answers": ["EUR", "USD"]}
    assert v.score("\\boxed{usd}", task)[0] == 1.0
    assert v.score("Answer: the EUR.", task)[0] == 1.0
    reward, info = v.score("\\boxed{GBP}", task)
    assert reward == 0.0 and info["f1"] == 0.0
    reward, info = v.score("\\boxed{Western Europe}", {"answer": "Europe"})
    assert reward == 0.0 and info["f1"] == pytest.approx(2 / 3)
    assert v.score("Europe", {"answer": "Europe"})[0] == 1.0  # short unmarked answer counts
