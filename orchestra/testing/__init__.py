"""Development tools shipped with the package: not used by the server itself.

`orchestra.testing.fake_llm` is a small OpenAI-compatible model server that streams
scripted or echoed answers, for tests, benchmarks and trying runs without an API key.
"""
