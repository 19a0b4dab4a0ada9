"""The event log: store-then-publish, per-run seq, gap-free resume, overflow, polling."""

from __future__ import annotations

import asyncio

import pytest

from orchestra.db.models import RunEvent, WorkflowRun
from orchestra.engine.events import PING, EventLog, RunGone, RunWriter, TokenCoalescer
from orchestra.services import auth


@pytest.fixture
async def run_id(core) -> str:
    user = await auth.register(core, user_name="eve", password="password-123")
    run = await WorkflowRun.acreate(owner=user.id, template_name="t", steps=[], status="running")
    return run.trace_id


async def stored_seqs(core, trace_id):
    rows = await core.db.list(RunEvent.select().where(RunEvent.run == trace_id).order_by(RunEvent.seq))
    return [r.seq for r in rows]


async def test_append_numbers_and_stores_before_publishing(core, run_id):
    log = EventLog(core.db)
    sub = log.subscribe(run_id)
    first = await log.append(run_id, "run_started", {"status": "running"})
    second = await log.append(run_id, "step_started", {"prompt": "p"}, step_id="a")
    assert (first.seq, second.seq) == (1, 2)
    assert second.data["step_id"] == "a" and second.data["trace_id"] == run_id
    assert second.data["seq"] == 2 and second.data["ts"].endswith("Z")
    got = sub.queue.get_nowait()
    assert got.seq == 1 and await stored_seqs(core, run_id) == [1, 2]  # stored when published
    assert second.frame().startswith(b"id: 2\nevent: step_started\ndata: {")
    assert second.frame().endswith(b"\n\n")
    with pytest.raises(ValueError):
        await log.append(run_id, "not_a_kind")


async def test_two_logs_on_one_store_never_reuse_a_seq(core, run_id):
    """Like two server processes: the unique (run, seq) index makes the loser re-read."""
    one, two = EventLog(core.db), EventLog(core.db)
    await one.append(run_id, "run_started")
    await two.append(run_id, "step_started", step_id="a")
    await one.append(run_id, "token", {"text": "x"}, step_id="a")  # one's cached seq is stale
    assert await stored_seqs(core, run_id) == [1, 2, 3]


async def test_append_to_a_deleted_or_ended_run_raises_run_gone(core, run_id):
    log = EventLog(core.db)
    await log.append(run_id, "run_cancelled", {"status": "cancelled"})
    with pytest.raises(RunGone):
        # a second process whose seq collides finds the terminal event
        stale = EventLog(core.db)
        stale._last[run_id] = 0
        await stale.append(run_id, "token", {"text": "late"})
    with pytest.raises(RunGone):
        await EventLog(core.db).append("no-such-run", "run_started")


async def collect(agen, n=None, timeout=5.0):
    out = []

    async def run():
        async for item in agen:
            out.append(item)
            if n is not None and len(out) >= n:
                break

    await asyncio.wait_for(run(), timeout)
    return out


async def test_follow_replays_then_goes_live_without_gap_or_duplicate(core, run_id):
    log = EventLog(core.db)
    for i in range(3):
        await log.append(run_id, "token", {"text": str(i)}, step_id="a")
    stream = log.follow(run_id, after=1)

    async def writer():
        await asyncio.sleep(0.05)
        for i in range(3):
            await log.append(run_id, "token", {"text": f"live{i}"}, step_id="a")
        await log.append(run_id, "run_finished", {"status": "succeeded"})

    task = asyncio.create_task(writer())
    got = await collect(stream)
    await task
    assert [e.seq for e in got] == [2, 3, 4, 5, 6, 7]
    assert got[-1].kind == "run_finished"
    assert log.subscriber_count(run_id) == 0  # unsubscribed when the stream ended


async def test_a_full_subscriber_is_dropped_and_catches_up_from_the_store(core, run_id):
    log, writer = EventLog(core.db, queue_size=2), EventLog(core.db)
    it = log.follow(run_id).__aiter__()
    waiter = asyncio.create_task(it.__anext__())
    await asyncio.sleep(0.05)  # the stream has subscribed and waits
    (sub,) = log._subs[run_id]
    stored = [await writer.append(run_id, "token", {"text": str(i)}) for i in range(10)]
    stored.append(await writer.append(run_id, "run_finished", {"status": "succeeded"}))
    for event in stored:  # a burst with no await in between: the queue overflows
        log.publish(event, run_id)
    assert sub.dropped and sub not in log._subs.get(run_id, ())
    got = [await waiter]
    async for event in it:
        got.append(event)
    assert [e.seq for e in got] == list(range(1, 12))


async def test_follow_polls_the_store_when_the_run_executes_elsewhere(core, run_id):
    here, elsewhere = EventLog(core.db), EventLog(core.db)
    stream = here.follow(run_id, is_live=lambda: False, poll_every=0.05)

    async def other_process():
        await asyncio.sleep(0.05)
        await elsewhere.append(run_id, "run_started")
        await asyncio.sleep(0.1)
        await elsewhere.append(run_id, "run_failed", {"status": "interrupted"})

    task = asyncio.create_task(other_process())
    got = await collect(stream, timeout=3)
    await task
    assert [e.kind for e in got] == ["run_started", "run_failed"]


async def test_follow_pings_when_idle(core, run_id):
    log = EventLog(core.db)
    got = await collect(log.follow(run_id, ping_every=0.05), n=2, timeout=2)
    assert got == [PING, PING]


async def test_coalescer_batches_and_keeps_order():
    emitted: list[str] = []

    async def emit(text):
        await asyncio.sleep(0.001)
        emitted.append(text)

    coalescer = TokenCoalescer(emit, interval=0.03)
    for i in range(5):
        coalescer.add(f"{i}")
    await asyncio.sleep(0.06)  # the timer flushed the first batch
    coalescer.add("5")
    coalescer.add("6")
    await coalescer.flush()
    assert emitted == ["01234", "56"]
    await coalescer.flush()
    assert emitted == ["01234", "56"]


async def test_many_waiting_streams_do_not_drain_the_connection_pool(core, run_id):
    """pwasyncio binds a pooled connection to each task; followers must give theirs back."""
    log = EventLog(core.db)
    await log.append(run_id, "run_started")
    streams = [asyncio.create_task(collect(log.follow(run_id), timeout=8)) for _ in range(30)]
    await asyncio.sleep(0.3)  # 30 tasks waiting > the pool's 8 connections
    finished = await asyncio.wait_for(
        asyncio.create_task(log.append(run_id, "run_finished", {"status": "succeeded"})), 3
    )
    results = await asyncio.gather(*streams)
    assert all([e.seq for e in got] == [1, finished.seq] for got in results)


async def test_a_caught_up_reader_gets_live_events_through_its_sink_once_and_in_order(core, run_id):
    log = EventLog(core.db)
    for i in range(3):
        await log.append(run_id, "token", {"text": str(i)}, step_id="a")
    written: list[bytes] = []
    stream = log.follow(run_id, after=1)
    stream.sink = lambda event: written.append(event.chunk()) or True

    async def writer():
        await asyncio.sleep(0.05)  # the reader has replayed 2..3 and waits
        (sub,) = log._subs[run_id]
        assert sub.sink is not None  # live events now bypass the reader's queue
        for i in range(3):
            await log.append(run_id, "token", {"text": f"live{i}"}, step_id="a")
        await log.append(run_id, "run_finished", {"status": "succeeded"})

    task = asyncio.create_task(writer())
    replayed = await collect(stream)
    await task
    assert [e.seq for e in replayed] == [2, 3]  # the catch-up came through the iterator
    stored = await log.stored(run_id, after=3)
    assert written == [e.chunk() for e in stored]  # 4..7, each once, the terminal one last
    assert written[0].startswith(b"%x\r\nid: 4\nevent: token\n" % len(stored[0].frame()))
    assert log.subscriber_count(run_id) == 0


async def test_a_sink_that_refuses_drops_the_reader_which_catches_up_from_the_store(core, run_id):
    log = EventLog(core.db)
    seen: list[int] = []
    refuse = {5}  # the sink refuses event 5 once (a slow socket)

    def sink(event):
        if event.seq in refuse:
            refuse.discard(event.seq)
            return False
        seen.append(event.seq)
        return True

    stream = log.follow(run_id)
    stream.sink = sink

    async def writer():
        await asyncio.sleep(0.05)
        for i in range(8):
            await log.append(run_id, "token", {"text": str(i)})
        await log.append(run_id, "run_finished", {"status": "succeeded"})

    task = asyncio.create_task(writer())
    through_iterator = []
    async for event in stream:  # what the stream writer sends, in the order it sends it
        through_iterator.append(event.seq)
        seen.append(event.seq)
    await task
    # 1..4 live through the sink; 5 refused, then replayed from the store; never twice.
    assert seen[:4] == [1, 2, 3, 4] and through_iterator[0] == 5
    assert seen == list(range(1, 10))


async def test_a_sink_reader_pings_when_idle(core, run_id):
    log = EventLog(core.db)
    stream = log.follow(run_id, ping_every=0.05)
    stream.sink = lambda event: True
    assert await collect(stream, n=2, timeout=2) == [PING, PING]
    (sub,) = log._subs[run_id]
    assert sub.sink is not None
    await stream.aclose()
    assert log.subscriber_count(run_id) == 0


async def test_run_writer_applies_writes_in_submit_order_without_making_the_caller_wait(core, run_id):
    log, writes, done = EventLog(core.db), RunWriter(), []

    async def slow(name):
        await asyncio.sleep(0.05)
        done.append(name)

    began = asyncio.get_running_loop().time()
    writes.submit(slow, "first")
    writes.submit(log.append, run_id, "run_started")
    last = writes.submit(log.append_many, run_id, [("token", {"text": "a"}, "s"), ("token", {"text": "b"}, "s")])
    assert asyncio.get_running_loop().time() - began < 0.01  # submitting never waits
    assert await stored_seqs(core, run_id) == []
    await writes.drain()
    assert done == ["first"]
    assert [e.seq for e in last.result()] == [2, 3]
    assert await stored_seqs(core, run_id) == [1, 2, 3]


async def test_run_writer_stops_at_the_first_failed_write_and_raises_it(core, run_id):
    log, writes = EventLog(core.db), RunWriter()
    writes.submit(log.append, run_id, "run_started")
    failed = writes.submit(log.append, "no-such-run", "run_started")  # RunGone
    skipped = writes.submit(log.append, run_id, "token", {"text": "x"})
    await writes.settle()
    assert await stored_seqs(core, run_id) == [1]  # the write after the failure was skipped
    for future in (failed, skipped):
        with pytest.raises(RunGone):
            await future
    with pytest.raises(RunGone):
        await writes.drain()
    with pytest.raises(RunGone):
        writes.submit(log.append, run_id, "token", {"text": "y"})


async def test_a_large_fan_out_is_written_in_slices_and_in_order(core, run_id):
    from orchestra.engine.events import FANOUT_SLICE

    log, writer = EventLog(core.db), EventLog(core.db)
    readers = 2 * FANOUT_SLICE + 50
    got: list[list[int]] = [[] for _ in range(readers)]
    for i in range(readers):
        sub = log.subscribe(run_id)
        sub.sink = lambda event, out=got[i]: out.append(event.seq) or True
    events = [await writer.append(run_id, "token", {"text": str(n)}) for n in range(3)]
    for event in events:  # a burst: the loop gets its turn between slices of writes
        log.publish(event, run_id)
    assert sum(len(g) for g in got) < 3 * readers
    for _ in range(20):
        await asyncio.sleep(0)
    assert all(g == [1, 2, 3] for g in got)
    assert not log._fanout
