"""The evidence extractor: the literals an agent needs to continue, pulled out of any text.

Pure (no Django, no settings), deterministic, regex-only, so it runs on text it has never seen:
shell transcripts, pytest and git output, psql errors, HTTP responses, kubectl tables, JSON error
bodies, tracebacks and prose. The local summarizer ranks these items and the loss report checks
which of them survive a compaction; both use this one module, so what the summary promises to
keep and what the report counts are the same thing.

Each item has a `kind`, the `text` as it appeared (clipped), a normalized `key` (two items with
the same key are the same evidence; the key is what "still held by the context" is judged by), a
`seq` (the event it came from), the source `line` (clipped; what a summary line can quote), a
`subject` for values a later message may correct (a setting's name, a package's name: the newest
value wins), and a `shape` (the key with its variable parts blanked) that lets repeats of one
pattern — forty `ValueError: bad row N` lines — collapse into one.

`Salience` measures how much a line of tool output tells against the session it came from (a
rare template, rare named values, a failure, a command's outcome); the local summarizer keeps
the lines it ranks highest. See docs/nothing-lost.md.
"""

from __future__ import annotations

import re
import sys
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import lru_cache

import ahocorasick

__all__ = [
    "CITATION",
    "FILE_PATH",
    "KINDS",
    "URL",
    "Candidate",
    "Salience",
    "Evidence",
    "collapsed_shapes",
    "extract",
    "extract_many",
    "held",
    "loss_report",
    "parameters_of",
    "quoted_line",
    "segmented",
    "shape_of",
    "template_of",
]

KINDS: tuple[str, ...] = (
    "path",
    "command",
    "exit",
    "signal",
    "error",
    "error_code",
    "http_status",
    "url",
    "host",
    "commit",
    "table",
    "migration",
    "index",
    "constraint",
    "ticket",
    "identifier",
    "flag",
    "tag",
    "setting",
    "version",
    "quantity",
    "test_tally",
    "decision",
    "plan",
    "cause",
    "todo",
    "correction",
)

_MAX_TEXT = 200
_MAX_LINE = 240


@dataclass(frozen=True)
class Evidence:
    kind: str
    text: str
    key: str
    seq: int = 0
    line: str = ""
    subject: str = ""
    shape: str = ""


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit - 1)
    return text[: cut if cut > limit // 2 else limit - 1] + "…"


# Numbers and hashes vary between repeats of one pattern; quoted names and identifiers do not
# (`ERR_QUOTA_TENANTS` and `ERR_AUTH_CARTS` are two facts, `bad row 17` and `bad row 912` one).
_SHAPE_VARIABLE = re.compile(r"\b[0-9a-f]{7,40}\b|\d+(?:[.,:]\d+)*")


def shape_of(text: str) -> str:
    """`text` with its variable parts (quoted strings, hex ids, numbers) blanked out."""
    return " ".join(_SHAPE_VARIABLE.sub("#", text.lower()).split())


# --- patterns ----------------------------------------------------------------------------------

_URL = re.compile(r"\b(?:https?|wss?|postgres(?:ql)?|redis|amqp|mysql|s3)://[^\s\"'<>`)\]},]+")
_FILE_EXT = (
    r"py|pyi|js|mjs|cjs|jsx|ts|tsx|go|rs|java|kt|rb|php|c|h|cc|cpp|hpp|cs|swift|sql|sh|bash|zsh"
    r"|toml|ya?ml|json|jsonl|ini|cfg|conf|env|lock|md|rst|txt|log|csv|html?|css|scss|xml|proto"
    r"|tf|tfvars|gradle|pem|crt|service|sock|pid|sqlite3?|ipynb|whl|gz|tgz|zip|jar"
)
# A path has a slash and either a file extension, a leading / ./ ~/ or three segments; or is a
# bare file name with a known extension. MIME types and unit ratios are not paths.
_PATH = re.compile(
    r"(?<![\w/.:@-])((?:~|\.{1,2})?/?(?:[\w@+.-]+/)+[\w@+.-]*[\w@+-])(?::(\d+))?"
    r"|(?<![\w/.:@-])((?:[\w-]+\.)+(?:" + _FILE_EXT + r")|Dockerfile|Makefile|Procfile)\b(?!\.?\w)"
)
# A file a text names: a path ending in a file name with an extension, or a bare file name with
# a known extension. No groups, so `findall` returns the paths themselves. The local summarizer
# lists these under "Files touched" and scores sentences naming one.
FILE_PATH = re.compile(
    r"(?<![\w/.:@-])(?:~|\.{1,2})?/?(?:[\w@+.-]+/)+[\w@+.-]*\.[A-Za-z]\w*\b"
    r"|(?<![\w/.:@-])(?:[\w-]+\.)+(?:" + _FILE_EXT + r")\b(?!\.?\w)"
)
URL = _URL
_NOT_PATH_PREFIX = (
    "application/",
    "text/",
    "image/",
    "multipart/",
    "audio/",
    "video/",
    "font/",
    "origin/",
    "upstream/",
    "refs/",
    "HTTP/",
)
_COMMAND_PROMPT = re.compile(r"^[ \t]*(?:\$|❯|%|>>>|\w+@[\w.-]+:[~\w/.-]*[$#])[ \t]+(\S.*)$", re.M)
_COMMAND_JSON = re.compile(r"\"(?:command|cmd)\"\s*:\s*\"((?:[^\"\\\n]|\\.){2,400})\"")
_EXIT = re.compile(
    r"\b(?:exit(?:ed)?(?: with)?(?: status| code)?|exit_code|returned non-zero exit status"
    r"|command terminated with exit code|Process exited with code|Exit code|\] Error)[:= ]+(-?\d{1,3})\b",
    re.I,
)
_SIGNAL = re.compile(
    r"\bKilled: \d+|\bSegmentation fault(?: \(core dumped\))?|\bsignal: (?:killed|terminated|"
    r"segmentation fault|aborted)|\bSIG(?:KILL|TERM|SEGV|ABRT|INT|HUP|PIPE|BUS)\b|\bOOMKilled\b"
    r"|\bAborted \(core dumped\)|\bBus error"
)
_EXCEPTION = re.compile(
    r"(?<![\w.])((?:[a-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Fault|Warning"
    r"|Timeout|Refused|Denied|NotFound|DoesNotExist|Violation))\b(?::[ \t]*([^\n]{0,300}))?"
)
_ERROR_CODE = re.compile(
    r"\b(?:ERR_[A-Z0-9_]{3,}|E(?:CONN(?:REFUSED|RESET|ABORTED)|NOENT|ACCES|PERM|ADDRINUSE|PIPE"
    r"|TIMEDOUT|HOSTUNREACH|NOTFOUND|EXIST|NOMEM|AGAIN|RESOLVE)|SQLSTATE\[?\s*[0-9A-Z]{5}\]?"
    r"|ORA-\d{5}|error\[E\d{4}\]|CrashLoopBackOff|ImagePullBackOff|ErrImagePull|Evicted|[A-Z][A-Za-z]+\d{3,4}(?=:)|[A-Z]{2,}\d{3,4}(?=\b))"
)
_ERROR_FIELD = re.compile(
    r"\"(?:code|error|error_code|errorCode|type|reason)\"\s*:\s*\"([\w.-]{3,80})\""
)
# `pkg.errors.UndefinedTable: message` (a traceback's last line) and pytest's `E   assert ...`.
_DOTTED_EXCEPTION = re.compile(r"^[ \t]*((?:[a-z_]\w*\.)+[A-Z]\w+): (\S[^\n]{0,300})$", re.M)
_PYTEST_ASSERT = re.compile(r"^E[ \t]+(assert [^\n]{1,200})$", re.M)
_ERROR_LINE = re.compile(
    r"^[ \t]*(?:E[ \t]+)?(?:ERROR|FATAL|PANIC|error|fatal|panic|npm ERR!|Error)(?:\[\w+\])?:[ \t]+(\S[^\n]*)$",
    re.M,
)
_HTTP = re.compile(
    r"\bHTTP/[\d.]+ (\d{3})(?: ([A-Za-z][A-Za-z -]{1,40}))?"
    r"|\b(?:status(?: code)?|status_code|statusCode|HTTP)[\"']?\s*[:=]?\s*(\d{3})\b"
    r"|\b(\d{3}) (Bad Request|Unauthorized|Forbidden|Not Found|Conflict|Gone|Too Many Requests"
    r"|Internal Server Error|Bad Gateway|Service Unavailable|Gateway Timeout|Unprocessable Entity"
    r"|Payload Too Large|Method Not Allowed|Request Timeout)\b",
    re.I,
)
_HOST = re.compile(
    r"(?<![\w./@-])((?:(?:\d{1,3}\.){3}\d{1,3})|localhost|(?:[a-z0-9-]+\.)+[a-z][a-z0-9-]*"
    r"|[a-z][a-z0-9-]*-[a-z0-9-]+|\[[0-9a-f:]+\]):(\d{2,5})\b(?![:/\w])",
    re.I,
)
_COMMIT = re.compile(r"(?<![\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])")
_SQL_TABLE = re.compile(
    r"\b(FROM|JOIN|INTO|UPDATE|TABLE(?: IF (?:NOT )?EXISTS)?|TRUNCATE|relation(?: named)?|table)\s+"
    r"(\"?)((?:[a-z_][\w]*\.)?[a-z_][\w]*)\"?",
)
_PSQL_TABLE = re.compile(r"\bTable \"((?:\w+\.)?\w+)\"")
_CONSTRAINT = re.compile(r"\bconstraint\s+\"?(\w+)\"?|\bCONSTRAINT\s+\"?(\w+)\"?", re.I)
_INDEX = re.compile(
    r"\b(?:INDEX(?: CONCURRENTLY)?(?: IF NOT EXISTS)?|index)\s+\"?([a-z_]\w*)\"?(?=[\s\";,]|$)",
    re.M,
)
_MIGRATION = re.compile(
    r"(?<![\w/])(\d{4}_[a-z][a-z0-9_]*)\b|\b(?:revision|Revision ID:?)\s+([0-9a-f]{12})\b"
)
_TICKET = re.compile(r"\b([A-Z][A-Z0-9]{1,9}-\d{1,6})\b|(?<![\w\[#&-])(#\d{2,6})\b(?![\]\w-])")
_FLAG = re.compile(
    r"\b((?:FF|FEATURE|FLAG)_[A-Z0-9_]{3,})\b|\b([a-z][a-z0-9]*(?:_[a-z0-9]+)*_enabled)\b"
    r"|\b(?:feature[ -]flag|flag)\s+[`'\"]?([a-z][\w.-]{2,60})[`'\"]?",
)
_TAG = re.compile(
    r"(?<![\w.=@-])(v\d+\.\d+(?:\.\d+)?(?:-[\w.]+)?)\b"
    r"|\b(?:Image|image):\s+(\S+:\S+)|\bdocker (?:pull|push|run|build -t) (\S+:\S+)"
)
_SETTING = re.compile(
    r"(?<![\w-])([A-Z][A-Z0-9_]{2,})=(\"[^\"\n]*\"|'[^'\n]*'|[^\s,;'\"`)\]}]+)"
    r"|^[ \t]*[+-]?([A-Za-z_][\w.]*)[ \t]*=[ \t]*(\d[\w.]*|'[^'\n]*'|\"[^\"\n]*\"|true|false|on|off)[ \t]*(?:#.*)?$",
    re.M,
)
_VERSION_STOP = frozenset(
    [
        "in",
        "at",
        "of",
        "to",
        "is",
        "was",
        "took",
        "for",
        "by",
        "and",
        "or",
        "the",
        "from",
        "about",
        "than",
        "after",
        "before",
        "on",
        "with",
        "version",
        "line",
        "lines",
        "step",
        "steps",
        "page",
        "pages",
        "item",
        "items",
        "row",
        "rows",
        "take",
        "takes",
        "size",
        "top",
    ]
)
_VERSION = re.compile(
    r"\b([A-Za-z][\w.+]*(?:-[A-Za-z][\w.+]*)*)(==|>=|<=|~=|@|-| v| )v?(\d+\.\d+(?:\.\d+){0,2}"
    r"(?:(?:a|b|rc|\.post|\.dev)\d+)?)(?![\w.])"
)
_QUANTITY = re.compile(
    r"(?<![\w.])(\d+(?:[.,]\d+)*)\s?(ms|µs|us|ns|s|sec|seconds?|minutes?|mins?|hours?|h|days?"
    r"|KiB|MiB|GiB|TiB|KB|MB|GB|TB|kB|bytes|B|%|rps|qps|req/s|requests per (?:second|minute)"
    r"|tokens|rows|cores|vCPU|Mi|Gi|m)(?![\w/])"
)
_TALLY = re.compile(
    r"\b\d+ (?:failed|passed|errors?|skipped|xfailed|xpassed|deselected|warnings?|tests?|total)"
    r"(?:,? \d+ (?:failed|passed|errors?|skipped|xfailed|xpassed|deselected|warnings?|total))*"
    r"(?: in \d+(?:\.\d+)?s)?|\bRan \d+ tests? in [\d.]+s|\bFAILED \((?:failures|errors)=\d+(?:, \w+=\d+)*\)"
    r"|\bTests?:\s+\d+ \w+(?:, \d+ \w+)*"
)
_PROSE = (
    (
        "correction",
        re.compile(
            r"\b(?:correction|I was wrong|scratch that|turns out|not \S+ but|actually,?|"
            r"to correct)\b",
            re.I,
        ),
    ),
    (
        "cause",
        re.compile(
            r"\b(?:root cause|caused by|because|the (?:problem|issue|bug|cause) (?:is|was)"
            r"|fixed by|the fix (?:is|was))\b",
            re.I,
        ),
    ),
    (
        "decision",
        re.compile(
            r"\b(?:decided|decision|we will|we'll|going with|go with|instead of|chose|opted"
            r"|settled on|agreed|let's use|we use|switch(?:ed)? to)\b",
            re.I,
        ),
    ),
    ("todo", re.compile(r"\b(?:TODO|FIXME|XXX|still need to|follow-up|not yet done)\b")),
    (
        "plan",
        re.compile(
            r"\b(?:plan(?: is)?:|next step|next,|then I'?ll|I will|I'll now|we need to|steps?:)",
            re.I,
        ),
    ),
)
_SETTING_NAME = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b")
_SENTENCE = re.compile(r"[^\n.!?]*(?:[.!?](?=\s|$)|\n|$)")
_CODE_LINE = re.compile(r"^\s*(?:def |class |import |from \w+ import|return |@|#|//|\}|\{|\))")


# --- extraction ----------------------------------------------------------------------------------


def _line_at(text: str, start: int, end: int) -> str:
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    return text[line_start : len(text) if line_end < 0 else line_end]


class _Out:
    def __init__(self, text: str) -> None:
        self.text = text
        self.items: list[Evidence] = []
        self.keys: set[str] = set()

    def add(
        self, kind: str, value: str, key: str, start: int, end: int, *, subject: str = ""
    ) -> None:
        key = f"{kind}:{key}"
        if key in self.keys or not value.strip():
            return
        self.keys.add(key)
        line = _clip(_line_at(self.text, start, end), _MAX_LINE)
        self.items.append(
            Evidence(
                kind=kind,
                text=_clip(value, _MAX_TEXT),
                key=key,
                line=line,
                subject=subject,
                shape=shape_of(key) if kind in _SHAPED else "",
            )
        )


_SHAPED = frozenset({"error", "exit", "http_status", "test_tally", "signal", "error_code"})


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _errors(out: _Out, text: str) -> None:
    for m in _EXCEPTION.finditer(text):
        name = m.group(1).rsplit(".", 1)[-1]
        message = (m.group(2) or "").strip().rstrip(",")
        # "raise ValueError(f'...')" in source code is not an error that happened.
        before = text[max(0, m.start() - 12) : m.start()]
        if "raise " in before or "except " in before or text[m.end() : m.end() + 1] == "(":
            continue
        value = f"{name}: {message}" if message else name
        out.add("error", value, _norm(_clip(value, 160)), m.start(), m.end())
    for m in _DOTTED_EXCEPTION.finditer(text):
        name = m.group(1).rsplit(".", 1)[-1]
        value = f"{name}: {m.group(2).strip()}"
        out.add("error", value, _norm(_clip(value, 160)), m.start(), m.end())
    for m in _PYTEST_ASSERT.finditer(text):
        value = f"AssertionError: {m.group(1).strip()}"
        out.add("error", value, _norm(_clip(value, 160)), m.start(), m.end())
    for m in _ERROR_LINE.finditer(text):
        value = m.group(0).strip()
        if value.startswith("E "):
            value = value[1:].strip()
        out.add("error", value, _norm(_clip(value, 160)), m.start(), m.end())
    for m in _ERROR_CODE.finditer(text):
        code = m.group(0).strip("[] ")
        out.add("error_code", code, code.lower(), m.start(), m.end())
    for m in _ERROR_FIELD.finditer(text):
        code = m.group(1)
        # Only code-like values: `rate_limited`, `ERR_X`, `invalid-token`; not prose.
        if re.fullmatch(r"[A-Za-z][A-Za-z0-9]*(?:[_.-][A-Za-z0-9]+)+|[A-Z][A-Z0-9_]{3,}", code):
            out.add("error_code", code, code.lower(), m.start(), m.end())


def _http(out: _Out, text: str) -> None:
    for m in _HTTP.finditer(text):
        status = m.group(1) or m.group(3) or m.group(4)
        if not status or not 100 <= int(status) <= 599:
            continue
        reason = m.group(2) or m.group(5) or ""
        value = f"HTTP {status} {reason}".strip()
        out.add("http_status", value, status, m.start(), m.end())


_SQL_WORDS = frozenset(
    [
        "select",
        "from",
        "where",
        "and",
        "or",
        "not",
        "null",
        "the",
        "a",
        "an",
        "to",
        "of",
        "in",
        "on",
        "as",
        "is",
        "if",
        "exists",
        "set",
        "values",
        "only",
        "table",
        "index",
        "constraint",
        "unique",
        "key",
        "primary",
        "foreign",
        "references",
        "default",
        "check",
        "cascade",
        "concurrently",
        "public",
        "lateral",
    ]
)


_KNOWN_TOOLS = frozenset(
    [
        "python",
        "node",
        "npm",
        "pip",
        "psql",
        "postgres",
        "postgresql",
        "redis",
        "go",
        "rustc",
        "cargo",
        "java",
        "kubectl",
        "helm",
        "terraform",
        "docker",
        "django",
        "celery",
        "pytest",
        "ruby",
        "gcc",
        "clang",
        "nginx",
    ]
)


def _urls(out: _Out, text: str) -> None:
    for m in _URL.finditer(text):
        url = m.group(0).rstrip(".,:;!?")
        out.add("url", url, url.lower().rstrip("/"), m.start(), m.end())


def _shell_commands(out: _Out, text: str) -> None:
    for m in _COMMAND_PROMPT.finditer(text):
        command = m.group(1).strip()
        out.add("command", command, _norm(command), m.start(1), m.end(1))
    for m in _COMMAND_JSON.finditer(text):
        command = m.group(1).encode().decode("unicode_escape", errors="replace")
        out.add("command", command, _norm(command), m.start(1), m.end(1))


def _exits(out: _Out, text: str) -> None:
    for m in _EXIT.finditer(text):
        code = m.group(1)
        out.add("exit", f"exit status {code}", code, m.start(), m.end())
    for m in _SIGNAL.finditer(text):
        value = m.group(0)
        out.add("signal", value, _norm(value), m.start(), m.end())


def _prose(out: _Out, text: str) -> None:
    for m in _SENTENCE.finditer(text):
        sentence = m.group(0).strip()
        if len(sentence) < 12 or _CODE_LINE.match(sentence):
            continue
        for kind, pattern in _PROSE:
            if pattern.search(sentence):
                value = _clip(sentence, _MAX_TEXT)
                key = _norm(re.sub(r"[^\w\s]", " ", value))[:120]
                # A correction supersedes earlier values of the setting it names.
                named = _SETTING_NAME.search(sentence) if kind == "correction" else None
                subject = f"setting:{named.group(0).lower()}" if named else ""
                out.add(kind, value, key, m.start(), m.end(), subject=subject)
                break


# --- the fast paths --------------------------------------------------------------------------
#
# Python's regex engine tries a pattern at every position, so a dozen patterns over megabytes of
# tool output cost seconds. Two cheap passes keep it linear: patterns that need a trigger word
# run only on the lines containing one (found with str.find, in C), and the token-shaped kinds
# (paths, hashes, identifiers, versions, quantities, hosts, KEY=VALUE) come from one tokenizer
# pass classified by cheap string tests.

_TOKEN = re.compile(r"[^\s\"'`()\[\]{}<>,;|]+")
_DIGIT = re.compile(r"\d")
_EXT_SUFFIXES = tuple(
    "." + ext
    for ext in [
        "py",
        "pyi",
        "js",
        "mjs",
        "cjs",
        "jsx",
        "ts",
        "tsx",
        "go",
        "rs",
        "java",
        "kt",
        "rb",
        "php",
        "c",
        "h",
        "cc",
        "cpp",
        "hpp",
        "cs",
        "swift",
        "sql",
        "sh",
        "bash",
        "toml",
        "yaml",
        "yml",
        "json",
        "jsonl",
        "ini",
        "cfg",
        "conf",
        "env",
        "lock",
        "md",
        "rst",
        "txt",
        "log",
        "csv",
        "html",
        "htm",
        "css",
        "scss",
        "xml",
        "proto",
        "tf",
        "tfvars",
        "gradle",
        "pem",
        "crt",
        "service",
        "sock",
        "pid",
        "sqlite",
        "sqlite3",
        "ipynb",
        "whl",
        "gz",
        "tgz",
        "zip",
        "jar",
    ]
)
_BARE_FILES = frozenset({"Dockerfile", "Makefile", "Procfile", "Jenkinsfile", "Gemfile"})
_PATH_TOKEN = re.compile(r"(?:~|\.{1,2})?/?(?:[\w@+.-]+/)*[\w@+.-]*[\w@+-](?::\d+)*")
_HEX = re.compile(r"[0-9a-f]{7,40}")
_HEX_LETTER = re.compile(r"[a-f]")
_MIGRATION_TOKEN = re.compile(r"\d{4}_[a-z][a-z0-9_]*")
_TICKET_TOKEN = re.compile(r"[A-Z][A-Z0-9]{1,9}-\d{1,6}|#\d{2,6}")
_TAG_TOKEN = re.compile(r"v\d+\.\d+(?:\.\d+)?(?:-[\w.]+)?")
# Names that mean one specific thing: snake_case or CamelCase with a digit in them
# (`orders_archive_2025`, `QuotaResolver1418`). Each CamelCase part starts at its capital, so
# the pattern cannot backtrack exponentially on a long token.
_IDENT_TOKEN = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+")
_VERSION_TOKEN = re.compile(
    r"([A-Za-z][\w.+]*?)(==|>=|<=|~=|@|-)v?(\d+\.\d+(?:\.\d+){0,2}(?:(?:a|b|rc|\.post|\.dev)\d+)?)"
)
_NUMBER_VERSION = re.compile(r"v?\d+\.\d+(?:\.\d+){0,2}")
_UNITS = (
    r"ms|µs|us|ns|s|sec|seconds?|minutes?|mins?|hours?|h|days?|KiB|MiB|GiB|TiB|KB|MB|GB|TB"
    r"|kB|bytes|B|%|rps|qps|req/s|tokens|rows|cores|vCPU|Mi|Gi|m"
)
_QTY_TOKEN = re.compile(r"(\d+(?:[.,]\d+)*)(" + _UNITS + r")")
_QTY_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_QTY_NEXT = re.compile(r"[ \t](" + _UNITS + r"|requests per (?:second|minute))(?![\w/])")
_HOST_TOKEN = re.compile(
    r"((?:\d{1,3}\.){3}\d{1,3}|localhost|(?:[a-z0-9-]+\.)+[a-z][a-z0-9-]*|[a-z][a-z0-9-]*-[a-z0-9-]+)"
    r":(\d{2,5})",
    re.I,
)
_UPPER_SETTING = re.compile(r"([A-Z][A-Z0-9_]{2,})=(.+)")


def _tokens(out: _Out, text: str) -> None:
    previous = ""
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        prev, previous = previous, tok
        if tok.isalpha():
            if tok in _BARE_FILES:
                out.add("path", tok, tok, m.start(), m.end())
            continue
        core = tok.rstrip(".:!?*").lstrip("+-")
        if not core:
            continue
        start = m.start() + len(tok) - len(tok.lstrip("+-"))
        end = start + len(core)
        if ".." in core and "/" not in core:
            for part in core.split(".."):  # a commit range, 83db48f..bf269f4
                if _HEX.fullmatch(part) and _HEX_LETTER.search(part):
                    out.add("commit", part, part[:7], start, end)
            continue
        if "=" in core:
            setting = _UPPER_SETTING.fullmatch(core)
            if setting:
                name, _value = setting.group(1), setting.group(2)
                out.add(
                    "setting",
                    core,
                    core.lower(),
                    start,
                    end,
                    subject=f"setting:{name.lower()}",
                )
                continue
        if "://" in core:
            continue
        if "/" in core or core.endswith(_EXT_SUFFIXES):
            _path_token(out, core, start, end)
            continue
        if core.startswith(("FF_", "FEATURE_", "FLAG_")) or core.endswith("_enabled"):
            out.add("flag", core, core.lower(), start, end)
            continue
        if _DIGIT.search(core) is None:
            continue
        _digit_token(out, text, core, prev, start, end)


def _path_token(out: _Out, core: str, start: int, end: int) -> None:
    path = core.split("::", 1)[0]
    if path.startswith(_NOT_PATH_PREFIX) or "//" in path or not _PATH_TOKEN.fullmatch(path):
        return
    path = re.sub(r"(?::\d+)+$", "", path)
    if path.startswith(("a/", "b/")):
        path = path[2:]  # git diff's a/ and b/ sides
    if "/" in path:
        segments = [s for s in path.split("/") if s]
        last = segments[-1] if segments else ""
        has_ext = "." in last.lstrip(".")
        rooted = path.startswith(("/", "./", "../", "~/"))
        if not (has_ext or (rooted and len(segments) >= 2) or len(segments) >= 3):
            return
        if all(s.isdigit() for s in segments):
            return  # a date or a ratio
    out.add("path", path, path, start, end)


def _digit_token(out: _Out, text: str, core: str, prev: str, start: int, end: int) -> None:
    if _HEX.fullmatch(core) and _HEX_LETTER.search(core):
        out.add("commit", core, core[:7], start, end)
        return
    if _MIGRATION_TOKEN.fullmatch(core):
        out.add("migration", core, core.lower(), start, end)
        return
    if _TICKET_TOKEN.fullmatch(core):
        if core.startswith("#") and text[start - 1 : start] in ("[", "-"):
            return  # a summary's own citation, [#812-#840]
        if not core.startswith(("UTF-", "ISO-", "SHA-", "RFC-", "AES-", "TLS-", "SSL-", "HTTP-")):
            out.add("ticket", core, core.lower(), start, end)
        return
    if _TAG_TOKEN.fullmatch(core):
        out.add("tag", core, core.lower(), start, end)
        return
    version = _VERSION_TOKEN.fullmatch(core)
    if version:
        name, sep, number = version.groups()
        if name.lower() not in _VERSION_STOP and len(name) >= 2:
            shown = f"{name}{'==' if sep == '-' else sep}{number}"
            out.add(
                "version",
                shown,
                f"{name.lower()}=={number}",
                start,
                end,
                subject=f"version:{name.lower()}",
            )
        return
    if _IDENT_TOKEN.fullmatch(core):
        if not core.startswith(("test_", "call_")):
            out.add("identifier", core, core.lower(), start, end)
        return
    host = _HOST_TOKEN.fullmatch(core)
    if host and not host.group(1).lower().endswith(_EXT_SUFFIXES):
        out.add("host", core, core.lower(), start, end)
        return
    quantity = _QTY_TOKEN.fullmatch(core)
    if quantity:
        number, unit = quantity.groups()
        if not (unit in ("m", "s", "h", "B") and "." not in number and len(number) > 4):
            out.add("quantity", core, f"{number.replace(',', '')}{unit.lower()}", start, end)
        return
    if _QTY_NUMBER.fullmatch(core):
        unit_match = _QTY_NEXT.match(text, end)
        if unit_match:
            unit = unit_match.group(1)
            out.add(
                "quantity",
                f"{core} {unit}",
                f"{core.replace(',', '')}{unit.lower()}",
                start,
                unit_match.end(),
            )
            return
    if _NUMBER_VERSION.fullmatch(core):
        name = prev.rstrip(":")
        known = name.isalpha() and (name[0].isupper() or name.lower() in _KNOWN_TOOLS)
        if known and name.lower() not in _VERSION_STOP:
            number = core.lstrip("v")
            out.add(
                "version",
                f"{name} {number}",
                f"{name.lower()}=={number}",
                start,
                end,
                subject=f"version:{name.lower()}",
            )


def _lines_with(text: str, needles: tuple[str, ...], *, lowered: str | None = None) -> str:
    """The lines of `text` containing any of `needles` (searched in `lowered` when given)."""
    hay = text if lowered is None else lowered
    spans: set[int] = set()
    for needle in needles:
        pos = hay.find(needle)
        while pos >= 0:
            line_start = hay.rfind("\n", 0, pos) + 1
            spans.add(line_start)
            line_end = hay.find("\n", pos)
            if line_end < 0:
                break
            pos = hay.find(needle, line_end + 1)
    if not spans:
        return ""
    if len(spans) > 2000 and len(text) < 4096:
        return text
    lines = []
    for line_start in sorted(spans):
        line_end = text.find("\n", line_start)
        lines.append(text[line_start : len(text) if line_end < 0 else line_end])
    return "\n".join(lines)


_ERROR_NEEDLES = (
    "Error",
    "Exception",
    "Exit",
    "Interrupt",
    "Fault",
    "Warning",
    "Timeout",
    "Refused",
    "Denied",
    "NotFound",
    "DoesNotExist",
    "Violation",
    "errors.",
    "exceptions.",
    "\nE ",
    "ERROR",
    "FATAL",
    "PANIC",
    "error:",
    "fatal:",
    "panic:",
    "npm ERR!",
    "ERR_",
    "ECONN",
    "ENOENT",
    "EACCES",
    "EPERM",
    "EADDRINUSE",
    "EPIPE",
    "ETIMEDOUT",
    "EHOSTUNREACH",
    "ENOTFOUND",
    "EEXIST",
    "ENOMEM",
    "EAGAIN",
    "ERESOLVE",
    "SQLSTATE",
    "ORA-",
    "error[E",
    "BackOff",
    "ErrImage",
    "Evicted",
    '"code"',
    '"error',
    '"reason"',
)
_SHELL_NEEDLES = ("$ ", "❯ ", ">>> ", "% ", "# ")
_EXIT_NEEDLES = ("exit", "Exit", "EXIT", "] Error", "non-zero", "Killed", "fault", "SIG", "signal:")
_HTTP_NEEDLES = (
    "http/",
    "status",
    "bad request",
    "unauthorized",
    "forbidden",
    "not found",
    "conflict",
    "gone",
    "too many requests",
    "internal server error",
    "bad gateway",
    "service unavailable",
    "gateway timeout",
    "unprocessable",
    "payload too large",
    "method not allowed",
    "request timeout",
)
_SQL_NEEDLES = (
    "from ",
    "join ",
    "into ",
    "update ",
    "table",
    "truncate",
    "relation",
    "constraint",
    "index",
    "revision",
)
_MISC_NEEDLES = ("flag", "image:", "docker ", "passed", "failed", "ran ", "tests:", " = ")
_PROSE_NEEDLES = (
    "correction",
    "i was wrong",
    "scratch that",
    "turns out",
    "not ",
    "actually",
    "to correct",
    "root cause",
    "caused by",
    "because",
    "the problem",
    "the issue",
    "the bug",
    "the cause",
    "fixed by",
    "the fix",
    "decided",
    "decision",
    "we will",
    "we'll",
    "going with",
    "go with",
    "instead of",
    "chose",
    "opted",
    "settled on",
    "agreed",
    "let's use",
    "we use",
    "switch",
    "todo",
    "fixme",
    "xxx",
    "still need to",
    "follow-up",
    "not yet done",
    "plan",
    "next step",
    "next,",
    "then i",
    "i will",
    "i'll now",
    "we need to",
    "step",
)


def _sql(out: _Out, text: str) -> None:
    for m in _SQL_TABLE.finditer(text):
        keyword, quoted, name = m.group(1), m.group(2), m.group(3)
        if name.lower() in _SQL_WORDS or len(name) < 3:
            continue
        # In prose ("the table that ...") only a quoted or identifier-like name is a table.
        if keyword.islower() and not (quoted or re.search(r"[_\d]", name)):
            continue
        out.add("table", name, name.lower(), m.start(3), m.end(3))
    for m in _PSQL_TABLE.finditer(text):
        out.add("table", m.group(1), m.group(1).lower(), m.start(1), m.end(1))
    for m in _CONSTRAINT.finditer(text):
        name = m.group(1) or m.group(2)
        if name and name.lower() not in _SQL_WORDS and "_" in name:
            out.add("constraint", name, name.lower(), m.start(), m.end())
    for m in _INDEX.finditer(text):
        name = m.group(1)
        if name.lower() not in _SQL_WORDS and "_" in name:
            out.add("index", name, name.lower(), m.start(1), m.end(1))
    for m in _MIGRATION.finditer(text):
        if m.group(2):
            out.add("migration", m.group(2), m.group(2).lower(), m.start(), m.end())


def _misc(out: _Out, text: str) -> None:
    for m in _FLAG.finditer(text):
        name = m.group(3)
        if name:
            out.add("flag", name, name.lower(), m.start(), m.end())
    for m in _TAG.finditer(text):
        name = m.group(2) or m.group(3)
        if name:
            out.add("tag", name, name.lower(), m.start(), m.end())
    for m in _SETTING.finditer(text):
        name, value = m.group(3), (m.group(4) or "").strip()
        if name and value:
            out.add(
                "setting",
                f"{name}={value}",
                f"{name}={value}".lower(),
                m.start(),
                m.end(),
                subject=f"setting:{name.lower()}",
            )
    for m in _TALLY.finditer(text):
        value = m.group(0)
        if re.fullmatch(r"\d+ (?:tests?|total|warnings?)", value):
            continue
        out.add("test_tally", value, _norm(re.sub(r" in [\d.]+s$", "", value)), m.start(), m.end())


def _extract_uncached(text: str) -> tuple[Evidence, ...]:
    out = _Out(text)
    lowered = text.lower()

    def run(family: Callable[[_Out, str], object], subset: str) -> None:
        if subset:
            out.text = subset
            family(out, subset)

    if "://" in text:
        run(_urls, _lines_with(text, ("://",)))
    out.text = text
    _tokens(out, text)
    run(_shell_commands, text if '"command"' in text or '"cmd"' in text else "")
    run(_shell_commands, _lines_with(text, _SHELL_NEEDLES))
    run(_exits, _lines_with(text, _EXIT_NEEDLES))
    run(_errors, _lines_with(text, _ERROR_NEEDLES))
    run(_http, _lines_with(text, _HTTP_NEEDLES, lowered=lowered))
    run(_sql, _lines_with(text, _SQL_NEEDLES, lowered=lowered))
    run(_misc, _lines_with(text, _MISC_NEEDLES, lowered=lowered))
    run(_prose, _lines_with(text, _PROSE_NEEDLES, lowered=lowered))
    return tuple(out.items)


# Per-text caches: a run extracts each folded event for its summary and again for its loss
# report, and the summary's own lines many times (subjects, novelty). Short texts (summary
# lines, prose) come by the ten thousand in a long session and cost little to keep; long ones
# (tool output) by the thousand. A cache that overflows within one run makes the run
# superlinear in the session's size, so each is sized for a session of a few million tokens.
_SHORT_TEXT = 2_000
_extract_short = lru_cache(maxsize=65_536)(_extract_uncached)
_extract_long = lru_cache(maxsize=16_384)(_extract_uncached)


def extract(text: str, *, seq: int = 0) -> list[Evidence]:
    """Every evidence item in `text`, each key once, in kind order then position."""
    if not text:
        return []
    items = _extract_short(text) if len(text) <= _SHORT_TEXT else _extract_long(text)
    if not seq:
        return list(items)
    # The constructor, not dataclasses.replace: this runs for every item of every event.
    return [Evidence(i.kind, i.text, i.key, seq, i.line, i.subject, i.shape) for i in items]


def extract_many(texts: Iterable[tuple[int, str]]) -> list[Evidence]:
    """Evidence of several (seq, text) pairs; a key is reported once, at its first seq."""
    seen: set[str] = set()
    result: list[Evidence] = []
    for seq, text in texts:
        for item in extract(text, seq=seq):
            if item.key not in seen:
                seen.add(item.key)
                result.append(item)
    return result


# --- what a context still holds ------------------------------------------------------------------

_COUNT_MARK = re.compile(r"×\d+")


def collapsed_shapes(text: str) -> set[str]:
    """Shapes of the lines of `text` that say they stand for several repeats (`… ×40`)."""
    shapes: set[str] = set()
    for line in text.splitlines():
        mark = _COUNT_MARK.search(line)
        if mark:
            stem = line[: mark.start()].rstrip(" …")
            shapes.update(item.shape for item in extract(stem) if item.shape)
    return shapes


def _literal(item: Evidence) -> str:
    return item.key.split(":", 1)[1]


def present_literals(literals: Iterable[str], text: str) -> set[str]:
    """Which of `literals` occur in `text`: one Aho-Corasick pass over the text (in C), so a
    loss report over thousands of items and megabytes of context stays linear, where a
    substring search per item read the whole context once per item."""
    wanted = {literal for literal in literals if len(literal) >= 4}
    if not wanted or not text:
        return set()
    automaton = ahocorasick.Automaton()
    for literal in wanted:
        automaton.add_word(literal, literal)
    automaton.make_automaton()
    return {literal for _end, literal in automaton.iter(text)}


def held(item: Evidence, *, keys: set[str], present: set[str], shapes: set[str]) -> bool:
    """Whether a context whose evidence `keys`, literals found in its lowercased text
    (`present`, see `present_literals`) and collapsed `shapes` are given still holds `item`:
    the same key, the literal itself, or (for a repeated pattern) a line standing for all
    repeats of its shape."""
    if item.key in keys:
        return True
    if _literal(item) in present:
        return True
    return bool(item.shape) and item.shape in shapes


# Identifiers of one shape that come this many times or more are one series (`helper_1` …
# `helper_59` of a code listing): a reader counts the series once.
_SERIES_MIN = 4
_SERIES_KINDS = frozenset({"identifier"})


@dataclass(frozen=True)
class _Series:
    """Evidence standing for several items of one kind and shape: held when any of them is."""

    first: Evidence
    members: tuple[Evidence, ...]

    @property
    def kind(self) -> str:
        return self.first.kind

    @property
    def seq(self) -> int:
        return self.first.seq

    @property
    def text(self) -> str:
        last = self.members[-1]
        return f"{self.first.text} … {last.text} ({len(self.members)} alike)"


def _series_collapsed(items: list[Evidence]) -> list[Evidence | _Series]:
    groups: dict[tuple[str, str], list[Evidence]] = {}
    shapes = [item.shape or shape_of(item.text) for item in items]
    for item, shape in zip(items, shapes, strict=True):
        # Names numbered in a series (`helper_1`, `worker_12`); hashes, errors and their
        # numbers stay items of their own (each checksum, each bad row is a fact).
        if item.kind in _SERIES_KINDS and "#" in shape and _WORD.search(shape):
            groups.setdefault((item.kind, shape), []).append(item)
    series = {
        key: _Series(first=members[0], members=tuple(members))
        for key, members in groups.items()
        if len(members) >= _SERIES_MIN
    }
    result: list[Evidence | _Series] = []
    for item, shape in zip(items, shapes, strict=True):
        group = series.get((item.kind, shape))
        if group is None:
            result.append(item)
        elif group.first is item:
            result.append(group)
    return result


def _held_any(
    item: Evidence | _Series, *, keys: set[str], present: set[str], shapes: set[str]
) -> bool:
    if isinstance(item, _Series):
        return any(held(m, keys=keys, present=present, shapes=shapes) for m in item.members)
    return held(item, keys=keys, present=present, shapes=shapes)


def loss_report(
    *, folded: Iterable[tuple[int, str]], active: Iterable[str], max_dropped: int = 200
) -> dict[str, object]:
    """Which evidence of the `folded` (seq, text) pairs the `active` context texts still hold.

    `{evidenceBefore, evidenceKept, keptPercent, dropped: [{kind, text, seq}], droppedTotal,
    droppedReachable}`; `dropped` lists at most `max_dropped` items, in seq order. 100 % when
    nothing was folded. A series of items alike (one kind and shape, `_SERIES_MIN` or more)
    counts once. `droppedReachable` counts the dropped items whose event the context cites
    (`[#42]`, `[#40-#58]`: a summary line or a cleared output's placeholder): not present, but
    one `ledger_recall` away.
    """
    before = _series_collapsed(extract_many(folded))
    active_texts = list(active)
    keys: set[str] = set()
    for text in active_texts:
        keys.update(item.key for item in extract(text))
    joined = "\n".join(active_texts)
    members = [
        m for item in before for m in (item.members if isinstance(item, _Series) else (item,))
    ]
    present = present_literals((_literal(m) for m in members), joined.lower())
    shapes = collapsed_shapes(joined)
    cited = cited_ranges(active_texts)
    dropped = [
        item for item in before if not _held_any(item, keys=keys, present=present, shapes=shapes)
    ]
    kept = len(before) - len(dropped)
    return {
        "evidenceBefore": len(before),
        "evidenceKept": kept,
        "keptPercent": round(100 * kept / len(before), 1) if before else 100.0,
        "dropped": [
            {"kind": item.kind, "text": item.text, "seq": item.seq}
            for item in sorted(dropped, key=lambda i: i.seq)[:max_dropped]
        ],
        "droppedTotal": len(dropped),
        "droppedReachable": sum(1 for item in dropped if _cited(item.seq, cited)),
    }


# A citation as summary lines and placeholders write it: `[#42]` or `[#40-#57]` (groups: the
# first seq, the last when a range). The one spelling; the summarizer builds on it.
CITATION = r"\[#(\d+)(?:-#(\d+))?\]"
_CITATION = re.compile(CITATION)


def cited_ranges(texts: Iterable[str]) -> list[tuple[int, int]]:
    """The seq ranges the citations in `texts` name, merged and sorted."""
    spans = sorted(
        (int(m.group(1)), int(m.group(2) or m.group(1)))
        for text in texts
        for m in _CITATION.finditer(text)
    )
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _cited(seq: int, ranges: list[tuple[int, int]]) -> bool:
    k = bisect_right(ranges, (seq, sys.maxsize)) - 1
    return k >= 0 and ranges[k][0] <= seq <= ranges[k][1]


# --- salience: how much a line tells, measured against its own session ------------------------
#
# A line of tool output is worth keeping when it says something the rest of the session does
# not: its *template* (the line with its variable parts masked, as a log-template miner such as
# Drain groups lines) is rare, its *values* (identifiers, hashes, versions, paths, codes,
# numbers with units: the parts the mask removed) are rare, it reports a failure, or it is a
# command's outcome (exit status, summary line, first error). A line repeated hundreds of times
# with other numbers ("Downloading x-1.2.3 (12 kB)", "GET /health 200") is routine, whatever
# kind of evidence it carries. Nothing here knows a tool: the counts come from the session.
#
# Masking is Drain's: a token (split at blanks and commas) with a digit, a path separator, an
# underscore or an inner dot is a parameter, and so is a run of four or more punctuation marks
# (`.......`, `=====`); what is left (plain words, short punctuation) is the template.
# Lines are counted by template in one pass over each text (two `re.sub` calls and a split, in
# C), so a session of a million tokens is profiled in a fraction of a second; Drain's tree and
# similarity search would cost seconds in pure Python for the same grouping of these outputs.

_PARAMETER = re.compile(r"[^\w\s]{4,}|(?<![^\s,])(?=[^\s,]*(?:[\d/_]|\w\.\w))[^\s,]+")
_BLANKS = re.compile(r"[ \t\r\f\v]+")
# A parameter that is only a number, date or time tells little on its own (timestamps are
# unique on every log line); one with letters in it (an identifier, a hash, a path, a version,
# a code, a number with its unit) names a thing.
_PLAIN_NUMBER = re.compile(
    r"(?:[A-Za-z]+\()?[\d\W]*(?:[TZ][\d\W]*)*(?:[A-Za-zµ%]{1,3}\W*)?"  # Decimal('0.10') too
)
# A version replaced by another (`jackson-databind:2.13.4 -> 2.17.2`): a resolved conflict.
_REPLACED_VERSION = re.compile(r"\d[\w.]* -> \d")
# An HTTP response that failed (`HTTP/2 409`, nginx's `"POST /x HTTP/1.1" 504`).
_HTTP_FAILURE = re.compile(r"\bHTTP/[\d.]+\"? [45]\d\d\b")
# Source code quoted in output (a file read, a test's listing): its lines are unique without
# telling what happened.
_CODE_SHAPE = re.compile(
    r"^\s*(?:\d+\s*\|\s*|>\s*\d*\s*\|?\s*)?(?:def |class |import |from [\w.]+ import|return\b|if |for |while "
    r"|elif |else\b|try:|except\b|with |async |await |const |let |var |function |public "
    r"|private |func |fn |@\w|#include|\}|\)|\{|\w+ = |\w+\.\w+\(|raise |throw |\"\"\"|\'\'\'|// |/\* |\* )"
)
_SIGNAL_WORDS = (
    "error",
    "fail",
    "fatal",
    "panic",
    "exception",
    "denied",
    "refused",
    "conflict",
    "violat",
    "invalid",
    "missing",
    "not found",
    "no such",
    "does not exist",
    "timed out",
    "timeout",
    "exceeded",
    "exhausted",
    "insufficient",
    "unable",
    "cannot",
    "could not",
    "couldn't",
    "not allowed",
    "vulnerab",
    "cve-",
    "ghsa-",
    "critical",
    "severity: high",
    "crashloopbackoff",
    "imagepullbackoff",
    "back-off",
    "killed",
    "oom",
    "segfault",
    "sigsegv",
    "exited (",
    "upgrade failed",
    "rolled back",
    "rollback",
    "must be replaced",
    "forces replacement",
    "mismatch",
    "did not match",
    "warning",
    "unrecognized",
    "not recognized",
    "lossy",
    "deprecated",
    "abort",
    "crash",
    "bad ",
    "first bad commit",
    "●",  # jest's failing test
    "✕",
    "✖",
    "->",
)
# A command's outcome: its exit status or its closing summary (what the command concluded).
_OUTCOME = re.compile(
    r"\bexit(?:ed)?(?: with)?(?: status| code)?[:=]?\s*\(?-?\d|code=exited, status=\d|\bExited \(\d"
    r"|\bBUILD (?:FAILED|SUCCESS(?:FUL)?|FAILURE)\b|\b\d+ (?:failed|passed|errors?|problems?"
    r"|vulnerabilit\w+|tests? completed|warnings?)\b|\((?:\d+) rows?\)|\brows? in set\b"
    r"|\bPlan: \d|\bDone\. PASS=|\btest result:|\bTests?:\s+\d|\bTest Suites:|\bFound \d+ errors?"
    r"|\bTotal: \d|\bRan \d+ tests?|\b(?:OK|FAILED)(?: \(|$)|\bExecution Time:|\bis the first bad"
    r"|\bTests run: \d|\bcompleted with\b|\bAutomatic merge failed|\bUse% ",
    re.I,
)
_WORD = re.compile(r"[A-Za-z]{2}")
# An added line of a diff (`+TIMEOUT_MS=1500`): the state after the change. The removed line
# beside it is what the change replaced.
_DIFF_ADDED = re.compile(r"^\+(?!\+)\S")
_COMMAND_ECHO = re.compile(r"^\s*(?:\$|❯|>>>|\w+@[\w.-]+:[~\w/.-]*[$#])\s")


# What frames a line rather than tells: its margin (indentation, trailing blanks, pytest's `E`
# marker) and rules drawn with one mark repeated (pytest's `==== 1 failed in 2s ====` and
# `____ test_name ____`, a build tool's `-----`). A summary quotes a line without them (they
# cost a token per few marks), and a later run re-scores that quote against the session's
# counts, so templates are counted without them too: else an indented line repeated twenty
# times would look like news once quoted.
_RULE = re.compile(r"([=_*#~+.-])\1{3,}")
_FRAME_ENDS = re.compile(r"^(?:E )?(?:([=_*#~+.-])\1{3,} ?)?|(?: ?([=_*#~+.-])\2{3,})?$")


def quoted_line(line: str) -> str:
    """A line of tool output as a summary quotes it: blanks collapsed, without what frames it
    (its margin, pytest's `E` marker, rules drawn at its ends)."""
    line = " ".join(line.split())
    bare = _FRAME_ENDS.sub("", line)
    return bare if _WORD.search(bare) else line


# A line longer than this is read as several: a JSON document or a query string printed on one
# line holds many values, and a line clipped for quoting would keep only its first few. Cut at
# a JSON member's start (`,"key":`) when the line is a document, else at a separator, so each
# segment is a verbatim piece of the line that a summary can quote and a reader can find.
_LONG_LINE = 240
_SEGMENT = 160
_JSON_MEMBER = re.compile(r"(?<=[,{\[])\s*(?=\")")
_SEPARATORS = ",; &|"


def segmented(text: str) -> str:
    """`text` with each line longer than `_LONG_LINE` characters cut into verbatim segments,
    one a line (the text itself when no line is that long)."""
    if len(text) <= _LONG_LINE:
        return text
    lines = text.split("\n")
    if max(map(len, lines)) <= _LONG_LINE:
        return text
    out: list[str] = []
    for line in lines:
        if len(line) <= _LONG_LINE:
            out.append(line)
        else:
            out.extend(_segments(line))
    return "\n".join(out)


def _segments(line: str) -> list[str]:
    parts = _JSON_MEMBER.split(line) if line.lstrip()[:1] in "{[" else [line]
    segments: list[str] = []
    for part in parts:
        while len(part) > _SEGMENT:
            cut = max(part.rfind(mark, 0, _SEGMENT) for mark in _SEPARATORS)
            cut = cut + 1 if cut > _SEGMENT // 4 else _SEGMENT
            segments.append(part[:cut])
            part = part[cut:]
        # Brackets and short keys alone tell nothing: they join the next member.
        if segments and len(segments[-1].strip()) < 24:
            segments[-1] += part
        else:
            segments.append(part)
    return [segment for segment in segments if segment.strip()]


def template_of(line: str) -> str:
    """`line` with its parameters masked (`#`) and its blanks collapsed: its template."""
    return _masked(line)


def _masked(text: str) -> str:
    """The template of each line of `text`. Rules go first, anywhere in a line (one `re.sub` in
    C that starts only at a mark; a regex for a line's ends would be tried at every blank of
    megabytes); then, blanks collapsed, plain replacements drop the one blank left at either
    end of a line and pytest's marker."""
    text = _BLANKS.sub(" ", _RULE.sub("", f"\n{text}\n"))
    text = text.replace("\n ", "\n").replace("\nE ", "\n").replace(" \n", "\n")
    # A diff's `+`/`-` is structure, not part of the value after it: `+TIMEOUT_MS=1500` has
    # the template `+ #` of a changed setting, not the `#` of any listing's line.
    text = text.replace("\n+", "\n+ ").replace("\n-", "\n- ")
    return _PARAMETER.sub("#", text)[1:-1]


def parameters_of(line: str) -> list[str]:
    """The parameters the template of `line` masks (identifiers, numbers, paths, quotes)."""
    return [m.group(0).strip("'\"`,;:.()[]{}") for m in _PARAMETER.finditer(line)]


@dataclass(frozen=True)
class Candidate:
    """A line of one output worth offering to a summary, with how much it tells."""

    line: str  # whitespace-collapsed, clipped
    information: int
    outcome: bool  # an exit status or closing summary
    signal: bool  # reports a failure, a warning or a conflict
    index: int  # line number in its output
    repeats: int = 1  # lines of its template in the session
    template: str = ""  # its template (`template_of`), when known


class Salience:
    """What is routine in one session: lines per template, occurrences per parameter.

    Fed every text of the session once (`add`), then asked how much a line of it tells
    (`information`) or which lines of one output tell the most (`candidates`). Pure and
    deterministic; counts, not models.
    """

    def __init__(self, texts: Iterable[str] = ()) -> None:
        self.templates: Counter[str] = Counter()
        self.parameters: Counter[str] = Counter()
        self._masked: dict[str, list[str]] = {}
        for text in texts:
            self.add(text)

    def _masked_lines(self, text: str) -> list[str]:
        text = segmented(text)
        masked = self._masked.get(text)
        if masked is None:
            masked = _masked(text).split("\n")
            self._masked[text] = masked
        return masked

    def add(self, text: str) -> None:
        if not text:
            return
        # Counter.update over a list and findall both run in C: the profile of a session of
        # a million tokens costs a few tenths of a second.
        self.templates.update(self._masked_lines(text))
        self.parameters.update(_PARAMETER.findall(segmented(text)))

    def template_count(self, line: str) -> int:
        return self.templates.get(_masked(line), 0)

    def information(
        self,
        line: str,
        *,
        template_count: int | None = None,
        signal: bool | None = None,
        outcome: bool | None = None,
    ) -> tuple[int, bool, bool]:
        """(information, outcome, signal) of `line`: points for a rare template, for each
        rare parameter that names a thing, for reporting a failure, and for being an outcome."""
        count = self.template_count(line) if template_count is None else template_count
        # A template seen once is news; one seen hundreds of times is the tool's routine.
        if count <= 1:
            score = 4
        elif count <= 3:
            score = 2
        elif count <= 10:
            score = 0
        elif count <= 50:
            score = -1
        elif count <= 200:
            score = -2
        else:
            score = -3
        named = 0
        parameters = self.parameters
        for value in _PARAMETER.findall(line):
            seen = parameters.get(value, 0)
            if seen > 10:
                continue
            plain = _PLAIN_NUMBER.fullmatch(value) is not None
            if seen <= 1:
                named += 1 if plain else 4
            elif seen <= 3:
                named += 0 if plain else 2
            elif not plain:
                named += 1
        # A slot of a routine template takes a new value on every line (a request id, a
        # timestamp): there, a value seen once is the template's nature, not news.
        if count > 50:
            named = min(named, 2)
        elif count > 10:
            named = min(named, 4)
        if not _WORD.search(_PARAMETER.sub("", line)):
            score = 0  # a line that is all parameters (`celery==5.4.0`): its values tell
        score += min(named, 8)
        if signal is None:
            signal = _may_fail(line)
        if outcome is None or outcome:
            outcome = _OUTCOME.search(line) is not None
        if _CODE_SHAPE.match(line):
            score -= 6
        elif _DIFF_ADDED.match(line):
            score += 2  # an added line of a diff: what the change made
        if signal and outcome:
            score += 5  # a closing line that reports a failure (`1 failed`): one report, not two
        elif signal or outcome:
            score += 3
        elif not named:
            score -= 1  # a new sentence that names nothing and reports nothing
        return score, outcome, signal

    def rare_values(self, line: str, *, at_most: int = 3) -> list[str]:
        """The values of `line` (what its template masks) seen at most `at_most` times in the
        session; a short plain number (`45`) only when seen once."""
        parameters = self.parameters
        rare = []
        for value in _PARAMETER.findall(line):
            seen = parameters.get(value, 0)
            plain = _PLAIN_NUMBER.fullmatch(value) is not None
            if seen <= 1 or (
                seen <= at_most and (not plain or sum(ch.isdigit() for ch in value) >= 3)
            ):
                rare.append(value)
        return rare

    def has_unique_value(self, line: str) -> bool:
        """Whether `line` holds a value that names a thing (an id, a hash, a version, a path,
        a code) seen once in the whole session."""
        return any(
            self.parameters.get(value, 0) <= 1 and _PLAIN_NUMBER.fullmatch(value) is None
            for value in _PARAMETER.findall(line)
        )

    def candidates(self, text: str, *, limit: int = 16, minimum: int = 4) -> list[Candidate]:
        """The lines of `text` that tell the most, best first, at most `limit`, none below
        `minimum` points; a command's echo (`$ make test`) is never one alone: its outcome is
        (the echo joins a failure, just below it)."""
        return self.ranked(text, limit=limit, minimum=minimum)[0]

    def ranked(
        self, text: str, *, limit: int = 16, minimum: int = 4
    ) -> tuple[list[Candidate], list[Candidate]]:
        """`candidates`, plus the next-best lines (below `minimum` or past `limit`, never a
        command's echo), best first: what a summary with room left over may still quote. One
        scoring pass serves both, so asking for the spares costs a summary nothing extra.
        A long line is ranked as its segments (`segmented`)."""
        text = segmented(text)
        raw_lines = text.split("\n")
        masked = self._masked_lines(text)
        if len(masked) != len(raw_lines):  # pragma: no cover - the mask never spans lines
            masked = [template_of(line) for line in raw_lines]
        templates = self.templates
        # Which lines can reach `minimum`, found without scoring every line: a template seen
        # once (not source code), a parameter seen at most three times in the session, or a
        # failure / outcome word (found by str.find over the whole text, in C).
        starts = [0]
        for line in raw_lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        failing = _line_indices(text.lower(), (*_SIGNAL_WORDS, "->", "http/"), starts)
        # Lines the extractor finds an error, an error code, a signal or a failed exit on
        # report a failure whatever their words.
        failed_lines = {
            item.line
            for item in extract(text)
            if item.kind in _FAILURE_KINDS and item.key not in ("exit:0", "signal:")
        }
        concluding = _line_indices(text, _OUTCOME_NEEDLES, starts)
        maybe = failing | concluding
        parameters = self.parameters
        for m in _PARAMETER.finditer(text):
            if parameters.get(m.group(0), 0) <= 3:
                maybe.add(bisect_right(starts, m.start()) - 1)
        for index, template in enumerate(masked):
            if templates.get(template, 0) <= 1 and len(template) >= 4:
                maybe.add(index)
        found: list[Candidate] = []
        spare: list[Candidate] = []
        seen: set[str] = set()
        for index in sorted(maybe):
            raw = raw_lines[index]
            if _COMMAND_ECHO.match(raw):
                continue
            line = _clip(raw, _MAX_LINE)
            if not line or line in seen:
                continue
            count = templates.get(masked[index], 0)
            information, outcome, signal = self.information(
                raw,
                template_count=count,
                signal=(index in failing and _may_fail(raw)) or line in failed_lines,
                outcome=index in concluding,
            )
            seen.add(line)
            candidate = Candidate(line, information, outcome, signal, index, count, masked[index])
            (found if information >= minimum else spare).append(candidate)
        frames = own_frames(raw_lines)
        if frames:
            # A stack trace's frame in the project's own code says where the failure is: its
            # line outranks the framework frames around it, whose template it shares.
            for pool in (found, spare):
                for k, candidate in enumerate(pool):
                    if candidate.index in frames:
                        pool[k] = replace(
                            candidate, information=candidate.information + _OWN_FRAME_POINTS
                        )
            promoted = [c for c in spare if c.index in frames and c.information >= minimum]
            for candidate in promoted:
                spare.remove(candidate)
                found.append(candidate)
        found.sort(key=lambda c: (-c.information, c.index))
        spare.sort(key=lambda c: (-c.information, c.index))
        failures = [c for c in found if c.signal]
        if failures and _COMMAND_ECHO.match(raw_lines[0]):
            # The command that failed, just below its failure: its arguments (a run id, a
            # release, a file) name what the failure is about.
            echo = _clip(raw_lines[0], _MAX_LINE)
            found.insert(
                found.index(failures[0]) + 1,
                Candidate(echo, failures[0].information - 2, False, True, 0),
            )
        # A command's echo is offered only beside its failure, never as a spare on its own.
        past = [c for c in found[limit:] if not _COMMAND_ECHO.match(c.line)]
        return found[:limit], past + spare


_FAILURE_KINDS = frozenset({"error", "error_code", "exit", "signal"})
_OUTCOME_NEEDLES = (
    "xit",
    "status=",
    "BUILD",
    "failed",
    "passed",
    "error",
    "problem",
    "vulnerabilit",
    "completed",
    "warning",
    "row",
    "Plan:",
    "Done.",
    "test result",
    "Test",
    "Found",
    "Total",
    "Ran ",
    "OK",
    "FAILED",
    "Execution Time",
    "first bad",
    "Automatic merge",
    "Use%",
)


# A line of a stack trace, in the shapes runtimes print: Java/Kotlin/Node `at …`, Python
# `File "…", line N`, Rust/C++ `N: module::function` and `at path:line:col`, Go's tab-indented
# `/path/file.go:N +0x…`, .NET `in …:line N`.
_FRAME = re.compile(
    r"^\s*(?:at\s+\S|File \"[^\"]+\", line \d+|\d+:\s+\S+::|\S+\.\w{1,5}:\d+\s+\+0x|.*\bin \S+:line \d+)"
)
# Frames of runtimes, frameworks and installed packages rather than of the project's own code.
_LIBRARY_FRAME = re.compile(
    r"node_modules|site-packages|dist-packages|/usr/(?:local/)?lib/|/rustc/|\.cargo/registry"
    r"|node:internal|<frozen|<generated>|\$\$|/go/src/|/pkg/mod/|/vendor/|\bat (?:java|javax|jdk"
    r"|sun|kotlin|kotlinx|scala|akka|org\.(?:springframework|hibernate|apache|junit|gradle)"
    r"|io\.(?:netty|micrometer)|reactor|com\.(?:sun|fasterxml|zaxxer))\.|\b(?:std|core|alloc"
    r"|tokio|futures|hyper|tower)::|\bSystem\.|\bMicrosoft\.|\bruntime\.|\bruntime/"
)
_OWN_FRAME_POINTS = 4
# The first two segments of a frame's package (`at com.acme.billing.X.f(…)` → `com.acme.`).
_PACKAGE = re.compile(r"\bat ((?:[a-z][\w$]*\.){2})")


def own_frames(lines: list[str]) -> set[int]:
    """Indices of the frames of a stack trace in `lines` that say where it failed: the first
    frame not of a runtime, a framework or an installed package, and the first such after each
    `Caused by:` (Java's causes, the project's package first); in a Python traceback (most recent call last), the
    last such frame. Empty unless the text holds a trace of several frames."""
    frames = [k for k, line in enumerate(lines) if len(line) < 400 and _FRAME.match(line)]
    if len(frames) < 3:
        return set()
    own = [k for k in frames if not _LIBRARY_FRAME.search(lines[k])]
    if not own:
        return set()
    chosen = {own[0]}
    causes = [k for k, line in enumerate(lines) if line.lstrip().startswith("Caused by:")]
    if causes:
        # The root cause's own frame: one in the package of the first own frame (`com.acme`)
        # when there is one, a driver's or a library's not on the list otherwise.
        home = _PACKAGE.search(lines[own[0]])
        for start, end in zip(causes, [*causes[1:], len(lines)], strict=True):
            section = [k for k in own if start < k < end]
            mine = [k for k in section if home and home.group(1) in lines[k]]
            if mine or section:
                chosen.add((mine or section)[0])
    if any("most recent call last" in line for line in lines):
        chosen.add(own[-1])
    return chosen


def _line_indices(text: str, needles: Iterable[str], starts: list[int]) -> set[int]:
    """Indices of the lines of `text` (starting at `starts`) that contain any of `needles`."""
    found: set[int] = set()
    for needle in needles:
        if not needle:
            continue
        pos = text.find(needle)
        while pos >= 0:
            index = bisect_right(starts, pos) - 1
            found.add(index)
            end = starts[index + 1] if index + 1 < len(starts) else len(text)
            pos = text.find(needle, end)
    return found


def _may_fail(line: str) -> bool:
    lowered = line.lower()
    return (
        any(word in lowered for word in _SIGNAL_WORDS)
        or _REPLACED_VERSION.search(line) is not None
        or _HTTP_FAILURE.search(line) is not None
    )
