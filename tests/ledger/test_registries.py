"""sessions_app validates strategy and summarizer names without importing compaction_app;
these tests keep its lists equal to compaction_app's registries."""

import pytest

from compaction_app.strategies import strategy_names
from compaction_app.summarizers.registry import summarizer_names
from sessions_app.session_settings import STRATEGY_NAMES, SUMMARIZER_NAMES

pytestmark = pytest.mark.profile_independent


def test_it_knows_every_registered_strategy():
    assert sorted(STRATEGY_NAMES) == strategy_names()


def test_it_knows_every_registered_summarizer():
    assert sorted(SUMMARIZER_NAMES) == summarizer_names()
