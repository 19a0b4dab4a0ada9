"""Model prices and what a call costs (SPEC §12).

Prices come from `genai-prices` (Pydantic's maintained price database: prices as
`Decimal`s, matched by provider and model id, with price tiers and time-of-day prices),
from its bundled snapshot (orchestra never fetches price updates at run time: a new
package version brings new prices). A provider's own `prices` override it. A model the
database does not know, and no override, has no price: its calls cost `None`, never 0.

A call's cost: (prompt − cached) × input + cached × cached_input + completion × output,
per million tokens, computed with `Decimal` (no rounding).
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

MTOK = Decimal(1_000_000)
#: genai-prices' provider ids for orchestra's provider kinds; an `openai_compatible`
#: provider is matched by its base URL (OpenRouter, Groq, Together… are known by URL),
#: an `ollama` one runs locally and has no price unless given one.
KIND_PROVIDER = {"openai": "openai", "anthropic": "anthropic", "deepseek": "deepseek"}
_EXACT = decimal.Context(prec=80)


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens."""

    input: Decimal
    output: Decimal
    cached_input: Decimal

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Decimal:
        """The exact cost of one call's usage; cached tokens are part of the prompt."""
        cached = min(max(int(cached_tokens or 0), 0), max(int(prompt_tokens), 0))
        uncached = max(int(prompt_tokens), 0) - cached
        with decimal.localcontext(_EXACT):
            total = (uncached * self.input + cached * self.cached_input
                     + max(int(completion_tokens), 0) * self.output)
            return total / MTOK

    def as_dict(self) -> dict[str, str]:
        from orchestra.money.amounts import usd_text

        return {"input_per_mtok": usd_text(self.input), "output_per_mtok": usd_text(self.output),
                "cached_input_per_mtok": usd_text(self.cached_input)}


def override_price(prices: dict[str, Any] | None) -> Price | None:
    """A provider's stored `prices` (decimal strings) as a Price; cached input defaults
    to the input price."""
    if not prices or prices.get("input_per_mtok") is None or prices.get("output_per_mtok") is None:
        return None
    cached = prices.get("cached_input_per_mtok")
    return Price(Decimal(prices["input_per_mtok"]), Decimal(prices["output_per_mtok"]),
                 Decimal(cached if cached is not None else prices["input_per_mtok"]))


def load_prices() -> None:
    """Read genai-prices' bundled snapshot now: the first read costs ~0.5 s of CPU (it
    imports and validates the whole price table). A server calls this in a thread while
    it starts, so no request or step pays it on the event loop (it stalled every other
    request for as long the first time a provider was created or priced)."""
    from genai_prices import data_snapshot

    data_snapshot.get_snapshot()


@functools.lru_cache(maxsize=1024)
def _model_info(kind: str, model: str, base_url: str | None) -> Any:
    """genai-prices' model entry for this provider kind and model id, or None."""
    from genai_prices import data_snapshot

    snapshot = data_snapshot.get_snapshot()
    provider_id = KIND_PROVIDER.get(kind)
    if provider_id is None and not (kind == "openai_compatible" and base_url):
        return None
    try:
        if provider_id is not None:
            _provider, info = snapshot.find_provider_model(model, None, provider_id, None)
        else:
            _provider, info = snapshot.find_provider_model(model, None, None, base_url)
    except (LookupError, ValueError):
        return None
    return info


def _at(value: Any, prompt_tokens: int) -> Decimal | None:
    """A per-MTok price, resolving a tiered one by the prompt's size (the cliff model:
    past a tier's start, every token pays the tier's price)."""
    if value is None or isinstance(value, Decimal):
        return value
    tiers = getattr(value, "tiers", None)
    if tiers is None:
        return None
    price = value.base
    for tier in sorted(tiers, key=lambda t: t.start):
        if prompt_tokens > tier.start:
            price = tier.price
    return price


def find_price(
    *, kind: str, model: str, base_url: str | None = None, prices: dict[str, Any] | None = None,
    when: dt.datetime | None = None, prompt_tokens: int = 0,
) -> Price | None:
    """The price of one call to `model` on a provider of `kind` (its `prices` override
    first), at `when` (UTC) for a prompt of `prompt_tokens`; None when unknown."""
    own = override_price(prices)
    if own is not None:
        return own
    info = _model_info(kind, (model or "").strip(), base_url)
    if info is None:
        return None
    try:
        table = info.get_prices(when or dt.datetime.now(dt.UTC))
    except Exception:  # noqa: BLE001 - a malformed entry is an unknown price
        return None
    input_price = _at(getattr(table, "input_mtok", None), prompt_tokens)
    output_price = _at(getattr(table, "output_mtok", None), prompt_tokens)
    if input_price is None or output_price is None:
        return None
    cached = _at(getattr(table, "cache_read_mtok", None), prompt_tokens)
    return Price(input_price, output_price, cached if cached is not None else input_price)
