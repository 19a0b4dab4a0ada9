"""USD amounts: exact `Decimal`s, read from numbers or strings, answered as strings.

Budgets and spending are also kept in the store as whole pico-dollars (10^-12 USD,
`to_pico`), so that PostgreSQL and SQLite both add and compare them exactly in one
conditional statement; a call's share is rounded *up* there, so the ledger never shows
less than was spent.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any

from orchestra.errors import ValidationError

PICO = Decimal(10) ** 12
#: The largest amount accepted anywhere (a budget, a top-up, a price per million tokens).
MAX_USD = Decimal(1_000_000)


# What the documents (the OpenAPI document, the language's schema) say an amount is: a
# number or a plain decimal string of at most six integer digits (parse_usd reads more).
_USD_TEXT = r"^[0-9]{1,6}(\.[0-9]{1,20})?$"
USD_JSON_SCHEMA: dict = {"anyOf": [
    {"type": "number", "minimum": 0, "maximum": 1_000_000},
    {"type": "string", "pattern": _USD_TEXT},
]}
POSITIVE_USD_JSON_SCHEMA: dict = {"anyOf": [
    {"type": "number", "exclusiveMinimum": 0, "maximum": 1_000_000},
    {"type": "string", "pattern": r"^([1-9][0-9]{0,5}(\.[0-9]{1,20})?|0{0,6}\.[0-9]{0,19}[1-9][0-9]{0,19})$"},
]}


def parse_usd(value: Any, field: str, *, allow_zero: bool = True) -> Decimal:
    """A non-negative amount from a JSON number or a decimal string; 422 naming `field`
    for anything else (a bool, NaN, infinity, a negative, too large)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise ValidationError.field(field, "must be a non-negative number or a decimal string")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValidationError.field(field, "must be a finite number")
    text = str(value).strip() if not isinstance(value, float) else repr(value)
    if len(text) > 64:
        raise ValidationError.field(field, "must be at most 64 characters long")
    try:
        amount = Decimal(text)
    except InvalidOperation:
        raise ValidationError.field(field, "must be a non-negative number or a decimal string") from None
    if not amount.is_finite():
        raise ValidationError.field(field, "must be a finite number")
    if amount < 0:
        raise ValidationError.field(field, "must not be negative")
    if amount == 0 and not allow_zero:
        raise ValidationError.field(field, "must be greater than 0")
    if amount > MAX_USD:
        raise ValidationError.field(field, f"must be at most {MAX_USD}")
    return amount


def usd_text(amount: Decimal | None) -> str | None:
    """An amount as the API answers it: a plain decimal string (no exponent), or None."""
    if amount is None:
        return None
    text = format(amount, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text or "0"


def read_usd(text: str | None) -> Decimal | None:
    """A stored amount (decimal text) back as a Decimal; None stays None."""
    return None if text is None else Decimal(text)


def to_pico(amount: Decimal, *, up: bool = True) -> int:
    """Whole pico-dollars: rounded up (spending, reservations) or down (budgets)."""
    return int((amount * PICO).to_integral_value(ROUND_CEILING if up else ROUND_FLOOR))


def from_pico(pico: int | None) -> Decimal | None:
    return None if pico is None else Decimal(pico) / PICO
