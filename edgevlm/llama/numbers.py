"""GBNF for numbers between bounds: the decimal numerals of an interval, held exactly.

llama-cpp-python's schema converter has no rule for `minimum`, `maximum` or their exclusive
forms, so `ge=0` let `-9999999999999999` through in 3 answers of 6 (issue 49). These rules write
exactly the numerals between two bounds, digit by digit, as llama.cpp's own C++ converter does for
integers, and extend it to decimals (without an exponent) through their fraction digits, which
compare as strings do. Pure: no grammar parser here, only text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

# The converter's own integers have at most 16 digits (`[1-9] [0-9]{0,15}`); a bound past them is
# held to them (a stricter bound every answer of which still follows the schema), and a range
# wholly past them cannot be written.
MAX_DIGITS = 16
LARGEST = 10 ** MAX_DIGITS - 1


# Where a fraction's digits stand against the bounds' digits still to come: the lower bound's
# rest and whether it is exclusive, the upper's rest (None: no longer binding) and the same.
_State = tuple[str, bool, str | None, bool]


class BoundsError(ValueError):
    """Bounds that no numeral a grammar can write lies between."""


@dataclass(frozen=True)
class Bound:
    """One side of an interval: a value, and whether the value itself is outside."""

    value: Decimal
    exclusive: bool = False


def integer_bounds(bounds: dict[str, int | float]) -> tuple[int | None, int | None]:
    """A schema's minimum, maximum and their exclusive forms as the inclusive bounds of an
    integer (None: unbounded on that side)."""
    lows = [math.ceil(bounds["minimum"])] if "minimum" in bounds else []
    lows += [math.floor(bounds["exclusiveMinimum"]) + 1] if "exclusiveMinimum" in bounds else []
    highs = [math.floor(bounds["maximum"])] if "maximum" in bounds else []
    highs += [math.ceil(bounds["exclusiveMaximum"]) - 1] if "exclusiveMaximum" in bounds else []
    return max(lows, default=None), min(highs, default=None)


def number_bounds(bounds: dict[str, int | float]) -> tuple[Bound | None, Bound | None]:
    """A schema's bounds on a number as the interval's two sides (the tighter where both forms
    are given; None: unbounded on that side)."""
    def side(inclusive: str, exclusive: str, tighter: int) -> Bound | None:
        found = [Bound(_decimal(bounds[inclusive]))] if inclusive in bounds else []
        found += [Bound(_decimal(bounds[exclusive]), exclusive=True)] if exclusive in bounds else []
        # the tighter side: the larger lower bound (exclusive first when equal), the smaller upper
        return max(found, key=lambda b: (tighter * b.value, b.exclusive), default=None)

    return side("minimum", "exclusiveMinimum", 1), side("maximum", "exclusiveMaximum", -1)


def _decimal(value: int | float) -> Decimal:
    """A bound as written: 0.1 is 0.1, not the binary fraction nearest it."""
    return Decimal(value) if isinstance(value, int) else Decimal(repr(value))


def integer_rule(low: int | None, high: int | None) -> str:
    """A GBNF expression for the integers from low to high (None: unbounded on that side, held
    to MAX_DIGITS digits), with no leading zeros and no `-0`. BoundsError if there are none."""
    low = -LARGEST if low is None else max(low, -LARGEST)
    high = LARGEST if high is None else min(high, LARGEST)
    if low > high:
        raise BoundsError(f"no integer of at most {MAX_DIGITS} digits lies between the bounds")
    parts = []
    if low < 0:  # the negative side, as magnitudes
        alternatives = integer_range(max(1, -high), -low)
        if alternatives:
            parts.append(f'"-" ({_alternatives(alternatives)})')
    if high >= 0:
        parts.append(_alternatives(integer_range(max(0, low), high)))
    return " | ".join(f"({part})" for part in parts)


def integer_range(low: int, high: int) -> list[list[str]]:
    """GBNF sequences (a digit literal or class per position) that match exactly the decimal
    integers from low to high (0 <= low <= high), without leading zeros."""
    found: list[list[str]] = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        first = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        last = min(high, 10 ** digits - 1)
        if first <= last:
            found += _same_length(str(first), str(last))
    return found


def _same_length(low: str, high: str) -> list[list[str]]:
    """Sequences for the numbers between two of the same length (as digit strings): the first
    digit's part below, the whole decades between (one class), and the part above."""
    if low == high:
        return [[f'"{low}"']]
    if len(low) == 1:
        return [[_digits(int(low), int(high))]]
    rest = len(low) - 1
    zeros, nines = "0" * rest, "9" * rest
    if low[0] == high[0]:
        return [[f'"{low[0]}"', *tail] for tail in _same_length(low[1:], high[1:])]
    start, end, found, above = int(low[0]), int(high[0]), [], []
    if low[1:] != zeros:
        found = [[f'"{low[0]}"', *tail] for tail in _same_length(low[1:], nines)]
        start += 1
    if high[1:] != nines:
        above = [[f'"{high[0]}"', *tail] for tail in _same_length(zeros, high[1:])]
        end -= 1
    if start <= end:
        found.append([_digits(start, end), *["[0-9]"] * rest])
    return found + above


def _digits(low: int, high: int) -> str:
    return f'"{low}"' if low == high else f"[{low}-{high}]"


def _alternatives(sequences: list[list[str]]) -> str:
    return " | ".join(" ".join(seq) for seq in sequences)


def decimal_rules(low: Bound | None, high: Bound | None, prefix: str) -> tuple[str, dict[str, str]]:
    """A GBNF expression for the decimal numerals (an optional `-`, an integral part, an
    optional fraction; no exponent) between two bounds, and the rules it refers to, all named
    `prefix-…`. BoundsError if none lies between them."""
    writer = _FractionRules(prefix)
    lowest = Bound(Decimal(-LARGEST)) if low is None or low.value < -LARGEST else low
    highest = None if high is None or high.value > LARGEST else high
    if highest is not None and (lowest.value > highest.value or (
            lowest.value == highest.value and (lowest.exclusive or highest.exclusive))):
        raise BoundsError("no number lies between the bounds")
    if lowest.value > LARGEST:
        raise BoundsError(f"the lower bound has more than {MAX_DIGITS} integral digits")
    parts = []
    if lowest.value < 0:  # negative numbers, as magnitudes: the bounds swap sides
        upper = Bound(-lowest.value, lowest.exclusive)
        under = Bound(Decimal(0), True) if highest is None or highest.value >= 0 else \
            Bound(-highest.value, highest.exclusive)
        magnitude = writer.magnitude(under, upper)
        if magnitude:
            parts.append(f'"-" ({magnitude})')
    if highest is None or highest.value > 0 or (highest.value == 0 and not highest.exclusive):
        floor = lowest if lowest.value >= 0 else Bound(Decimal(0))
        magnitude = writer.magnitude(floor, highest)
        if magnitude:
            parts.append(magnitude)
    if not parts:
        raise BoundsError("no number lies between the bounds")
    return " | ".join(f"({part})" for part in parts), writer.rules


class _FractionRules:
    """Writes non-negative numerals between bounds: the integral part by integer_range, the
    fraction digit by digit, one rule per state of the comparison with the bounds' digits."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.rules: dict[str, str] = {}
        self._names: dict[_State, str] = {}

    def magnitude(self, low: Bound, high: Bound | None) -> str:
        """Numerals `I(.F)?` with low <= value <= high (each side as exclusive as it says)."""
        low_int, low_frac = _split(low.value)
        if high is None:
            high_int, high_frac = LARGEST, None
        else:
            high_int, high_frac = _split(high.value)
        strict_low, strict_high = low.exclusive, high is not None and high.exclusive
        alternatives = []
        if low_int == high_int:
            alternatives.append(self._with_fraction(low_int, (low_frac, strict_low),
                                                    (high_frac, strict_high)))
        else:
            alternatives.append(self._with_fraction(low_int, (low_frac, strict_low), (None, False)))
            if low_int + 1 <= high_int - 1:
                alternatives.append(f"({_alternatives(integer_range(low_int + 1, high_int - 1))}) "
                                    f"{self._free_fraction()}")
            if high is not None:
                alternatives.append(self._with_fraction(high_int, ("", False), (high_frac, strict_high)))
            else:
                alternatives.append(f'"{high_int}" {self._free_fraction()}')
        return " | ".join(a for a in alternatives if a)

    def _free_fraction(self) -> str:
        return f'("." {self._state("", False, None, False)})?'

    def _with_fraction(self, integral: int, low: tuple[str, bool], high: tuple[str | None, bool]) -> str:
        """`integral` followed by the fractions that keep the value within the bounds (their
        fraction digits); empty when none does."""
        state = (low[0], low[1], high[0], high[1])
        rest = _next_digits(state)
        bare = _zero_allowed(state)
        if not rest and not bare:
            return ""
        fraction = f'"." ({self._body(rest)})' if rest else ""
        if fraction and bare:
            fraction = f"({fraction})?"
        return f'"{integral}" {fraction}'.strip()

    def _state(self, low: str, strict_low: bool, high: str | None, strict_high: bool) -> str:
        """The rule for digit strings (possibly empty) whose value as a fraction meets the bounds."""
        key = (low, strict_low, high, strict_high)
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = f"{self.prefix}-{len(self._names)}"
            tail = _TAILS.get(key)
            if tail is not None:  # no bound digits left: a bounded run, as the converter's own
                self.rules[name] = tail
                return name
            rest = _next_digits(key)
            body = self._body(rest)
            if _zero_allowed(key):
                body = f"({body})?" if body else '""'
            self.rules[name] = body
        return name

    def _body(self, rest: list[tuple[int, int, _State]]) -> str:
        return " | ".join(f"{_digits(a, b)} {self._state(*state)}" for a, b, state in rest)


def _up_to(item: str, n: int) -> str:
    """`item` 0 to n times, as nested optional groups (GBNF's own `{m,n}` is newer than some
    parsers edgevlm meets)."""
    return f"({item} " * n + ")?" * n if n else '""'


# The states once the bounds have no digits left, where a fraction's rest repeats: any digits;
# digits with one that is not zero (above an exclusive bound); zeros only (at an inclusive upper
# bound). Each is held to MAX_DIGITS digits, as the converter's own decimal part is, so an
# answer ends within its tokens.
_TAILS: dict[_State, str] = {
    ("", False, None, False): _up_to("[0-9]", MAX_DIGITS),
    ("", True, None, False): f'{_up_to(chr(34) + "0" + chr(34), MAX_DIGITS - 1)} [1-9] '
                             f'{_up_to("[0-9]", MAX_DIGITS - 1)}',
    ("", False, "", False): _up_to('"0"', MAX_DIGITS),
}


def _split(value: Decimal) -> tuple[int, str]:
    """A non-negative value as its integral part and its fraction digits (no trailing zeros)."""
    integral = math.floor(value)
    fraction = value - integral
    digits = "" if fraction == 0 else format(fraction, "f").split(".", 1)[1].rstrip("0")
    return integral, digits


def _zero_allowed(state: _State) -> bool:
    """Whether no further digits (the fraction's rest all zeros) meets the bounds."""
    low, strict_low, high, strict_high = state
    return low == "" and not strict_low and not (high == "" and strict_high)


def _next_digits(state: _State) -> list[tuple[int, int, _State]]:
    """The digits that may come next, in runs with the same next state: a fraction's digits
    compare with a bound's as strings do (0.5 > 0.25 as "5" > "25")."""
    low, strict_low, high, strict_high = state
    runs: list[tuple[int, int, _State]] = []
    for digit in range(10):
        if low == "":
            after_low = ("", strict_low and digit == 0)
        elif digit > int(low[0]):
            after_low = ("", False)
        elif digit == int(low[0]):
            after_low = (low[1:], strict_low)
        else:
            continue
        if high is None:
            after_high: tuple[str | None, bool] = (None, False)
        elif high == "":
            if digit > 0 or strict_high:
                continue
            after_high = ("", False)
        elif digit < int(high[0]):
            after_high = (None, False)
        elif digit == int(high[0]):
            after_high = (high[1:], strict_high)
        else:
            continue
        following = (*after_low, *after_high)
        if not _next_digits_exist(following):
            continue
        if runs and runs[-1][2] == following and runs[-1][1] == digit - 1:
            runs[-1] = (runs[-1][0], digit, following)
        else:
            runs.append((digit, digit, following))
    return runs


def _next_digits_exist(state: _State) -> bool:
    """Whether some digit string (maybe empty) meets the bounds from this state."""
    low, strict_low, high, strict_high = state
    if _zero_allowed(state):
        return True
    if high == "":  # only zeros may follow, and zero does not meet the lower bound
        return False
    # Any lower bound below one can be met when the upper is free; else compare the digits
    # (strings of fraction digits without trailing zeros order as their values do).
    if high is None:
        return True
    return low < high if low != high else not (strict_low or strict_high)
