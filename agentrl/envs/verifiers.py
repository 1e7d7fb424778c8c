"""Reward functions (verifiers): reusable objects that score a final answer against a task.

A verifier follows the :class:`Verifier` protocol, ``score(answer_text, task) -> (reward,
info)``: ``answer_text`` is the model's whole final turn; the verifier extracts the answer
itself (``\\boxed{...}`` or a final ``Answer:`` line) so it can be reused by any
environment, and ``info`` always says what was extracted and what was expected.
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

from agentrl.extras import require


@runtime_checkable
class Verifier(Protocol):
    """Scores a final answer: ``(reward, info)``; never raises for bad model output."""

    def score(self, answer_text: str, task: dict[str, Any]) -> tuple[float, dict[str, Any]]: ...


# --- answer extraction ----------------------------------------------------------------

_ANSWER_LINE = re.compile(r"^\s*(?:\*\*)?(?:final\s+)?answer(?:\*\*)?\s*[:：]\s*(.+?)\s*$", re.I)


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces, or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = start + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            while j < len(text):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j].strip()
                j += 1
        start = text.rfind("\\boxed", 0, start)
    return None


def extract_answer(text: str) -> str | None:
    """The final answer in a model's text: the last ``\\boxed{}``, else the last ``Answer:``
    line; None when neither is present. An equation (``9 + 9 = 18``) answers with its
    right-hand side; an expression without ``=`` is kept whole (and is not a number)."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return _right_hand_side(boxed)
    for line in reversed(text.strip().splitlines()):
        m = _ANSWER_LINE.match(line)
        if m:
            answer = m.group(1).strip().strip("*").strip()
            if answer.startswith("$") and answer.endswith("$") and len(answer) > 1:
                answer = answer[1:-1].strip()
            return _right_hand_side(answer.rstrip(".").strip()) or None
    return None


def _right_hand_side(answer: str) -> str:
    # "a = b" states b; "==", "<=", ">=" and "!=" are comparisons, not a statement of value
    parts = re.split(r"(?<![=<>!])=(?!=)", answer)
    if len(parts) < 2:
        return answer
    rhs = parts[-1].strip()
    return rhs or answer


# --- numeric / symbolic equivalence ----------------------------------------------------

_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")
_FRAC_LATEX = re.compile(r"^([+-]?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def _clean(s: str) -> str:
    s = s.strip().strip("$").strip()
    s = s.replace("\\!", "").replace("\\,", "").replace("−", "-").replace("\\left", "")
    s = s.replace("\\right", "").replace("\\cdot", "*").replace("\\times", "*")
    s = re.sub(r"\\text\{[^{}]*\}", "", s)  # units: \text{ cm}
    s = s.rstrip(".").strip()
    if s.endswith("%"):
        s = s[:-1].strip()
    return s


def parse_number(s: str) -> Fraction | float | None:
    """Parse a number written as an int, decimal, ``1,234``, ``3/4``, ``\\frac{3}{4}`` or
    ``1e-3``; exact (Fraction) where possible, float for huge exponents, None otherwise."""
    s = _clean(s)
    if not s:
        return None
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    m = _FRAC_LATEX.match(s)
    if m:
        num, den = parse_number(m.group(2)), parse_number(m.group(3))
        if num is None or den is None or den == 0:
            return None
        value = Fraction(num) / Fraction(den)
        return -value if m.group(1) == "-" else value
    if s.count("/") == 1:
        num_s, den_s = s.split("/")
        num, den = parse_number(num_s), parse_number(den_s)
        if num is None or den is None or den == 0:
            return None
        return Fraction(num) / Fraction(den)
    if not _NUMBER.match(s):
        return None
    try:
        exponent = int(s.lower().split("e")[1]) if "e" in s.lower() else 0
        if abs(exponent) > 300:
            return float(s)
        return Fraction(s)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


_SAFE_EXPR = re.compile(r"^[0-9a-z+\-*/^().\s]+$")
_SAFE_NAMES = {"sqrt", "pi", "e", "log", "exp", "sin", "cos", "tan", "x", "y", "z", "n"}
_POWER = re.compile(r"(\*\*|\^)\s*(\(?)\s*([^\s()]*)")


def _safe_for_sympy(s: str) -> bool:
    """sympify evaluates its input; only allow short arithmetic over known names and small
    exponents, so model output can neither run code nor hang the scorer."""
    if len(s) > 80 or "__" in s or not _SAFE_EXPR.match(s):
        return False
    if any(name not in _SAFE_NAMES for name in re.findall(r"[a-z]+", s)):
        return False
    return all(re.fullmatch(r"\d{1,2}", m.group(3)) for m in _POWER.finditer(s))


def _symbolic_equal(a: str, b: str) -> bool:
    try:
        import sympy
    except ImportError:  # sympy is optional: numbers still compare exactly
        return False
    a, b = _clean(a).lower(), _clean(b).lower()
    if not (_safe_for_sympy(a) and _safe_for_sympy(b)):
        return False
    try:
        ea = sympy.sympify(a.replace("^", "**"))
        eb = sympy.sympify(b.replace("^", "**"))
        return bool(sympy.simplify(ea - eb) == 0)
    except Exception:  # anything unparsable is simply not equal
        return False


def answers_equivalent(answer: str, expected: str, rel_tol: float = 1e-6) -> bool:
    """True when two answers denote the same value: numbers equal within ``rel_tol``
    (fractions, decimals, ``1,234``); when ``expected`` is not a number, equal expressions
    (with sympy); or equal strings ignoring whitespace and case."""
    if _clean(answer).lower().replace(" ", "") == _clean(expected).lower().replace(" ", ""):
        return True
    x, y = parse_number(answer), parse_number(expected)
    if y is not None:
        # a number is expected: the answer must be a number too, so boxing the question's
        # own expression ("12 + -97 - 75") earns nothing
        if x is None:
            return False
        # float noise (0.30000000000000004, 0.333333333 for 1/3) counts as equal
        return x == y or math.isclose(float(x), float(y), rel_tol=rel_tol, abs_tol=1e-12)
    return _symbolic_equal(answer, expected)


class MathVerifier:
    """Reward 1.0 when the extracted answer is numerically/symbolically equal to
    ``task["answer"]``, else 0.0."""

    def __init__(self, rel_tol: float = 1e-6) -> None:
        self.rel_tol = rel_tol

    def score(self, answer_text: str, task: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        expected = str(task["answer"])
        extracted = extract_answer(answer_text)
        correct = extracted is not None and answers_equivalent(extracted, expected, self.rel_tol)
        info = {
            "extracted": extracted,
            "expected": expected,
            "correct": correct,
            "scorer": "numeric",
        }
        if extracted is None:
            info["error"] = "no answer found: expected \\boxed{...} or a final 'Answer:' line"
        return (1.0 if correct else 0.0), info


# --- exact match and F1 (question answering) ------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower case, strip accents, punctuation, articles and extra whitespace; ``1,234``
    becomes ``1234``."""
    s = unicodedata.normalize("NFKD", s)
    s = "".join(c for c in s if not unicodedata.combining(c)).lower()
    s = re.sub(r"(?<=\d),(?=\d{3})", "", s)
    s = s.translate(_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def f1_score(prediction: str, reference: str) -> float:
    """Token-level F1 between normalised strings (SQuAD style)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def _references(task: dict[str, Any]) -> list[str]:
    refs = task.get("answers") or [task["answer"]]
    if isinstance(refs, str):
        refs = [refs]
    return [str(r) for r in refs]


class ExactMatchVerifier:
    """Reward 1.0 when the extracted answer matches any of ``task["answers"]`` (or
    ``task["answer"]``) after :func:`normalize_answer`; token F1 goes into ``info``."""

    def score(self, answer_text: str, task: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        refs = _references(task)
        extracted = extract_answer(answer_text)
        if extracted is None:
            # a short final turn with no marker is still an answer
            stripped = answer_text.strip()
            extracted = stripped if stripped and len(stripped) <= 100 else None
        pred = extracted or ""
        exact = any(normalize_answer(pred) == normalize_answer(r) for r in refs) and bool(pred)
        f1 = max(f1_score(pred, r) for r in refs)
        info = {"extracted": extracted, "expected": refs, "exact_match": exact, "f1": f1}
        return (1.0 if exact else 0.0), info


class ReasoningGymVerifier:
    """Score with the reasoning-gym generator's own scorer (``score_answer(answer, entry)``)
    when it has one; generators that only inherit the base class's substring scorer
    (which would credit ``2140`` for ``214``) fall back to :class:`MathVerifier`."""

    def __init__(self, datasets: dict[str, Any]) -> None:
        self.datasets = datasets  # generator name -> reasoning_gym dataset instance
        self._numeric = MathVerifier()

    def score(self, answer_text: str, task: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        rg = require("reasoning_gym.dataset", "demo", "the reasoning-gym verifier")
        ProceduralDataset = rg.ProceduralDataset

        dataset = self.datasets.get(task.get("generator", ""))
        if dataset is None or type(dataset).score_answer is ProceduralDataset.score_answer:
            return self._numeric.score(answer_text, task)
        extracted = extract_answer(answer_text)
        try:
            reward = float(dataset.score_answer(extracted, task["entry"]))
        except Exception as e:  # a scorer bug must not kill the run; score as wrong
            reward, error = 0.0, f"scorer raised {type(e).__name__}: {e}"
        else:
            error = None
        info: dict[str, Any] = {
            "extracted": extracted,
            "expected": str(task["answer"]),
            "correct": reward >= 1.0,
            "scorer": f"reasoning_gym:{task['generator']}",
        }
        if error:
            info["error"] = error
        elif extracted is None:
            info["error"] = "no answer found: expected \\boxed{...} or a final 'Answer:' line"
        return reward, info


def first_match(candidates: Sequence[str], answer: str) -> str | None:
    """The first candidate equal to ``answer`` after normalisation (for question generators
    that must check their answers are unambiguous)."""
    target = normalize_answer(answer)
    return next((c for c in candidates if normalize_answer(c) == target), None)
