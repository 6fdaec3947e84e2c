"""Long texts are counted in pieces, exactly: the sum over the pieces equals tiktoken's count
of the whole text, for both encodings, whatever the text; and counting a long text does not
build the whole list of token ids."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from sessions_app import tokens

pytestmark = pytest.mark.profile_independent

SAMPLES = [
    "def f(x):\n    return x + 1\n\nclass A:\n    pass\n",
    "Hello, world!\nIt's 42 o'clock.\n'tis fine\n\n\nNext\r\nline\r\n2024-01-01\n",
    "path/to/file.py:12\n/usr/bin/env\n./run.sh\n.\n/\nx/\n\n/abc\n",
    "Ünïcödé 文字 テキスト\nΑλφα 123456789\n😀 emoji\n\t\ttabs\n  spaces  \nend",
    "numbers 1234567 8901\n0x1F\n3.14159\n\n  \n\n9 lives\n'quoted'\n\"dq\"\n",
    "ALLCAPS WORDS\nCamelCase\nsnake_case\nkebab-case\n--flag=value\nKEY=VALUE\n",
]


def _corpus(seed: int, length: int) -> str:
    rng = random.Random(seed)
    parts = []
    while sum(map(len, parts)) < length:
        parts.append(rng.choice(SAMPLES))
        parts.append(rng.choice(["\n", " ", "\n\n", "\r\n", "", "\n/", "\n ", "\na", "\n1"]))
    return "".join(parts)[:length]


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("seed", range(6))
def test_it_counts_a_long_text_in_pieces_exactly(encoding, seed, monkeypatch):
    counter = tokens.get_counter(encoding)
    text = _corpus(seed, 40_000)
    whole = len(counter._enc.encode_ordinary(text))
    monkeypatch.setattr(tokens, "COUNT_CHUNK_CHARS", 97)
    pieces = list(tokens.split_at_piece_boundaries(text, 97))
    assert "".join(pieces) == text and len(pieces) > 100
    assert sum(len(counter._enc.encode_ordinary(piece)) for piece in pieces) == whole
    assert counter.count(text) == whole
    assert counter.count_batch([text, "short", ""]) == [whole, counter.count("short"), 0]


def test_it_keeps_a_text_without_a_safe_cut_whole():
    text = "x" * 1000
    assert list(tokens.split_at_piece_boundaries(text, 10)) == [text]


def test_it_counts_a_long_text_without_holding_every_token_id():
    counter = tokens.get_counter("o200k_base")
    size = 4 * 1024 * 1024
    text = ("lorem ipsum dolor sit amet src/app/main.py:42 ERROR 0x1f\n" * (size // 56 + 1))[:size]
    tracemalloc.start()
    try:
        counter.count(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Whole, the list of ids alone is ~9x the text; in pieces, about one piece's worth.
    assert peak < 2 * size
