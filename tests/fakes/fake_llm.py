"""The fake OpenAI-compatible server for tests (`from tests.fakes.fake_llm import FakeLLM`).

The `fake_llm` fixture (one running `FakeLLM`) is tests/conftest.py's, so every test
package has it. The implementation lives in `orchestra.testing.fake_llm` so
`examples/fake_llm.py` can share it.
"""

from __future__ import annotations

from orchestra.testing.fake_llm import FakeLLM, RecordedRequest, ScriptedReply

__all__ = ["FakeLLM", "RecordedRequest", "ScriptedReply"]
