"""The environment a benchmark's child process runs Django in."""

from __future__ import annotations

import os
from pathlib import Path


def child_env(*, var_dir: Path) -> dict[str, str]:
    """The caller's environment with the embedded profile's SQLite in a throwaway `var_dir`
    (never the dev database), no throttling, a body limit large enough for a whole session,
    and quiet logs. A child that wants PostgreSQL sets DATABASE_URL itself."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "API_THROTTLE_RATE": "off",
        "API_MAX_BODY_BYTES": str(512 * 1024 * 1024),
        "DJANGO_LOG_LEVEL": "WARNING",
        "EMBEDDED_WORKER": "false",
    }
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    env["VAR_DIR"] = str(var_dir)
    return env
