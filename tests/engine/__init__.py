"""Tests for orchestra.engine."""
