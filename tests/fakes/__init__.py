"""Test doubles shared by every test package."""
