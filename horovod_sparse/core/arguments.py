"""Checks of user-given arguments, alike everywhere: a value of the wrong type
raises ``TypeError``, a value of the right type out of its range ``ValueError``;
both name the argument.  ``True``/``False`` are not numbers here."""

import math
import numbers


def _require(name, value, kind, expected):
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {expected}, got {value!r}")


def check_integer(name, value, minimum=1, allow_none=False):
    """``value`` as an ``int`` of at least ``minimum`` (or ``None`` where allowed)."""
    if value is None and allow_none:
        return None
    expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    or_none = " or None" if allow_none else ""
    _require(name, value, numbers.Integral, f"{expected}{or_none}")
    if value < minimum:
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def check_number(name, value, low=0.0, high=math.inf, closed=(False, True), allow_none=False):
    """``value`` as a ``float`` in the interval from ``low`` to ``high``, each end
    included where ``closed`` says (default ``(low, high]``); NaN is out of range."""
    if value is None and allow_none:
        return None
    interval = f"{'[' if closed[0] else '('}{low:g}, {high:g}{']' if closed[1] else ')'}"
    or_none = " or None" if allow_none else ""
    _require(name, value, numbers.Real, f"a number in {interval}{or_none}")
    above = value >= low if closed[0] else value > low
    below = value <= high if closed[1] else value < high
    if not (above and below):
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return float(value)


def check_bool(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_choice(name, value, choices):
    """``value`` if it is one of ``choices``, else a ``ValueError`` naming ``name``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_density(density):
    return check_number("density", density, 0.0, 1.0)


def check_momentum(momentum):
    return check_number("momentum", momentum, 0.0, 1.0, closed=(True, False))
