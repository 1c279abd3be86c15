"""Numbers between bounds as GBNF: every numeral the rules match lies between the bounds, and
every numeral between them (of the shapes the rules write) is matched. A small matcher for the
subset of GBNF the rules use stands in for llama.cpp's parser, which takes no text to match."""

from __future__ import annotations

import functools
import re
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from edgevlm.llama.numbers import LARGEST, Bound, BoundsError, decimal_rules, integer_range, integer_rule

_TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|\[[^\]]*\]|[()|?]|[A-Za-z0-9_-]+)')


class _Gbnf:
    """Matches text against GBNF expressions of literals, classes, groups, `?`, `|` and rules."""

    def __init__(self, rules: dict[str, str]) -> None:
        self.rules = {name: self._parse(body) for name, body in rules.items()}

    def _parse(self, text: str) -> tuple:
        tokens = [m.group(1) for m in _TOKEN.finditer(text)]
        node, rest = self._alternatives(tokens)
        assert not rest, rest
        return node

    def _alternatives(self, tokens: list[str]) -> tuple[tuple, list[str]]:
        options = []
        while True:
            seq, tokens = self._sequence(tokens)
            options.append(seq)
            if tokens and tokens[0] == "|":
                tokens = tokens[1:]
                continue
            return ("alt", tuple(options)), tokens

    def _sequence(self, tokens: list[str]) -> tuple[tuple, list[str]]:
        items = []
        while tokens and tokens[0] not in ("|", ")"):
            token, tokens = tokens[0], tokens[1:]
            if token == "(":
                item, tokens = self._alternatives(tokens)
                assert tokens[0] == ")"
                tokens = tokens[1:]
            elif token.startswith('"'):
                item = ("lit", token[1:-1])
            elif token.startswith("["):
                item = ("class", re.compile(token))
            else:
                item = ("ref", token)
            if tokens and tokens[0] == "?":
                item, tokens = ("opt", item), tokens[1:]
            items.append(item)
        return ("seq", tuple(items)), tokens

    def ends(self, node: tuple, text: str, pos: int) -> frozenset[int]:
        return self._ends(node, text, pos)

    @functools.cache  # noqa: B019 -- one matcher per test example
    def _ends(self, node: tuple, text: str, pos: int) -> frozenset[int]:
        kind = node[0]
        if kind == "lit":
            return frozenset([pos + len(node[1])]) if text.startswith(node[1], pos) else frozenset()
        if kind == "class":
            return frozenset([pos + 1]) if pos < len(text) and node[1].fullmatch(text[pos]) else frozenset()
        if kind == "ref":
            return self._ends(self.rules[node[1]], text, pos)
        if kind == "opt":
            return frozenset([pos]) | self._ends(node[1], text, pos)
        if kind == "alt":
            return frozenset().union(*(self._ends(option, text, pos) for option in node[1]))
        found = frozenset([pos])
        for item in node[1]:
            found = frozenset().union(*(self._ends(item, text, p) for p in found)) if found else found
        return found

    def matches(self, expression: str, text: str) -> bool:
        return len(text) in self.ends(self._parse(expression), text, 0)


def _numeral(value: Decimal) -> str:
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


_values = st.one_of(st.integers(-3000, 3000).map(Decimal),
                    st.decimals(min_value=-300, max_value=300, places=3, allow_nan=False,
                                allow_infinity=False))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**7), st.integers(0, 10**7), st.lists(st.integers(0, 2 * 10**7), max_size=40))
def test_a_range_matches_exactly_its_integers(a: int, b: int, probes: list[int]) -> None:
    low, high = min(a, b), max(a, b)
    alternatives = ["".join(t.strip('"') if t.startswith('"') else t for t in seq)
                    for seq in integer_range(low, high)]
    rule = re.compile("^(" + "|".join(alternatives) + ")$")
    for n in [low, high, low - 1, high + 1, 0, 10 ** len(str(high)), *probes]:
        if n >= 0:
            assert bool(rule.match(str(n))) == (low <= n <= high), (low, high, n)
    assert not rule.match("0" + str(high))  # no leading zeros


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.integers(-5000, 5000)), st.one_of(st.none(), st.integers(-5000, 5000)),
       st.lists(st.integers(-20000, 20000), max_size=30))
def test_integer_bounds_of_either_sign_or_one_side_hold_exactly(low: int | None, high: int | None,
                                                                probes: list[int]) -> None:
    if low is not None and high is not None and low > high:
        low, high = high, low
    matcher = _Gbnf({})
    rule = integer_rule(low, high)
    for n in [*probes, 0, -1, 1, *(b + d for b in (low, high) if b is not None for d in (-1, 0, 1))]:
        inside = (low is None or n >= low) and (high is None or n <= high)
        assert matcher.matches(rule, str(n)) == inside, (low, high, n)
    assert not matcher.matches(rule, "-0") and not matcher.matches(rule, "007")


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.none(), _values), st.booleans(), st.one_of(st.none(), _values), st.booleans(),
       st.lists(_values, min_size=1, max_size=25))
def test_decimal_bounds_hold_exactly(low: Decimal | None, low_open: bool, high: Decimal | None,
                                     high_open: bool, probes: list[Decimal]) -> None:
    if low is not None and high is not None and low > high:
        low, high = high, low
    lower = None if low is None else Bound(low, low_open)
    upper = None if high is None else Bound(high, high_open)
    try:
        expression, rules = decimal_rules(lower, upper, "n")
    except BoundsError:
        assert low is not None and high is not None and low == high and (low_open or high_open)
        return
    matcher = _Gbnf(rules)
    edges = [b + d for b in (low, high) if b is not None for d in (Decimal("-0.001"), 0, Decimal("0.001"))]
    for value in [*probes, Decimal(0), Decimal("0.5"), Decimal(-1), *edges]:
        above = low is None or (value > low if low_open else value >= low)
        below = high is None or (value < high if high_open else value <= high)
        text = _numeral(value)
        assert matcher.matches(expression, text) == (above and below), (low, low_open, high, high_open, text)
    assert not matcher.matches(expression, "1e5") and not matcher.matches(expression, "01")


def test_pydantic_style_bounds_as_openai_parse_sends_them() -> None:
    """ge=0 alone (no minus sign), 0 <= x <= 1, gt=0, and one-sided integers (issue 49.5)."""
    expression, rules = decimal_rules(Bound(Decimal(0)), Bound(Decimal(1)), "p")
    matcher = _Gbnf(rules)
    assert all(matcher.matches(expression, t) for t in ("0", "1", "0.5", "0.999", "1.0", "0.0001"))
    assert not any(matcher.matches(expression, t) for t in ("-0.5", "1.5", "2", "1.01", "-1"))
    positive, rules = decimal_rules(Bound(Decimal(0), exclusive=True), None, "q")
    matcher = _Gbnf(rules)
    assert matcher.matches(positive, "0.01") and matcher.matches(positive, "123")
    assert not matcher.matches(positive, "0") and not matcher.matches(positive, "0.000")
    assert not matcher.matches(positive, "-3")
    plain = _Gbnf({})
    non_negative, at_most_ten = integer_rule(0, None), integer_rule(None, 10)
    assert plain.matches(non_negative, str(LARGEST)) and not plain.matches(non_negative, "-9")
    assert plain.matches(at_most_ten, "-9999") and not plain.matches(at_most_ten, "11")


def test_a_fraction_is_held_to_the_converters_sixteen_digits() -> None:
    """An answer ends within its tokens: past its bounds' own digits, a fraction runs to 16 more."""
    expression, rules = decimal_rules(Bound(Decimal(0), exclusive=True), Bound(Decimal("2.5")), "t")
    matcher = _Gbnf(rules)
    assert matcher.matches(expression, "1." + "7" * 16) and not matcher.matches(expression, "1." + "7" * 17)
    assert matcher.matches(expression, "0." + "0" * 15 + "1")
    assert matcher.matches(expression, "2.5" + "0" * 16)
