"""The event log and the live feed: store-then-publish, per-run seq, gap-free resume,
overflow, events stored by other processes (signals), bounded catch-up pages."""

from __future__ import annotations

import asyncio

import pytest

from orchestra.db.models import RunEvent, WorkflowRun
from orchestra.db.signals import Signals
from orchestra.engine.coalescer import TokenCoalescer
from orchestra.engine.feed import FANOUT_SLICE, PING, Feeds
from orchestra.engine.store.events import PAGE_BYTES, EventLog, RunGone
from orchestra.engine.writer import RunWriter
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
    feeds = Feeds(log)
    sub = feeds.join(run_id, 0)
    first = await log.append(run_id, "run_started", {"status": "running"})
    second = await log.append(run_id, "step_started", {"prompt": "p"}, step_id="a")
    assert (first.seq, second.seq) == (1, 2)
    assert second.data["step_id"] == "a" and second.data["trace_id"] == run_id
    assert second.data["seq"] == 2 and second.data["ts"].endswith("Z")
    got = sub.take()
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
    feeds = Feeds(log)
    for i in range(3):
        await log.append(run_id, "token", {"text": str(i)}, step_id="a")
    stream = feeds.follow(run_id, after=1)

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
    assert feeds.subscriber_count(run_id) == 0  # unsubscribed when the stream ended


async def test_a_full_subscriber_falls_behind_and_catches_up_from_the_store(core, run_id):
    from orchestra.engine import feed as feed_module

    log = EventLog(core.db)
    feeds = Feeds(log)
    it = feeds.follow(run_id).__aiter__()
    waiter = asyncio.create_task(it.__anext__())
    await asyncio.sleep(0.05)  # the stream has caught up, joined the feed and waits
    (sub,) = feeds._feeds[run_id].subs
    stored = []
    for i in range(feed_module.QUEUE_EVENTS + 10):  # no await between publishes: a burst
        stored.extend(await EventLog(core.db).append_many(run_id, [("token", {"text": str(i)}, None)]))
    stored.extend(await EventLog(core.db).append_many(run_id, [("run_finished", {"status": "succeeded"}, None)]))
    for event in stored:
        feeds._stored(run_id, [event])
    assert sub.behind and not sub.queue
    got = [await waiter]
    async for event in it:
        got.append(event)
    assert [e.seq for e in got] == list(range(1, len(stored) + 1))


async def test_follow_reads_events_stored_by_another_process_once_per_signal(core, run_id):
    """Another process's appends reach this one as `events` signals (a trigger on
    PostgreSQL); the feed reads them from the store once for all of its readers."""
    signals = Signals()
    here = EventLog(core.db)
    feeds = Feeds(here, signals)
    elsewhere = EventLog(core.db)  # no local feed: like another process
    streams = [asyncio.create_task(collect(feeds.follow(run_id), timeout=3)) for _ in range(5)]
    reads = []
    original = here.page

    async def counting_page(trace_id, *, after):
        reads.append(after)
        return await original(trace_id, after=after)

    await asyncio.sleep(0.1)
    here.page = counting_page
    for kind, data in (("run_started", None), ("run_failed", {"status": "interrupted"})):
        event = await elsewhere.append(run_id, kind, data)
        await signals.notify("events", f"{run_id}:{event.seq}")
        await asyncio.sleep(0.05)
    results = await asyncio.gather(*streams)
    assert all([e.kind for e in got] == ["run_started", "run_failed"] for got in results)
    assert len(reads) <= 4  # per signal one feed read (and one empty), not one per reader


async def test_a_signal_that_comes_while_the_feed_reads_is_not_lost(core, run_id):
    """An event is stored elsewhere and signalled while the feed's read of the store is
    under way and began too early to see it: the feed reads again instead of waiting
    for a signal that will not come (the reader would hang until the run's next event)."""
    signals = Signals()
    here = EventLog(core.db)
    feeds = Feeds(here, signals)
    elsewhere = EventLog(core.db)
    await elsewhere.append(run_id, "run_started", None)
    original = here.page
    reads_after_1 = []

    async def racing_page(trace_id, *, after):
        result = await original(trace_id, after=after)
        if after == 1:
            reads_after_1.append(result)
            if len(reads_after_1) == 2:  # the feed's own read (the first was the catch-up's)
                event = await elsewhere.append(run_id, "run_failed", {"status": "interrupted"})
                await signals.notify("events", f"{run_id}:{event.seq}")
                await asyncio.sleep(0)  # the signal is handled while this read is still out
        return result

    here.page = racing_page
    got = await collect(feeds.follow(run_id), timeout=3)
    assert [e.kind for e in got] == ["run_started", "run_failed"]
    assert reads_after_1[:2] == [[], []]  # both reads of seq 2 began before it was stored


async def test_catch_up_reads_bounded_pages(core, run_id):
    log = EventLog(core.db)
    big = "x" * (PAGE_BYTES // 3)
    for _ in range(10):
        await log.append(run_id, "token", {"text": big})
    first = await log.page(run_id, after=0)
    assert 1 <= len(first) <= 4 and first[0].seq == 1
    assert sum(len(e.data["text"]) for e in first) <= PAGE_BYTES  # about a page of data
    seqs = []
    after = 0
    while page := await log.page(run_id, after=after):
        seqs += [e.seq for e in page]
        after = page[-1].seq
    assert seqs == list(range(1, 11))


async def test_follow_pings_when_idle(core, run_id):
    log = EventLog(core.db)
    got = await collect(Feeds(log).follow(run_id, ping_every=0.05), n=2, timeout=2)
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
    feeds = Feeds(log)
    await log.append(run_id, "run_started")
    streams = [asyncio.create_task(collect(feeds.follow(run_id), timeout=8)) for _ in range(30)]
    await asyncio.sleep(0.3)  # 30 tasks waiting > the pool's 8 connections
    finished = await asyncio.wait_for(
        asyncio.create_task(log.append(run_id, "run_finished", {"status": "succeeded"})), 3
    )
    results = await asyncio.gather(*streams)
    assert all([e.seq for e in got] == [1, finished.seq] for got in results)


async def test_a_caught_up_reader_gets_live_events_through_its_sink_once_and_in_order(core, run_id):
    log = EventLog(core.db)
    feeds = Feeds(log)
    for i in range(3):
        await log.append(run_id, "token", {"text": str(i)}, step_id="a")
    written: list[bytes] = []
    stream = feeds.follow(run_id, after=1)
    stream.sink = lambda event: written.append(event.frame()) or True

    async def writer():
        await asyncio.sleep(0.05)  # the reader has replayed 2..3 and waits
        (sub,) = feeds._feeds[run_id].subs
        assert sub.sink is not None  # live events now bypass the reader's queue
        for i in range(3):
            await log.append(run_id, "token", {"text": f"live{i}"}, step_id="a")
        await log.append(run_id, "run_finished", {"status": "succeeded"})

    task = asyncio.create_task(writer())
    replayed = await collect(stream)
    await task
    assert [e.seq for e in replayed] == [2, 3]  # the catch-up came through the iterator
    stored = await log.stored(run_id, after=3)
    assert [f.split(b"\n")[0] for f in written] == [b"id: %d" % e.seq for e in stored]
    assert written[0].startswith(b"id: 4\nevent: token\n")
    assert feeds.subscriber_count(run_id) == 0


async def test_a_sink_that_refuses_drops_the_reader_which_catches_up(core, run_id):
    log = EventLog(core.db)
    feeds = Feeds(log)
    seen: list[int] = []
    refuse = {5}  # the sink refuses event 5 once (a slow socket)

    def sink(event):
        if event.seq in refuse:
            refuse.discard(event.seq)
            return False
        seen.append(event.seq)
        return True

    stream = feeds.follow(run_id)
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
    # 1..4 live through the sink; 5 refused, then sent by the reader's task; never twice.
    assert seen[:4] == [1, 2, 3, 4] and through_iterator[0] == 5
    assert seen == list(range(1, 10))


async def test_a_sink_reader_pings_when_idle(core, run_id):
    log = EventLog(core.db)
    feeds = Feeds(log)
    stream = feeds.follow(run_id, ping_every=0.05)
    stream.sink = lambda event: True
    assert await collect(stream, n=2, timeout=2) == [PING, PING]
    (sub,) = feeds._feeds[run_id].subs
    assert sub.sink is not None
    await stream.aclose()
    assert feeds.subscriber_count(run_id) == 0


async def test_run_writer_applies_writes_in_submit_order_without_making_the_caller_wait(core, run_id):
    log, writes, done = EventLog(core.db), RunWriter(), []

    async def slow(name):
        await asyncio.sleep(0.05)
        done.append(name)

    first = writes.submit(slow, "first")
    writes.submit(log.append, run_id, "run_started")
    last = writes.submit(log.append_many, run_id, [("token", {"text": "a"}, "s"), ("token", {"text": "b"}, "s")])
    # `submit` is a plain call: it returned before any write ran.
    assert not first.done() and not last.done() and done == []
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


async def test_run_writer_applies_writes_waiting_together_as_one_group(core, run_id):
    """Group commit: `submit_many` items queued next to each other reach their function in
    one call, in order; a plain write between them splits the group; each future is done
    once its group is stored."""
    log, writes, calls = EventLog(core.db), RunWriter(), []

    async def store(items, trace_id):
        calls.append(list(items))
        await log.append_many(trace_id, [("token", {"text": text}, "s") for text in items])

    first = writes.submit_many(store, "a", run_id)
    writes.submit_many(store, "b", run_id)
    writes.submit(log.append, run_id, "token", {"text": "between"})
    writes.submit_many(store, "c", run_id)
    last = writes.submit_many(store, "d", run_id)
    await writes.drain()
    assert calls == [["a", "b"], ["c", "d"]]
    assert first.result() is None and last.result() is None
    rows = await core.db.list(RunEvent.select().where(RunEvent.run == run_id).order_by(RunEvent.seq))
    assert [(r.seq, r.data["text"]) for r in rows] == [
        (1, "a"), (2, "b"), (3, "between"), (4, "c"), (5, "d")]


async def test_a_large_fan_out_is_written_in_slices_and_in_order(core, run_id):
    log = EventLog(core.db)
    feeds = Feeds(log)
    readers = 2 * FANOUT_SLICE + 50
    got: list[list[int]] = [[] for _ in range(readers)]
    for i in range(readers):
        sub = feeds.join(run_id, 0)
        sub.sink = lambda event, out=got[i]: out.append(event.seq) or True
    events = [(await EventLog(core.db).append(run_id, "token", {"text": str(n)})) for n in range(3)]
    for event in events:  # a burst: the loop gets its turn between slices of writes
        feeds._stored(run_id, [event])
    assert sum(len(g) for g in got) < 3 * readers
    for _ in range(20):
        await asyncio.sleep(0)
    assert all(g == [1, 2, 3] for g in got)
    assert not feeds._feeds[run_id]._jobs


async def test_concurrent_appenders_retry_through_conflicts_and_never_lose_an_event(core, run_id):
    """Two writers on one run (an owner and a process taking replies): every conflict on
    the (run, seq) index is retried, so all 60 events are stored, gapless."""
    one, two = EventLog(core.db), EventLog(core.db)

    async def write(log, tag):
        for i in range(30):
            await log.append(run_id, "token", {"text": f"{tag}{i}"})

    await asyncio.gather(write(one, "a"), write(two, "b"))
    assert await stored_seqs(core, run_id) == list(range(1, 61))
    texts = [e.data["text"] for e in await one.stored(run_id)]
    assert sorted(texts) == sorted([f"a{i}" for i in range(30)] + [f"b{i}" for i in range(30)])


async def test_appends_that_keep_losing_raise_store_contention(core, run_id, monkeypatch):
    """Contention is its own error (not "the run is gone"), after the deadline."""
    from orchestra.engine.store import events as log_module

    monkeypatch.setattr(log_module, "APPEND_DEADLINE_SECONDS", 0.0)
    writer = EventLog(core.db)
    await writer.append(run_id, "run_started")
    stale = EventLog(core.db)
    stale._last[run_id] = 0  # its first try collides; the deadline has already passed
    with pytest.raises(log_module.StoreContention):
        await stale.append(run_id, "token", {"text": "x"})
