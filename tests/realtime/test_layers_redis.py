"""LedgerRedisChannelLayer.group_send_many: several groups, one round trip when none has
members, and the same delivery as group_send when some have (Redis profile)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

pytestmark = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis")


def make_layer():
    from compaction_app.realtime.layers import LedgerRedisChannelLayer

    return LedgerRedisChannelLayer(
        hosts=[os.environ["REDIS_URL"]], prefix=f"test-layers-{os.getpid()}-{time.time_ns()}"
    )


def test_it_delivers_to_every_watched_group_and_skips_the_empty_ones():
    async def scenario():
        layer = make_layer()
        watcher = await layer.new_channel()
        both = await layer.new_channel()
        await layer.group_add("ledger.session.1", watcher)
        await layer.group_add("ledger.session.1", both)
        await layer.group_add("ledger.staff", both)
        message = {"type": "ledger.message", "message": {"n": 1}}
        await layer.group_send_many(["ledger.session.1", "ledger.user.7", "ledger.staff"], message)
        got = [await asyncio.wait_for(layer.receive(watcher), 5)]
        # A channel in two groups gets the message once per group, as with group_send.
        got += [await asyncio.wait_for(layer.receive(both), 5) for _ in range(2)]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(layer.receive(both), 0.3)
        await layer.flush()
        return got

    got = asyncio.run(scenario())
    assert [m["message"] for m in got] == [{"n": 1}] * 3


def test_it_reads_the_membership_of_empty_groups_in_one_round_trip():
    async def scenario():
        layer = make_layer()
        connection = layer.connection(0)
        commands: list[str] = []
        original = connection.execute_command
        original_pipeline = connection.pipeline

        async def counted(*args, **kwargs):
            commands.append(str(args[0]))
            return await original(*args, **kwargs)

        def pipeline(*args, **kwargs):
            pipe = original_pipeline(*args, **kwargs)
            run = pipe.execute

            async def execute(*a, **k):
                commands.append("PIPELINE")
                return await run(*a, **k)

            pipe.execute = execute
            return pipe

        connection.execute_command = counted
        connection.pipeline = pipeline
        layer.connection = lambda index: connection
        await layer.group_send_many(
            ["ledger.session.1", "ledger.user.7", "ledger.staff"], {"type": "ledger.message"}
        )
        sent = list(commands)
        await layer.flush()
        return sent

    assert asyncio.run(scenario()) == ["PIPELINE"]


def test_it_drops_expired_members_before_deciding():
    async def scenario():
        layer = make_layer()
        stale = await layer.new_channel()
        await layer.group_add("ledger.session.2", stale)
        # A member older than group_expiry (a consumer that died without discarding).
        key = layer._group_key("ledger.session.2")
        await layer.connection(0).zadd(key, {stale: time.time() - layer.group_expiry - 10})
        await layer.group_send_many(["ledger.session.2"], {"type": "ledger.message"})
        members = await layer.connection(0).zcard(key)
        await layer.flush()
        return members

    assert asyncio.run(scenario()) == 0
