"""Secret values kept out of what a process writes or sends (SPEC §14, §15b): events,
outputs, errors, deliveries, log lines, tracebacks, trace spans and metric labels show
`***` in their place.

Every secret value this process has loaded (an HTTP step reading the ones it names, an
administrator storing one, a provider's API key or an MCP server's header and env values
when they are stored or decrypted for use) is remembered here; `scrub` replaces each
occurrence in a text or, recursively, in a JSON value, and the log filter applies it to
every record. An occurrence is the value as it is or percent-encoded, wholly or in part
(`%2F` or `%2f` for `/`, UTF-8 bytes for other characters), with `+` or `%20` for a space
(form encoding): what a URL, a query string or an echoing server makes of it.
Values shorter than MIN_LENGTH are refused at entry (a two-letter secret would turn
half the words of a log into `***`); credentials that nobody checked at entry (an MCP
server's `env`, which also holds plain settings such as `info` or `true`) are
remembered from CREDENTIAL_MIN_LENGTH characters on. The set is bounded: the oldest values go first.
"""

from __future__ import annotations

import functools
import re
from collections import OrderedDict
from typing import Any

MASK = "***"
MIN_LENGTH = 4
CREDENTIAL_MIN_LENGTH = 8  # MCP header and env values, provider keys: shorter ones are not hidden


def remember_credentials(values: Any) -> None:
    """Provider API keys, MCP servers' header and env values (SPEC §15b), from the moment
    they are stored or read for use: hidden in every event, error, delivery and log line."""
    found = []
    for value in values:
        if isinstance(value, str):
            found.append(value)
            scheme, _, credential = value.partition(" ")
            if credential and scheme.isalpha():  # `Bearer <token>`: the token is quoted alone too
                found.append(credential.strip())
    remember(found, min_length=CREDENTIAL_MIN_LENGTH)
_KEPT = 10_000  # values remembered at most, per process

_known: OrderedDict[str, None] = OrderedDict()
_pattern: re.Pattern[str] | None = None


def remember(values: Any, *, min_length: int = MIN_LENGTH) -> None:
    """Add secret values (an iterable of strings) to what this process redacts; values
    shorter than `min_length` (never below MIN_LENGTH) are left out."""
    global _pattern
    changed = False
    for value in values:
        if isinstance(value, str) and len(value) >= max(min_length, MIN_LENGTH):
            if value in _known:
                _known.move_to_end(value)
                continue
            _known[value] = None
            changed = True
            while len(_known) > _KEPT:
                _known.popitem(last=False)
    if changed:
        _pattern = None


def forget(value: str) -> None:
    """A deleted or replaced secret's old value: nothing new will carry it."""
    global _pattern
    if _known.pop(value, False) is None:
        _pattern = None


def _hex(digit: int) -> str:
    shown = f"{digit:X}"
    return shown if shown.isdigit() else f"[{shown}{shown.lower()}]"


def _char(ch: str) -> str:
    """A pattern for one character of a value: itself or its percent-encoding (a space
    also as `+`); letters and digits, which no encoder changes, as themselves."""
    if ch.isascii() and ch.isalnum():
        return ch
    encoded = "".join(f"%{_hex(b >> 4)}{_hex(b & 15)}" for b in ch.encode("utf-8", "surrogatepass"))
    forms = [re.escape(ch), encoded] + (["\\+"] if ch == " " else [])
    return "(?:" + "|".join(forms) + ")"


@functools.lru_cache(maxsize=4096)
def value_pattern(value: str) -> str:
    """The pattern of every written form of `value` (see the module)."""
    return "".join(_char(ch) for ch in value)


def _join(values: list[str]) -> re.Pattern[str]:
    return re.compile("|".join(value_pattern(v) for v in sorted(values, key=len, reverse=True)))


@functools.lru_cache(maxsize=256)
def _given(values: tuple[str, ...]) -> re.Pattern[str] | None:
    usable = [v for v in set(values) if isinstance(v, str) and len(v) >= MIN_LENGTH]
    return _join(usable) if usable else None


def _compiled(values: tuple[str, ...] | None) -> re.Pattern[str] | None:
    global _pattern
    if values is not None:
        return _given(tuple(values))
    if _pattern is None and _known:
        _pattern = _join(list(_known))
    return _pattern


def contains(text: str, value: str) -> bool:
    """Whether `text` holds `value` in any written form (see the module)."""
    return isinstance(text, str) and re.search(value_pattern(value), text) is not None


def scrub_text(text: str, values: tuple[str, ...] | None = None) -> str:
    """`text` with every secret (those given, else every one this process knows) as ***."""
    pattern = _compiled(values)
    if pattern is None or not isinstance(text, str):
        return text
    return pattern.sub(MASK, text)


def scrub(value: Any, values: tuple[str, ...] | None = None) -> Any:
    """A JSON value with every secret in its strings (keys included) as ***."""
    pattern = _compiled(values)
    if pattern is None:
        return value
    return _walk(value, pattern)


def _walk(value: Any, pattern: re.Pattern[str]) -> Any:
    if isinstance(value, str):
        return pattern.sub(MASK, value)
    if isinstance(value, dict):
        return {_walk(k, pattern): _walk(v, pattern) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(v, pattern) for v in value]
    return value


def known() -> bool:
    return bool(_known)


def scrub_record(record: Any) -> None:
    """A log record with every known secret as *** (its message, arguments merged, and
    the text of its exception)."""
    if not _known:
        return
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a record whose arguments do not fit stays as it is
        return
    cleaned = scrub_text(message)
    if cleaned != message:
        record.msg, record.args = cleaned, None
    if record.exc_info:
        import traceback

        text = "".join(traceback.format_exception(*record.exc_info))
        cleaned = scrub_text(text)
        if cleaned != text:
            record.exc_info, record.exc_text = None, cleaned.rstrip("\n")
    for key in ("request", "host"):
        extra = getattr(record, key, None)
        if isinstance(extra, str):
            setattr(record, key, scrub_text(extra))
