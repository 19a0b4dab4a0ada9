"""A new terminal has no virtual environment: wherever README or examples/README sends
the reader to another terminal, the same paragraph says to activate it there (issue 39,
point 10: `orchestra` is not found otherwise)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("doc", ["README.md", "examples/README.md"])
def test_each_other_terminal_is_told_to_activate_the_environment(doc):
    paragraphs = re.split(r"\n\s*\n", (ROOT / doc).read_text(encoding="utf-8"))
    sent = [p for p in paragraphs if re.search(r"(another|second|other|new) terminal", p, re.I)]
    assert sent, f"{doc} no longer mentions another terminal: drop this test's case"
    missing = [p for p in sent if "activate" not in p]
    assert missing == [], missing
