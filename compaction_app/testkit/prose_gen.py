"""A prose-heavy agent session for the evidence bench: the facts that must survive are the
agent's own conclusions, written the many ways people write them ("The culprit turned out to
be …", "So the 14-day window stays.", "Looks like `orders_v2` is the table to migrate") and
never with the words a list of decision verbs would look for (`BANNED`). They sit inside longer
messages of ordinary working prose, between tool calls whose output is routine but full of ids,
timestamps and numbers of its own, and user turns.

Deterministic by seed: each seed picks other conclusions, in another order, with other values.

    from compaction_app.testkit.prose_gen import generate_prose_session
    session = generate_prose_session(seed=3)   # session.events (REST shape), session.facts
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BANNED", "ProseSession", "generate_prose_session"]

# Words and phrases a selection keyed on decision vocabulary would catch: no conclusion uses them.
BANNED = (
    "decided",
    "decide",
    "decision",
    "chose",
    "choose",
    "we will",
    "we'll",
    "going with",
    "settled",
    "rolled back",
    "roll back",
    "because",
    "conclusion",
    "agreed",
)

_HOSTS = ("gke-pool-b", "ip-10-4", "worker-node", "edge-lb", "db-replica")
_TABLES = ("orders", "invoices", "payouts", "refunds", "shipments", "ledger_entries", "carts")
_PACKAGES = ("psycopg", "grpcio", "orjson", "cryptography", "lxml", "numpy", "pyarrow")
_REGIONS = ("ap-southeast-3", "eu-south-2", "me-central-1", "ca-west-1", "il-central-1")
_PEOPLE = ("@marta.k", "@dev-oyelaran", "@j.lindqvist", "@ptr-novak", "@ines.f", "@kw.chen")
_SERVICES = ("checkout", "search", "billing", "notifications", "payouts")
_INSTANCES = ("r7g.xlarge", "m7i.2xlarge", "r6i.large", "x2gd.medium", "c7g.4xlarge")


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


# --- conclusions: (sentence, fact) -----------------------------------------------------------
# Each value is drawn from ranges the routine output below never prints, so the fact lives in
# the conclusion alone.


def _dns(rng: random.Random) -> tuple[str, str]:
    node = f"{rng.choice(_HOSTS)}-{_hex(rng, 4)}q"
    return f"The culprit turned out to be the stale DNS cache on {node}.", node


def _latency(rng: random.Random) -> tuple[str, str]:
    ms, pool = rng.randrange(151, 299, 2), rng.choice((48, 64, 96, 128))
    return (
        f"Latency came back to {ms} ms once the pool was raised to {pool}.",
        f"came back to {ms} ms",
    )


def _window(rng: random.Random) -> tuple[str, str]:
    days = rng.choice((9, 11, 14, 17, 21))
    return f"So the {days}-day window stays.", f"{days}-day window"


def _table(rng: random.Random) -> tuple[str, str]:
    table = rng.choice(_TABLES)
    version = rng.randrange(2, 5)
    return (
        f"Looks like `{table}_v{version}` is the table to migrate, not `{table}`.",
        f"{table}_v{version}",
    )


def _idle_timeout(rng: random.Random) -> tuple[str, str]:
    seconds = rng.choice((55, 58, 61, 65, 75))
    return (
        f"Turns out the 502s come from the load balancer's idle timeout ({seconds} s), not from "
        "the app at all.",
        f"idle timeout ({seconds} s)",
    )


def _leak(rng: random.Random) -> tuple[str, str]:
    function = f"warm_{rng.choice(_TABLES)}_cache_{rng.randrange(2, 9)}"
    return (
        f"The leak is in `{function}`: it holds on to every request body it has seen.",
        function,
    )


def _glibc(rng: random.Random) -> tuple[str, str]:
    package = rng.choice(_PACKAGES)
    version = f"{rng.randrange(2, 9)}.{rng.randrange(10, 30)}.{rng.randrange(1, 9)}"
    return (
        f"Pinning {package}=={version} it is; nothing newer builds against this glibc.",
        f"{package}=={version}",
    )


def _retry_budget(rng: random.Random) -> tuple[str, str]:
    budget = rng.randrange(130, 190)
    return (
        f"A retry budget of {budget} per minute is plenty, nothing to change there.",
        f"retry budget of {budget}",
    )


def _flaky(rng: random.Random) -> tuple[str, str]:
    test = f"test_{rng.choice(_TABLES)}_survive_restart_{rng.randrange(2, 9)}"
    return (
        f"Bottom line: the flaky one is `{test}`, and only under `-n 4`.",
        test,
    )


def _hit_rate(rng: random.Random) -> tuple[str, str]:
    rate = rng.randrange(31, 49)
    return (
        f"Interesting: the hit rate drops to {rate}% whenever the locale is part of the key.",
        f"drops to {rate}%",
    )


def _region(rng: random.Random) -> tuple[str, str]:
    region = rng.choice(_REGIONS)
    return f"That leaves {region} as the only region without a read replica.", region


def _scratch(rng: random.Random) -> tuple[str, str]:
    size = rng.randrange(310, 390)
    return (
        f"The export needs about {size} GB of scratch, so the 250 GB volume was never going "
        "to be enough.",
        f"{size} GB of scratch",
    )


def _threshold(rng: random.Random) -> tuple[str, str]:
    errors, minutes = rng.randrange(23, 39), rng.choice((7, 9, 12))
    return (
        f"A threshold of {errors} errors per {minutes} minutes it is.",
        f"{errors} errors per {minutes} minutes",
    )


def _off_by_one(rng: random.Random) -> tuple[str, str]:
    where = f"src/{rng.choice(_SERVICES)}/paging.py:{rng.randrange(300, 480)}"
    return f"Right, the off-by-one lives at {where}, in the last-page check.", where


def _index(rng: random.Random) -> tuple[str, str]:
    index = f"ix_{rng.choice(_TABLES)}_tenant_created_{_hex(rng, 3)}"
    return f"No new index needed: `{index}` already covers that filter.", index


def _flag(rng: random.Random) -> tuple[str, str]:
    flag = f"FF_{rng.choice(_SERVICES).upper()}_ASYNC_CAPTURE_{rng.randrange(2, 9)}"
    return f"`{flag}` stays off in production for now; staging only.", flag


def _rows(rng: random.Random) -> tuple[str, str]:
    rows = f"{rng.randrange(20, 90)},{rng.randrange(100, 999)},{rng.randrange(100, 999)}"
    return (
        f"The numbers line up: {rows} rows in the source and {rows} in the warehouse after the "
        "backfill.",
        f"{rows} rows",
    )


def _cron(rng: random.Random) -> tuple[str, str]:
    at = f"{rng.randrange(0, 6):02d}:{rng.choice((7, 17, 23, 37, 43)):02d} UTC"
    return f"Plain cron at {at} is enough for this one, no scheduler needed.", at


def _owner(rng: random.Random) -> tuple[str, str]:
    person, service = rng.choice(_PEOPLE), rng.choice(_SERVICES)
    return f"{person} owns the {service} runbook from here on, per the thread.", person


def _certificate(rng: random.Random) -> tuple[str, str]:
    date = f"2027-0{rng.randrange(1, 9)}-{rng.randrange(10, 28)}"
    return f"Worth noting: the certificates on the partner endpoint expire on {date}.", date


def _instance(rng: random.Random) -> tuple[str, str]:
    instance = rng.choice(_INSTANCES)
    return (
        f"Cheapest thing that fits the working set is {instance}, at roughly half the price.",
        instance,
    )


def _false_alarm(rng: random.Random) -> tuple[str, str]:
    alert = f"KafkaConsumerLag{rng.choice(('High', 'Spike', 'Stuck'))}{rng.randrange(2, 9)}"
    return (
        f"False alarm on {alert}: the lag is the nightly compaction, gone by six.",
        alert,
    )


def _batch(rng: random.Random) -> tuple[str, str]:
    size = rng.choice((750, 1250, 1750, 2250))
    return (
        f"With batches of {size} the import finishes inside the window and the replica keeps up.",
        f"batches of {size}",
    )


CONCLUSIONS: tuple[Callable[[random.Random], tuple[str, str]], ...] = (
    _dns,
    _latency,
    _window,
    _table,
    _idle_timeout,
    _leak,
    _glibc,
    _retry_budget,
    _flaky,
    _hit_rate,
    _region,
    _scratch,
    _threshold,
    _off_by_one,
    _index,
    _flag,
    _rows,
    _cron,
    _owner,
    _certificate,
    _instance,
    _false_alarm,
    _batch,
)

# Ordinary working prose around a conclusion: a message reads as a paragraph, not a verdict.
_BEFORE = (
    "Went through the last hour of output again.",
    "Compared the two runs side by side.",
    "Checked the graphs for the same window yesterday.",
    "Reran it with tracing on to be sure.",
    "Read the handler and the config it loads.",
    "Pulled the numbers from the last three deploys.",
)
_AFTER = (
    "Next I'll look at the worker logs.",
    "Moving on to the remaining alerts.",
    "The rest of the output looks ordinary.",
    "Nothing else stood out in that batch.",
    "Will keep an eye on it during the next run.",
    "Back to the checklist.",
)
_CHATTER = (
    "Running the test suite again to see where we are.",
    "Let me look at the logs around that time.",
    "Checking the pods before going further.",
    "Reading the config that the service actually loads.",
    "The output is long; scanning it for anything unusual.",
    "That run was clean. Trying the next one.",
    "Nothing conclusive yet, still looking.",
    "Comparing this with what staging shows.",
)
_ASKS = (
    "Can you look into the checkout latency from this morning?",
    "The nightly export failed again, what happened?",
    "Please check why the search pods keep restarting.",
    "Finance says yesterday's numbers look off. Can you verify?",
    "What's going on with the flaky CI job?",
    "Is the replica keeping up after the migration?",
    "Where are we on the cache work?",
    "Any idea why the 502s spiked around noon?",
)


def _budget(rng: random.Random) -> tuple[str, str]:
    nodes = f"{rng.randrange(41, 59)} nodes"
    return f"For context, the cluster budget this quarter is {nodes}, not a node more.", nodes


def _change(rng: random.Random) -> tuple[str, str]:
    ticket = f"CHG-{rng.randrange(40000, 49999)}"
    return f"Anything touching prod goes under change ticket {ticket}, please.", ticket


_USER_NOTES: tuple[Callable[[random.Random], tuple[str, str]], ...] = (_budget, _change)


# --- routine tool output ---------------------------------------------------------------------


def _log(rng: random.Random) -> tuple[str, dict[str, Any], str]:
    minute = rng.randrange(60)
    lines = [
        f"2026-11-21T09:{minute:02d}:{rng.randrange(60):02d}.{rng.randrange(1000):03d}Z "
        f"{rng.choice(('INFO ', 'INFO ', 'DEBUG', 'WARN '))} "
        f"svc={rng.choice(_SERVICES)} trace={_hex(rng, 16)} "
        f"route=/api/{rng.choice(_TABLES)}/{rng.randrange(10**5, 10**6)} "
        f"status={rng.choice((200, 200, 200, 204, 304, 404))} took={rng.randrange(3, 140)}ms"
        for _ in range(rng.randrange(25, 60))
    ]
    service = rng.choice(_SERVICES)
    return "bash", {"command": f"kubectl logs deploy/{service} --since=15m"}, "\n".join(lines)


def _tests(rng: random.Random) -> tuple[str, dict[str, Any], str]:
    service = rng.choice(_SERVICES)
    lines = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.12.7, pytest-8.3.3, pluggy-1.5.0",
        f"rootdir: /srv/{service}",
        f"collected {rng.randrange(200, 600)} items",
        "",
    ]
    for k in range(rng.randrange(10, 25)):
        module = f"tests/{rng.choice(_TABLES)}/test_{rng.choice(('api', 'models', 'tasks'))}.py"
        lines.append(f"{module} {'.' * rng.randrange(5, 50)} [{min(100, 4 * (k + 1)):3d}%]")
    lines.append(f"{rng.randrange(200, 600)} passed in {rng.uniform(10, 90):.2f}s")
    return "bash", {"command": f"cd /srv/{service} && pytest -q"}, "\n".join(lines)


def _pods(rng: random.Random) -> tuple[str, dict[str, Any], str]:
    lines = ["NAME                                   READY   STATUS    RESTARTS   AGE"]
    for service in _SERVICES:
        for _ in range(rng.randrange(2, 5)):
            lines.append(
                f"{service}-{_hex(rng, 9)}-{_hex(rng, 5):<10} 1/1     Running   "
                f"{rng.randrange(0, 3):<10} {rng.randrange(1, 30)}h"
            )
    return "bash", {"command": "kubectl get pods -n prod"}, "\n".join(lines)


def _query(rng: random.Random) -> tuple[str, dict[str, Any], str]:
    table = rng.choice(_TABLES)
    lines = [
        " tenant_id | day        |  count  | p95_ms",
        "-----------+------------+---------+--------",
    ]
    for _ in range(rng.randrange(10, 30)):
        lines.append(
            f" {rng.randrange(1000, 9999):>9} | 2026-11-{rng.randrange(1, 21):02d} | "
            f"{rng.randrange(100, 99999):>7} | {rng.randrange(10, 140):>6}"
        )
    lines.append(f"({len(lines) - 2} rows)")
    sql = f"SELECT tenant_id, day, count, p95_ms FROM daily_{table}_stats ORDER BY day DESC"
    return "bash", {"command": f'psql -c "{sql}"'}, "\n".join(lines)


def _source(rng: random.Random) -> tuple[str, dict[str, Any], str]:
    service, table = rng.choice(_SERVICES), rng.choice(_TABLES)
    path = f"src/{service}/{table}.py"
    body = [
        f'"""{table.capitalize()} for the {service} service."""',
        "",
        "from __future__ import annotations",
        "",
        "import logging",
        "",
        "log = logging.getLogger(__name__)",
        "",
    ]
    for k in range(rng.randrange(3, 7)):
        body += [
            "",
            f"def {rng.choice(('load', 'save', 'sync', 'check'))}_{table}_{k}(ids: list[int]) -> int:",
            f"    log.info('{table} %d', len(ids))",
            f"    return sum(1 for i in ids if i % {rng.randrange(2, 9)})",
        ]
    return "read_file", {"path": path}, "\n".join(body)


_ROUTINE = (_log, _tests, _pods, _query, _source)


@dataclass
class ProseSession:
    events: list[dict[str, Any]]
    facts: list[str]
    # The index in `events` of the message stating each fact.
    fact_events: dict[str, int] = field(default_factory=dict)


def generate_prose_session(
    *, seed: int = 1, turns: int = 48, conclusions: int = 14
) -> ProseSession:
    """A session of `turns` user turns, each answered with one to three routine tool calls and
    a message; `conclusions` of them carry one of the agent's conclusions, and two user turns a
    fact of the user's own, all in the first 85 % of the session."""
    rng = random.Random(f"prose:{seed}")
    picks = rng.sample(CONCLUSIONS, min(conclusions, len(CONCLUSIONS)))
    user_notes = list(_USER_NOTES)
    slots = sorted(rng.sample(range(1, int(turns * 0.85)), len(picks) + len(user_notes)))
    rng.shuffle(slots)
    agent_at = {turn: pick for turn, pick in zip(slots, picks, strict=False)}
    user_at = dict(zip(slots[len(picks) :], user_notes, strict=True))
    events: list[dict[str, Any]] = [
        {
            "type": "SYSTEM_PROMPT",
            "content": "You are an SRE agent with a shell and a file reader. Work carefully and "
            "tell the user what you find.",
        }
    ]
    facts: list[str] = []
    fact_events: dict[str, int] = {}
    for turn in range(turns):
        ask = rng.choice(_ASKS)
        if turn in user_at:
            sentence, fact = user_at[turn](rng)
            ask = f"{ask} {sentence}"
            facts.append(fact)
            fact_events[fact] = len(events)
        events.append({"type": "USER_MESSAGE", "content": ask})
        for k in range(rng.randrange(1, 4)):
            name, arguments, output = rng.choice(_ROUTINE)(rng)
            call_id = f"toolu_{seed:02d}{turn:03d}{k}{_hex(rng, 6)}"
            events.append(
                {
                    "type": "TOOL_CALL",
                    "name": name,
                    "toolCallId": call_id,
                    "content": json.dumps(arguments),
                }
            )
            events.append(
                {"type": "TOOL_RESULT", "name": name, "toolCallId": call_id, "content": output}
            )
            if k == 0:
                events.append({"type": "AGENT_MESSAGE", "content": rng.choice(_CHATTER)})
        if turn in agent_at:
            sentence, fact = agent_at[turn](rng)
            message = f"{rng.choice(_BEFORE)} {sentence} {rng.choice(_AFTER)}"
            facts.append(fact)
            fact_events[fact] = len(events)
        else:
            message = f"{rng.choice(_CHATTER)} {rng.choice(_AFTER)}"
        events.append({"type": "AGENT_MESSAGE", "content": message})
    events.append({"type": "USER_MESSAGE", "content": "Where do things stand overall?"})
    events.append({"type": "AGENT_MESSAGE", "content": "Pulling it together now."})
    return ProseSession(events=events, facts=facts, fact_events=fact_events)
