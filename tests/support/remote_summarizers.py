"""The OpenAI and Anthropic summarizers as their tests build them: one `Remote` per provider,
pointed at the provider stand-in."""

from __future__ import annotations

from dataclasses import dataclass

from compaction_app.summarizers.anthropic_summarizer import AnthropicSummarizer
from compaction_app.summarizers.base import SummaryMessage
from compaction_app.summarizers.openai_summarizer import OpenAISummarizer
from compaction_app.summarizers.provider import ProviderSummarizer
from compaction_app.testkit.provider_standin import ProviderStandIn
from tests.support.helpers import rough_token_count


@dataclass(frozen=True)
class Remote:
    summarizer: type[ProviderSummarizer]
    api_key: str
    model: str

    def url(self, fake: ProviderStandIn) -> str:
        """The stand-in's root for this provider's wire format (`openai_url`, `anthropic_url`)."""
        return getattr(fake, f"{self.summarizer.name}_url")

    def make(self, fake: ProviderStandIn, **overrides: object) -> ProviderSummarizer:
        options: dict[str, object] = {
            "count_tokens": rough_token_count,
            "api_key": self.api_key,
            "base_url": self.url(fake),
            "model": self.model,
            "timeout_seconds": 5.0,
        }
        options.update(overrides)
        return self.summarizer(**options)  # type: ignore[arg-type]


REMOTES = {
    "openai": Remote(
        summarizer=OpenAISummarizer, api_key="sk-test-secret-key", model="gpt-4o-mini"
    ),
    "anthropic": Remote(
        summarizer=AnthropicSummarizer,
        api_key="sk-ant-test-secret-key",
        model="claude-3-5-sonnet-latest",
    ),
}

# The turn every summarizer test starts from.
USER_TURN = SummaryMessage(
    event_id="e1", type="USER_MESSAGE", role="user", content="Fix bug #42 in src/app.py"
)
