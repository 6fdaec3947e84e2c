"""When and how much to compact: the one policy (pure: no ORM, no Django settings).

Every rule that decides when a session compacts and what a compaction aims for lives here:

- **the level** of a window (`Policy.level`: `sessions_app.context_window.window_level`, the
  one window computation every surface shows);
- **the trigger**: an append that brings the context to `compactThreshold` asks for an auto
  run, at most once per `cooldownSeconds`; at the hard limit the cooldown no longer holds
  (`Policy.auto_trigger`);
- **the target**: a compaction in the call path (the gateway, `POST /context`) compacts down
  to `fitTargetRatio` of the window, never above `compactThreshold` (`Policy.target_ratio`);
- **the summary's bound** (`summary_bound`): the user's `maxSummaryTokens` exactly, or on the
  auto budget 5 % of the window within 2,048 … 16,384 tokens (the scale the anchors keep: a
  handoff summary of 10–20k tokens), and never more than an eighth of a small window (at
  least 256) so a small window keeps room for the conversation;
- **the room rule** (`Policy.budget`): what the target leaves once the system prompt, the user
  messages, the pinned events and the summary's bound are counted goes to the newest turns
  kept whole, then to more lines in the placeholders of cleared tool outputs; never to a
  bigger summary. A run outside the call path (manual, auto, refresh) gives recent work at
  most `RECENT_SHARE` of the agent's and the tools' work it could fold, so that it compacts:
  where that work dominates, it leaves well under half of what it started from.

docs/fitting.md ("The policy") states the rule with a worked example.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from compaction_app.types import Budget
from sessions_app.context_window import WindowLevel, window_level
from sessions_app.session_settings import SessionSettings

__all__ = [
    "AUTO_SUMMARY_MAX",
    "AUTO_SUMMARY_MIN",
    "AUTO_SUMMARY_SHARE",
    "RECENT_SHARE",
    "SMALL_WINDOW_FLOOR",
    "SMALL_WINDOW_SHARE",
    "AutoTrigger",
    "Policy",
    "summary_bound",
]

# The auto summary bound: this share of the window, within [AUTO_SUMMARY_MIN, AUTO_SUMMARY_MAX].
AUTO_SUMMARY_SHARE = 0.05
AUTO_SUMMARY_MIN = 2_048
AUTO_SUMMARY_MAX = 16_384
# In a small window the summary takes at most this share of it (never less than the floor):
# 2,048 tokens of a 4,000-token window would leave the conversation nothing.
SMALL_WINDOW_SHARE = 8  # an eighth
SMALL_WINDOW_FLOOR = 256
# Outside the call path, the newest turns kept whole beyond keepRecentEvents take at most this
# share of the agent's and the tools' work the run could fold (Gemini CLI keeps its newest
# 30 % of the history verbatim): the rest is folded, so a manual compaction of a session where
# that work dominates leaves well under half of what it started from.
RECENT_SHARE = 0.2


def summary_bound(*, context_limit: int, max_summary_tokens: int | None) -> int:
    """The most tokens a summary may hold in a window of `context_limit`: the user's number
    exactly, or the auto bound."""
    if max_summary_tokens is not None:
        return int(max_summary_tokens)
    auto = int(context_limit * AUTO_SUMMARY_SHARE)
    auto = max(AUTO_SUMMARY_MIN, min(AUTO_SUMMARY_MAX, auto))
    small = max(SMALL_WINDOW_FLOOR, context_limit // SMALL_WINDOW_SHARE)
    return min(auto, small)


@dataclass(frozen=True)
class AutoTrigger:
    """What an append that left the context at `level` asks for: nothing (`trigger` None), an
    auto run, or, past the hard limit within the cooldown, a hard-limit run."""

    trigger: str | None
    # Only a hard-limit run within the cooldown needs a plan that folds something (else it
    # would run for nothing on every append).
    needs_plan: bool = False


@dataclass(frozen=True)
class Policy:
    """A session's compaction policy, from its typed settings."""

    auto_compact: bool = True
    compact_threshold: float = 0.80
    hard_threshold: float = 0.95
    fit_target_ratio: float = 0.5
    cooldown_seconds: int = 60
    max_summary_tokens: int | None = None
    keep_recent_events: int = 2

    @classmethod
    def of(cls, settings: SessionSettings) -> Policy:
        return cls(
            auto_compact=settings.auto_compact,
            compact_threshold=settings.compact_threshold,
            hard_threshold=settings.hard_limit_threshold,
            fit_target_ratio=settings.fit_target_ratio,
            cooldown_seconds=settings.cooldown_seconds,
            max_summary_tokens=settings.max_summary_tokens,
            keep_recent_events=settings.keep_recent_events,
        )

    # --- the level ---------------------------------------------------------------------------

    def level(self, *, tokens: int, window: int) -> WindowLevel:
        """`tokens` against `window` under these thresholds (the one window computation)."""
        return window_level(
            tokens=tokens,
            window=window,
            compact_threshold=self.compact_threshold,
            hard_threshold=self.hard_threshold,
        )

    # --- the trigger -------------------------------------------------------------------------

    def auto_trigger(
        self,
        *,
        level: WindowLevel,
        last_auto_at: datetime | None,
        auto_active: bool,
        now: datetime,
        auto: str = "auto",
        hard_limit: str = "hard_limit",
    ) -> AutoTrigger:
        """Whether an append that left the context at `level` starts a run: at the compact
        threshold, once per cooldown (`last_auto_at`: the session's latest auto run; an auto
        run pending or running counts as within the cooldown); past the hard limit the context
        no longer fits, so a hard-limit run goes ahead within the cooldown, if it folds
        something."""
        if not self.auto_compact or not level.near_limit:
            return AutoTrigger(None)
        cooling = auto_active or (
            last_auto_at is not None
            and now - last_auto_at < timedelta(seconds=self.cooldown_seconds)
        )
        if not cooling:
            return AutoTrigger(auto)
        if level.at_limit:
            return AutoTrigger(hard_limit, needs_plan=True)
        return AutoTrigger(None)

    # --- the target --------------------------------------------------------------------------

    @property
    def target_ratio(self) -> float:
        """The low-water mark a call-path compaction compacts down to: `fitTargetRatio`, never
        above the compact threshold itself (a session may lower compactThreshold below it)."""
        return min(self.fit_target_ratio, self.compact_threshold)

    def target_tokens(self, window: int, ratio: float | None = None) -> int:
        """The tokens a compaction aims for in `window`: `ratio` (a run's own mark), else the
        policy's target."""
        return int(window * (self.target_ratio if ratio is None else ratio))

    def call_path_ratio(self, *, window: int, context_limit: int) -> float:
        """The target as a ratio of the session's own limit when fitting to a smaller
        `window` (a client's maxTokens, reserved tokens): the run aims where this window's
        target falls."""
        if context_limit <= 0:
            return self.target_ratio
        return max(min(self.target_tokens(window) / context_limit, 1.0), 0.01)

    def reaches(self, *, tokens: int, window: int, ratio: float) -> bool:
        """Whether a plan leaving `tokens` in `window` reaches the mark `ratio`."""
        return tokens <= self.target_tokens(window, ratio)

    # --- the summary's bound and the room rule -----------------------------------------------

    def summary_bound(self, context_limit: int) -> int:
        return summary_bound(
            context_limit=context_limit, max_summary_tokens=self.max_summary_tokens
        )

    def budget(
        self,
        *,
        context_limit: int,
        target_ratio: float | None = None,
        call_path: bool = False,
    ) -> Budget:
        """What a run must reach and the room it may give recent work.

        `target_ratio`: the run's own mark (a call-path compaction's fitTargetRatio), else the
        compact threshold (what trim reaches, what summarize must get under). The room is
        measured below the policy's target (fitTargetRatio) in every case; a call-path run
        (`call_path`) must reach its mark (`strict_target`: it folds older user turns too) and
        gives recent work all of the room, any other run at most RECENT_SHARE of the work it
        could fold."""
        ratio = self.compact_threshold if target_ratio is None else target_ratio
        return Budget(
            context_limit=context_limit,
            target_tokens=self.target_tokens(context_limit, ratio),
            max_summary_tokens=self.summary_bound(context_limit),
            room_target_tokens=self.target_tokens(context_limit, min(self.target_ratio, ratio)),
            recent_share=None if call_path else RECENT_SHARE,
            keep_recent_events=self.keep_recent_events,
            strict_target=call_path,
        )
