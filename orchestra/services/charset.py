"""Character rules of names, stated once for the services and the OpenAPI document.

A display name may not hold a control or format character (Unicode categories Cc and
Cf, as of Unicode 14, the data of Python 3.11): `CONTROL_RANGES` lists them, the
services check with `has_control` and the document publishes the same ranges as a
pattern, so the two cannot disagree. White space is what Python's `str.strip()` removes.

`char_class` writes ranges as a regular-expression class that ECMA-262 (with the `u`
flag, as JSON Schema 2020-12 asks) and Python both read: BMP characters as `\\uXXXX`,
others as the characters themselves.
"""

from __future__ import annotations

import functools
import re
import unicodedata

# Unicode 14.0 Cc and Cf: C0, DEL and C1 controls; soft hyphen, Arabic and Syriac marks,
# zero-width and bidirectional controls, invisible operators, BOM, interlinear
# annotation, Kaithi, Egyptian, shorthand and musical format characters, tags.
CONTROL_RANGES: tuple[tuple[int, int], ...] = (
    (0x0000, 0x001F), (0x007F, 0x009F), (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C),
    (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2), (0x180E, 0x180E),
    (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x13438),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)
# What str.isspace() (and so str.strip()) counts as white space.
SPACE_RANGES: tuple[tuple[int, int], ...] = (
    (0x0009, 0x000D), (0x001C, 0x0020), (0x0085, 0x0085), (0x00A0, 0x00A0), (0x1680, 0x1680),
    (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000),
)


def _char(code: int) -> str:
    return f"\\u{code:04x}" if code <= 0xFFFF else chr(code)


def char_class(ranges: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> str:
    """The inside of a `[...]` class matching exactly the code points of `ranges`."""
    return "".join(_char(a) if a == b else f"{_char(a)}-{_char(b)}" for a, b in ranges)


CONTROL = re.compile(f"[{char_class(CONTROL_RANGES)}]")
SPACE = f"[{char_class(SPACE_RANGES)}]"


def has_control(text: str) -> bool:
    """Whether `text` holds a control or format character (CONTROL_RANGES)."""
    return CONTROL.search(text) is not None


def code_ranges(wanted) -> list[tuple[int, int]]:
    """The code points (surrogates aside) for which `wanted(character)` holds, as ranges."""
    found: list[tuple[int, int]] = []
    start = None
    for code in range(0x110000):
        ok = not 0xD800 <= code <= 0xDFFF and wanted(chr(code))
        if ok and start is None:
            start = code
        elif not ok and start is not None:
            found.append((start, code - 1))
            start = None
    if start is not None:
        found.append((start, 0x10FFFF))
    return found


@functools.cache
def nfkc_class(allowed: str) -> str:
    """A class of the characters whose NFKC form is one character matching the regular
    expression class `allowed` (e.g. `[\\w.@-]`): computed once from this Python's data."""
    one = re.compile(allowed)

    def wanted(ch: str) -> bool:
        form = unicodedata.normalize("NFKC", ch)
        return len(form) == 1 and one.fullmatch(form) is not None

    return char_class(code_ranges(wanted))
