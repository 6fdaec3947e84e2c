"""One long line of text is counted piece by piece, exactly (issue 22, row 14): tokenizing a
31 MB single-line event whole held every token id at once (≈ 20× the text)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from sessions_app import tokens

pytestmark = pytest.mark.profile_independent


def one_line(chars: int) -> str:
    rng = random.Random(14)
    words = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(3000)
    ]
    return " ".join(rng.choices(words, k=chars // 5))[:chars]


def test_it_counts_one_long_line_in_pieces_with_the_exact_count():
    text = one_line(3 * tokens.COUNT_CHUNK_CHARS)
    pieces = list(tokens.split_at_piece_boundaries(text))
    assert len(pieces) >= 3 and "".join(pieces) == text
    for encoding in ("cl100k_base", "o200k_base"):
        counter = tokens.get_counter(encoding)
        assert counter.count(text) == len(counter._enc.encode_ordinary(text))


# tracemalloc counts every thread of the process: the measurement runs in a fresh interpreter
# so that a server or worker thread left by another test in this process cannot add to it.
_MEASURE = """
import sys, tracemalloc
sys.path.insert(0, sys.argv[1])
from sessions_app import tokens
from tests.ledger.test_large_event_memory import one_line
text = one_line(4_000_000)
counter = tokens.get_counter("o200k_base")
counter.count("warm up")
tracemalloc.start()
counter.count(text)
print(tracemalloc.get_traced_memory()[1], len(text))
"""


def test_it_counts_a_multi_megabyte_line_within_a_small_multiple_of_its_size():
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(root)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    peak, size = (int(value) for value in out.split())
    assert peak < 2 * size, f"{peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB text"
