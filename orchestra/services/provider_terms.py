"""A provider's money terms (SPEC §12): its `prices` override and its `limits`.

`prices`: `{input_per_mtok, output_per_mtok, cached_input_per_mtok}` in USD per million
tokens, numbers or decimal strings, stored as exact decimal text (input and output are
required; cached input defaults to the input price). `limits`: `{requests_per_minute,
tokens_per_minute, max_concurrency}`, positive whole numbers (each optional). Null
removes either. A negative, non-numeric or unknown value is a 422 naming the field.
"""

from __future__ import annotations

from typing import Any

from orchestra.errors import ValidationError
from orchestra.money.amounts import parse_usd, usd_text
from orchestra.money.prices import find_price

PRICE_FIELDS = ("input_per_mtok", "output_per_mtok", "cached_input_per_mtok")
LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "max_concurrency")
LIMIT_MAX = 1_000_000_000


def clean_prices(value: Any) -> dict[str, str] | None:
    """The stored form of a `prices` object (None removes the override)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValidationError.field("prices", "must be an object or null")
    unknown = sorted(set(value) - set(PRICE_FIELDS))
    if unknown:
        raise ValidationError.field(f"prices.{unknown[0][:64]}", "is not a price field; "
                                    f"the fields are {', '.join(PRICE_FIELDS)}")
    cleaned: dict[str, str] = {}
    for name in PRICE_FIELDS:
        if value.get(name) is not None:
            cleaned[name] = usd_text(parse_usd(value[name], f"prices.{name}"))
    for name in PRICE_FIELDS[:2]:
        if name not in cleaned:
            raise ValidationError.field(f"prices.{name}", "is required when prices are given")
    return cleaned


def clean_limits(value: Any) -> dict[str, int] | None:
    """The stored form of a `limits` object (None, or no field set, removes the limits)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValidationError.field("limits", "must be an object or null")
    unknown = sorted(set(value) - set(LIMIT_FIELDS))
    if unknown:
        raise ValidationError.field(f"limits.{unknown[0][:64]}", "is not a limit; "
                                    f"the limits are {', '.join(LIMIT_FIELDS)}")
    cleaned: dict[str, int] = {}
    for name in LIMIT_FIELDS:
        item = value.get(name)
        if item is None:
            continue
        if isinstance(item, bool) or not isinstance(item, int | float) or item != int(item):
            raise ValidationError.field(f"limits.{name}", "must be a whole number")
        if not 1 <= item <= LIMIT_MAX:
            raise ValidationError.field(f"limits.{name}", f"must be between 1 and {LIMIT_MAX}")
        cleaned[name] = int(item)
    return cleaned or None


def price_view(kind: str, model_id: str, base_url: str | None,
               prices: dict[str, Any] | None) -> dict[str, Any]:
    """What a provider answers about its prices: the override as stored (or null), and
    the price that applies now with where it comes from (`provider`, `genai-prices`),
    or null when its model has no known price."""
    known = find_price(kind=kind, model=model_id, base_url=base_url, prices=prices)
    return {
        "prices": prices,
        "price": None if known is None else {
            **known.as_dict(), "source": "provider" if prices else "genai-prices"},
    }
