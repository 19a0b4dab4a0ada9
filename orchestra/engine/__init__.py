"""Workflow engine: run executor, event log, LLM clients and tools."""
