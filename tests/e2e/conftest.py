"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import pytest

from tests.e2e.test_scale_out import Pair
from tests.fakes.fake_llm import FakeLLM


@pytest.fixture
def pair(tmp_path, postgres_url):
    """Servers A and B on one PostgreSQL database with a fake model (test_scale_out.Pair)."""
    with FakeLLM() as fake:
        pair = Pair(tmp_path, postgres_url, fake)
        try:
            yield pair
        finally:
            pair.stop()
