"""The Celery broker's Redis transport: kombu's, with one fault fixed.

When a worker loses Redis (a restart, a failover), Celery 5.7 first collects the lost
connection, which detaches the kombu transport from it (`transport.client = None`), and then
closes it. A channel the collection left open (in practice one with a receive pending, so a
worker with more than one pool process) is closed by that second step, which puts its
unacknowledged messages back; to reach Redis kombu builds a new pool from `transport.client`,
and fails with `AttributeError: 'NoneType' object has no
attribute 'hostname'`. That is no connection error, so the worker's clean-up does not absorb
it and the worker exits ("Unrecoverable error"), taking Celery beat with it when run with -B.
The task the worker was running hits the same fault when it ends and is acknowledged on its
old channel.

Here the transport keeps the connection's parameters when kombu detaches it, so an old
channel can still reach Redis: it puts its messages back or acknowledges them on the server
now answering at that address (a restarted Redis without persistence holds none of them, and
the commands change nothing), or fails with Redis's own connection error while it is still
down, which the clean-up absorbs. The worker reconnects and goes on consuming.
`tests/compaction/test_worker_redis_restart.py` restarts Redis under a real worker.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class Transport(kombu_redis.Transport):
    _kept_client: Any = None

    @property  # type: ignore[override]
    def client(self) -> Any:
        return self._kept_client

    @client.setter
    def client(self, value: Any) -> None:
        # kombu sets None when the connection closes (only to drop a reference); its channels
        # may still need the parameters, see above.
        if value is not None:
            self._kept_client = value
