"""One user's `/mcp` session openings are served `OPENINGS_PER_USER` at a time
(web/mcp_server.py `PerUserTurns`): a user opening sessions in a loop from many
connections waits for its own turns, and never for another user's."""

from __future__ import annotations

import asyncio

from orchestra.web.mcp_server import PerUserTurns


async def test_a_users_openings_past_the_width_wait_and_another_user_never_does():
    turns = PerUserTurns(2)
    release = asyncio.Event()
    inside: list[str] = []

    async def opening(user: str, name: str) -> None:
        async with turns.turn(user):
            inside.append(name)
            await release.wait()

    alices = [asyncio.create_task(opening("alice", f"a{n}")) for n in range(4)]
    await asyncio.sleep(0.01)
    assert inside == ["a0", "a1"]  # the other two wait their turn
    bob = asyncio.create_task(opening("bob", "b0"))
    await asyncio.sleep(0.01)
    assert inside == ["a0", "a1", "b0"]  # bob is served at once
    release.set()
    await asyncio.gather(*alices, bob)
    assert sorted(inside) == ["a0", "a1", "a2", "a3", "b0"]
    assert turns._gates == {}  # nobody waiting or served: nothing is kept


async def test_a_cancelled_wait_leaves_the_turns_as_they_were():
    turns = PerUserTurns(1)
    release = asyncio.Event()

    async def hold() -> None:
        async with turns.turn("alice"):
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(hold())
    await asyncio.sleep(0.01)
    waiter.cancel()  # the client hung up while waiting
    await asyncio.gather(waiter, return_exceptions=True)
    release.set()
    await holder
    assert turns._gates == {}

