"""Kubernetes resource quantities in their canonical form.

The apiserver stores every quantity it accepts in canonical form: ``81920Mi``
comes back as ``80Gi``, ``1000`` as ``1k``. A slice we compare with its
stored copy must therefore say the canonical string too, or the publisher
sees a difference that no write can remove and rewrites the pool forever.
:func:`canonical` implements ``resource.Quantity``'s canonical formatting
(``CanonicalizeBytes`` in k8s.io/apimachinery) for the two formats we
produce, decimal SI (``132``, ``1500m``, ``12k``) and binary SI (``Mi``,
``Gi``, ...); the device model applies it to every capacity and counter it
serialises. The exponent form (``1e3``) is refused: we never write it.

The rules, as the apiserver applies them:
- a binary-SI value below 1024 in magnitude, or not a whole number, is
  written in decimal SI (``0.5Ki`` -> ``512``);
- otherwise binary SI with the largest power of 1024 that divides it
  (``81920Mi`` -> ``80Gi``, ``9856Mi`` stays, ``1536`` stays);
- decimal SI: all factors of ten are taken out, then the exponent is
  lowered to a multiple of three (``1500`` stays, ``12000`` -> ``12k``,
  ``1.5`` -> ``1500m``); precision below nano is rounded up.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIX = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
_DECIMAL_SUFFIX = {e: s for s, e in _DECIMAL.items()}
_NANO = Fraction(1, 10**9)


def parse(text: str) -> tuple[Fraction, bool]:
    """The value of a quantity and whether it is written in binary SI."""
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a quantity in decimal or binary SI form")
    value = Fraction(match["number"])
    suffix = match["suffix"]
    binary = suffix in _BINARY
    value *= 2 ** _BINARY[suffix] if binary else Fraction(10) ** _DECIMAL[suffix]
    return (-value if match["sign"] == "-" else value), binary


def canonical(text: str) -> str:
    """``text`` as the apiserver stores it (``81920Mi`` -> ``80Gi``)."""
    value, binary = parse(text)
    if value == 0:
        return "0"
    sign, magnitude = ("-" if value < 0 else ""), abs(value)
    if binary and magnitude >= 1024 and magnitude.denominator == 1:
        amount, power = magnitude.numerator, 0
        while amount % 1024 == 0 and power < len(_BINARY_SUFFIX) - 1:
            amount, power = amount // 1024, power + 1
        return f"{sign}{amount}{_BINARY_SUFFIX[power]}"
    # Decimal SI, at nano precision at most (rounded up, away from zero).
    nanos = math.ceil(magnitude / _NANO)
    amount, exponent = nanos, -9
    while amount % 10 == 0:
        amount, exponent = amount // 10, exponent + 1
    while exponent % 3 != 0:
        amount, exponent = amount * 10, exponent - 1
    if exponent not in _DECIMAL_SUFFIX:  # beyond exa the apiserver writes an exponent
        raise ValueError(f"{text!r} is too large for a decimal SI suffix")
    return f"{sign}{amount}{_DECIMAL_SUFFIX[exponent]}"


def problem(text: str) -> str | None:
    """Why ``text`` cannot be published as a quantity, or None."""
    try:
        canonical(text)
    except ValueError as exc:
        return str(exc)
    return None


def of_bytes(n: int) -> str:
    """A byte count as a quantity: binary SI when it is whole KiB (``64Gi``), else decimal."""
    return canonical(f"{n // 1024}Ki" if n and n % 1024 == 0 else str(n))
