"""Small Python repositories with their own tests: the seeds of the generated ``repo`` tasks.

Each is a package of one module and a test file of plain ``test_*`` functions (pytest
style, no fixtures). The bug generator (``repo_tasks.py``) mutates one function and keeps
mutations whose tests fail. Functions avoid ``while`` loops so that no mutation can hang.
"""

from __future__ import annotations

TEMPLATES: dict[str, dict[str, str]] = {
    "textkit": {
        "textkit/__init__.py": '"""Text helpers."""\n',
        "textkit/words.py": """\
def count_words(text):
    return len([w for w in text.split() if w])


def longest_word(text):
    best = ""
    for word in text.split():
        if len(word) > len(best):
            best = word
    return best


def is_palindrome(text):
    letters = [c.lower() for c in text if c.isalnum()]
    return letters == letters[::-1]


def initials(name):
    parts = [p for p in name.split() if p]
    return "".join(p[0].upper() for p in parts)
""",
        "tests/test_words.py": """\
from textkit.words import count_words, initials, is_palindrome, longest_word


def test_count_words():
    assert count_words("a bb ccc") == 3
    assert count_words("  spaced   out  ") == 2
    assert count_words("") == 0


def test_longest_word():
    assert longest_word("a bbb cc") == "bbb"
    assert longest_word("tie tie") == "tie"
    assert longest_word("x yy zz") == "yy"


def test_is_palindrome():
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert not is_palindrome("abca")
    assert is_palindrome("")


def test_initials():
    assert initials("ada lovelace") == "AL"
    assert initials(" grace  brewster hopper ") == "GBH"
""",
    },
    "mathkit": {
        "mathkit/__init__.py": '"""Numbers."""\n',
        "mathkit/stats.py": """\
def mean(xs):
    return sum(xs) / len(xs)


def median(xs):
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    if n % 2 == 1:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def running_max(xs):
    out = []
    best = None
    for x in xs:
        if best is None or x > best:
            best = x
        out.append(best)
    return out
""",
        "tests/test_stats.py": """\
from mathkit.stats import clamp, mean, median, running_max


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5
    assert mean([5]) == 5


def test_median():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
    assert median([7]) == 7


def test_clamp():
    assert clamp(5, 0, 10) == 5
    assert clamp(-3, 0, 10) == 0
    assert clamp(12, 0, 10) == 10
    assert clamp(10, 0, 10) == 10


def test_running_max():
    assert running_max([1, 3, 2, 5, 4]) == [1, 3, 3, 5, 5]
    assert running_max([]) == []
    assert running_max([-2, -5]) == [-2, -2]
""",
    },
    "listkit": {
        "listkit/__init__.py": '"""List helpers."""\n',
        "listkit/ops.py": """\
def chunk(xs, size):
    return [xs[i : i + size] for i in range(0, len(xs), size)]


def flatten(xss):
    out = []
    for xs in xss:
        out.extend(xs)
    return out


def dedupe(xs):
    seen = set()
    out = []
    for x in xs:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def rotate(xs, k):
    if not xs:
        return []
    k = k % len(xs)
    return xs[k:] + xs[:k]
""",
        "tests/test_ops.py": """\
from listkit.ops import chunk, dedupe, flatten, rotate


def test_chunk():
    assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert chunk([], 3) == []


def test_flatten():
    assert flatten([[1], [2, 3], []]) == [1, 2, 3]


def test_dedupe():
    assert dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]


def test_rotate():
    assert rotate([1, 2, 3, 4], 1) == [2, 3, 4, 1]
    assert rotate([1, 2, 3], 4) == [2, 3, 1]
    assert rotate([], 2) == []
""",
    },
    "geom": {
        "geom/__init__.py": '"""Plane geometry."""\n',
        "geom/shapes.py": """\
def rect_area(w, h):
    return w * h


def perimeter(w, h):
    return 2 * (w + h)


def manhattan(p, q):
    return abs(p[0] - q[0]) + abs(p[1] - q[1])


def in_box(p, lo, hi):
    return lo[0] <= p[0] <= hi[0] and lo[1] <= p[1] <= hi[1]
""",
        "tests/test_shapes.py": """\
from geom.shapes import in_box, manhattan, perimeter, rect_area


def test_rect_area():
    assert rect_area(3, 4) == 12
    assert rect_area(0, 9) == 0


def test_perimeter():
    assert perimeter(3, 4) == 14


def test_manhattan():
    assert manhattan((0, 0), (3, 4)) == 7
    assert manhattan((2, -1), (-1, 3)) == 7


def test_in_box():
    assert in_box((1, 1), (0, 0), (2, 2))
    assert in_box((2, 2), (0, 0), (2, 2))
    assert not in_box((3, 1), (0, 0), (2, 2))
    assert not in_box((1, -1), (0, 0), (2, 2))
""",
    },
    "bank": {
        "bank/__init__.py": '"""Account arithmetic in cents."""\n',
        "bank/account.py": """\
def balance(transactions):
    total = 0
    for amount in transactions:
        total += amount
    return total


def can_withdraw(current, amount, overdraft=0):
    return amount <= current + overdraft


def fee(amount):
    if amount < 1000:
        return 25
    return amount // 100


def interest(cents, rate_percent, years):
    for _ in range(years):
        cents = cents + cents * rate_percent // 100
    return cents
""",
        "tests/test_account.py": """\
from bank.account import balance, can_withdraw, fee, interest


def test_balance():
    assert balance([100, -30, 5]) == 75
    assert balance([]) == 0


def test_can_withdraw():
    assert can_withdraw(100, 100)
    assert not can_withdraw(100, 101)
    assert can_withdraw(100, 150, overdraft=50)


def test_fee():
    assert fee(999) == 25
    assert fee(1000) == 10
    assert fee(5000) == 50


def test_interest():
    assert interest(1000, 10, 2) == 1210
    assert interest(1000, 10, 0) == 1000
""",
    },
    "grades": {
        "grades/__init__.py": '"""Course grades."""\n',
        "grades/report.py": """\
def letter(score):
    if score >= 90:
        return "A"
    if score >= 80:
        return "B"
    if score >= 70:
        return "C"
    return "F"


def average(scores):
    if not scores:
        return 0
    return sum(scores) / len(scores)


def passed(scores, threshold=70):
    return [s for s in scores if s >= threshold]


def best(scores, k=1):
    return sorted(scores, reverse=True)[:k]
""",
        "tests/test_report.py": """\
from grades.report import average, best, letter, passed


def test_letter():
    assert letter(95) == "A"
    assert letter(90) == "A"
    assert letter(85) == "B"
    assert letter(70) == "C"
    assert letter(10) == "F"


def test_average():
    assert average([80, 90]) == 85
    assert average([]) == 0


def test_passed():
    assert passed([50, 70, 90]) == [70, 90]
    assert passed([50, 60], threshold=55) == [60]


def test_best():
    assert best([3, 9, 4]) == [9]
    assert best([3, 9, 4], k=2) == [9, 4]
""",
    },
}
