"""Signed-in callers shared by the route tests of the agent platform."""

import pytest


@pytest.fixture
async def admin(users):
    """An ADMINISTRATOR, logged in (see tests/conftest.Users.make)."""
    return await users.make("admin", "ADMINISTRATOR")


@pytest.fixture
async def user(users):
    """A plain USER, logged in."""
    return await users.make("plainuser", "USER")
