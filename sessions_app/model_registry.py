"""Model context windows and prices from the ``genai-prices`` package's bundled snapshot.

Only the data shipped inside the installed package is read: its auto-update would fetch from the
network, which this service never does at run time. Settings may override or add windows.

Pure module: no Django imports.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sessions_app.tokens import resolve_encoding

if TYPE_CHECKING:  # pragma: no cover - typing only
    from genai_prices import types as gp_types
    from genai_prices.data_snapshot import DataSnapshot

__all__ = [
    "DEFAULT_OVERRIDES",
    "PREFERRED_PROVIDERS",
    "ModelInfo",
    "ModelRegistry",
    "default_registry",
]

# genai-prices has no plain "gemini-3-pro" entry (only previews without a window), and lists
# Gemini 2.5 Pro and the 3 / 3.1 Pro previews (Gemini CLI's defaults) without one: their input
# limits as Google's model pages give them.
DEFAULT_OVERRIDES: dict[str, int] = {
    "gemini-3-pro": 1_000_000,
    "gemini-2.5-pro": 1_048_576,
    "gemini-3-pro-preview": 1_048_576,
    "gemini-3.1-pro-preview": 1_048_576,
}

# First-party providers win over resellers and aggregators that list the same model id.
PREFERRED_PROVIDERS = ("openai", "anthropic", "google")

# Model names come from API clients; bound the memo so junk names cannot grow it forever.
_LOOKUP_CACHE_MAX = 4096


@dataclass(frozen=True)
class ModelInfo:
    model: str
    context_limit: int
    encoding: str
    native_encoding: bool
    provider: str | None = None
    """genai-prices provider id the window came from; None for an override."""
    canonical_id: str | None = None
    """genai-prices model id the name resolved to; None for an override."""


@functools.cache
def _providers() -> tuple[gp_types.Provider, ...]:
    # Deferred: parsing the bundled snapshot takes ~0.2 s, paid on first lookup only.
    from genai_prices.data import providers

    return tuple(providers)


@functools.cache
def _snapshot() -> DataSnapshot:
    # A snapshot of our own over the bundled data, so a process-wide custom snapshot (set by
    # genai-prices' updater, should anything start it) never changes our answers.
    from genai_prices.data_snapshot import DataSnapshot

    return DataSnapshot(providers=list(_providers()), from_auto_update=False)


def _ordered_providers(first: gp_types.Provider | None = None) -> Iterator[gp_types.Provider]:
    providers = _providers()
    seen: set[str] = set()
    preferred = [p for pid in PREFERRED_PROVIDERS for p in providers if p.id == pid]
    for provider in [*([first] if first is not None else []), *preferred, *providers]:
        if provider.id not in seen:
            seen.add(provider.id)
            yield provider


def _provider_by_id(provider_id: str) -> gp_types.Provider | None:
    from genai_prices.data_snapshot import find_provider_by_id

    return find_provider_by_id(list(_providers()), provider_id)


def _provider_for_ref(ref: str) -> gp_types.Provider | None:
    for provider in _providers():
        if provider.model_match is not None and provider.model_match.is_match(ref):
            return provider
    return None


def _encoding_for(requested: str, canonical: str | None) -> tuple[str, bool]:
    choice = resolve_encoding(requested)
    if not choice.native and canonical:
        # An alias the prefix rules do not know may still resolve to a known OpenAI model id.
        by_id = resolve_encoding(canonical)
        if by_id.native:
            return by_id.encoding, True
    return choice.encoding, choice.native


def _normalize(model: str) -> str:
    return model.strip().lower()


_CLEAN_NAME = re.compile(r"[a-z0-9][a-z0-9.:_-]*[a-z0-9]")
# A starts-with clause like "claude-sonnet-4-2025" is a stub for dated names, not a name.
_DATE_STUB = re.compile(r"-\d{4}(?:-\d{2})?$")


def _aliases(model: gp_types.ModelInfo) -> Iterator[str]:
    from genai_prices import types as gp

    def walk(clause: object, *, exact_only: bool) -> Iterator[str]:
        if isinstance(clause, gp.ClauseEquals):
            yield clause.equals
        elif isinstance(clause, gp.ClauseStartsWith) and not exact_only:
            if not _DATE_STUB.search(clause.starts_with):
                yield clause.starts_with
        elif isinstance(clause, gp.ClauseOr):
            for child in clause.or_:
                yield from walk(child, exact_only=exact_only)

    for name in walk(model.match, exact_only=False):
        name = name.lower()
        if name != model.id and _CLEAN_NAME.fullmatch(name) and model.is_match(name):
            yield name


class ModelRegistry:
    """Context windows by model name: overrides first, then genai-prices' bundled data.

    ``overrides`` are merged over :data:`DEFAULT_OVERRIDES` (names are case-insensitive).
    """

    def __init__(self, overrides: Mapping[str, int] | None = None) -> None:
        merged: dict[str, int] = {}
        for name, limit in {**DEFAULT_OVERRIDES, **(overrides or {})}.items():
            if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
                raise ValueError(f"context window for {name!r} must be a positive int: {limit!r}")
            merged[_normalize(name)] = limit
        self._overrides = merged
        self._cache: dict[str, ModelInfo | None] = {}
        self._all: list[ModelInfo] | None = None
        self._all_lock = threading.Lock()

    def lookup(self, model: str) -> ModelInfo | None:
        """The model's window and encoding, or None when no context window is known for it.

        Accepts provider-prefixed names (``openai/gpt-4o``) and the dotted/dashed variants that
        genai-prices' match clauses accept (``claude-3.5-sonnet``).
        """
        # Memoized by the spelling given, so ModelInfo.model always echoes the caller's name.
        requested = model.strip()
        if requested in self._cache:
            return self._cache[requested]
        info = self._resolve(requested, requested.lower()) if requested else None
        if len(self._cache) >= _LOOKUP_CACHE_MAX:
            self._cache.clear()
        self._cache[requested] = info
        return info

    def _resolve(self, requested: str, key: str) -> ModelInfo | None:
        bare = key.rsplit("/", 1)[-1]
        for ref in dict.fromkeys((key, bare)):
            limit = self._overrides.get(ref)
            if limit is not None:
                encoding, native = _encoding_for(requested, None)
                return ModelInfo(requested, limit, encoding, native)

        found = self._find_in_data(key, bare)
        if found is None:
            return None
        provider, model = found
        assert model.context_window is not None
        encoding, native = _encoding_for(requested, model.id)
        return ModelInfo(
            model=requested,
            context_limit=model.context_window,
            encoding=encoding,
            native_encoding=native,
            provider=provider.id,
            canonical_id=model.id,
        )

    @staticmethod
    def _find_in_data(key: str, bare: str) -> tuple[gp_types.Provider, gp_types.ModelInfo] | None:
        if "/" in key:
            prefix, rest = key.split("/", 1)
            named = _provider_by_id(prefix)
            if named is not None:
                model = named.find_model(rest, all_providers=list(_providers()))
                if model is not None and model.context_window is not None:
                    return named, model
        # The whole ref first (aggregators list "vendor/model" ids), then without the prefix.
        for ref in dict.fromkeys((key, bare)):
            # Some entries lack a window (e.g. a preview) while a reseller's entry for the same
            # model has one, so keep looking past a window-less match.
            for provider in _ordered_providers(_provider_for_ref(ref)):
                model = provider.find_model(ref)
                if model is not None and model.context_window is not None:
                    return provider, model
        # Some listed ids no match clause accepts (a reseller's "glm-4p7"): the id as listed by
        # all_models() must still resolve, or GET /models would offer names sessions refuse.
        for ref in dict.fromkeys((key, bare)):
            for provider in _ordered_providers():
                for model in provider.models:
                    if model.id.lower() == ref and model.context_window is not None:
                        return provider, model
        return None

    def all_models(self) -> list[ModelInfo]:
        """Every model with a known window, one entry per name, overrides included, sorted."""
        if self._all is None:
            with self._all_lock:
                if self._all is None:
                    self._all = self._build_all()
        return list(self._all)

    def _build_all(self) -> list[ModelInfo]:
        entries: dict[str, ModelInfo] = {}
        seen: set[str] = set()  # lower-cased: lookups are case-insensitive, ids are not
        for provider in _ordered_providers():
            for model in provider.models:
                if model.context_window is None or model.id in entries:
                    continue
                name = model.id.lower()
                # A session named by this id gets what lookup() answers, which may be another
                # provider's entry (a first party's clause, an aggregator's "vendor/model" id,
                # the same id in another case): list that. Only ids another provider could
                # claim are looked up (a full lookup of every id takes seconds).
                if (
                    "/" in name
                    or name in seen
                    or any(
                        other.id != provider.id
                        and other.model_match is not None
                        and other.model_match.is_match(name)
                        for other in _providers()
                    )
                ):
                    info = self.lookup(model.id)
                    if info is not None:
                        entries[model.id] = info
                        seen.add(name)
                        continue
                encoding, native = _encoding_for(model.id, None)
                entries[model.id] = ModelInfo(
                    model=model.id,
                    context_limit=model.context_window,
                    encoding=encoding,
                    native_encoding=native,
                    provider=provider.id,
                    canonical_id=model.id,
                )
                seen.add(name)
        # First-party spellings such as "claude-3.5-sonnet" are names clients really send, so
        # list them too, but only when a lookup of the spelling lands on the same entry.
        for provider in _ordered_providers():
            if provider.id not in PREFERRED_PROVIDERS:
                continue
            for model in provider.models:
                if model.context_window is None:
                    continue
                for alias in _aliases(model):
                    if alias in entries:
                        continue
                    info = self.lookup(alias)
                    if info is not None and info.canonical_id == model.id:
                        entries[alias] = info
        for name, limit in self._overrides.items():
            encoding, native = _encoding_for(name, None)
            entries[name] = ModelInfo(name, limit, encoding, native)
        return [entries[name] for name in sorted(entries)]


@functools.cache
def default_registry() -> ModelRegistry:
    """A process-wide registry with only :data:`DEFAULT_OVERRIDES` (no settings applied)."""
    return ModelRegistry()
