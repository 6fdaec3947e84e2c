"""Django settings. Everything that varies between machines comes from environment variables.

No variables set → the embedded profile: SQLite (WAL) in ./var, in-memory channel layer, an
in-memory Celery broker with a worker thread inside the server process. `DATABASE_URL` and
`REDIS_URL` switch to the production profile (PostgreSQL, channels_redis, Redis broker).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import dj_database_url
from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from config.env import (
    context_windows,
    env_bool,
    env_float,
    env_int,
    env_json,
    env_list,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if env_str("DATABASE_URL"):
        raise ImproperlyConfigured("DJANGO_SECRET_KEY is required in the production profile")
    # The embedded profile is for one machine; a fixed key keeps logins across restarts.
    SECRET_KEY = "embedded-profile-insecure-key-change-me-for-production-0123456789"
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# --- Deployment behind TLS (all off by default: the embedded profile serves plain HTTP) ------
# `manage.py check --deploy --fail-level WARNING` passes once these are set (CI checks it).
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", False)
# Behind a proxy that terminates TLS the request reaches us as plain HTTP; trusting the proxy's
# X-Forwarded-Proto is what keeps SECURE_SSL_REDIRECT from looping. Only set this when the proxy
# always overwrites that header (a client could otherwise claim https itself).
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https")
    if env_bool("DJANGO_SECURE_PROXY_SSL_HEADER", False)
    else None
)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "channels",
    "sessions_app",
    "compaction_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "sessions_app.middleware.BodySizeLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Failed logins are throttled per username and per address (429 lockout).
    "compaction_app.dashboard.login_throttle.LoginThrottleMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # The dashboard shows times in the viewer's zone (the ledger_tz cookie).
    "compaction_app.dashboard.timezone.ViewerTimezoneMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
# WAL lets readers run while one writer appends; IMMEDIATE takes the write lock at BEGIN so
# concurrent appenders queue on busy_timeout instead of deadlocking on a read-to-write lock
# upgrade.
SQLITE_OPTIONS = {
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
}
DB_POOL_MAX_SIZE = env_int("DB_POOL_MAX_SIZE", 10, minimum=1)
DB_POOL_MIN_SIZE = env_int("DB_POOL_MIN_SIZE", 2, minimum=0)
DB_POOL_TIMEOUT_SECONDS = env_float("DB_POOL_TIMEOUT_SECONDS", 10.0, minimum=0.1)
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
    if "postgresql" in DATABASES["default"]["ENGINE"]:
        # Under ASGI every request may run on a different thread, and a persistent connection
        # per thread piles up to max_connections; a per-process pool bounds them instead
        # (pooling requires conn_max_age=0: a connection goes back when the request ends).
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": min(DB_POOL_MIN_SIZE, DB_POOL_MAX_SIZE),
            "max_size": DB_POOL_MAX_SIZE,
            # A request that cannot get a connection in this time fails instead of queueing.
            "timeout": DB_POOL_TIMEOUT_SECONDS,
        }
    else:
        # A SQLite URL (a second process on the embedded profile's file): the same options.
        DATABASES["default"]["OPTIONS"] = dict(SQLITE_OPTIONS)
    # Per-process test database, so parallel test runs on one machine never share one.
    DATABASES["default"]["TEST"] = {"NAME": f"test_ledger_{os.getpid()}"}
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(VAR_DIR / "db.sqlite3"),
            "OPTIONS": dict(SQLITE_OPTIONS),
            # A file, not :memory:, so live-server and worker threads share the test database.
            "TEST": {"NAME": str(VAR_DIR / f"test_db_{os.getpid()}.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: channel layer, Celery broker, cache ---------------------------------------------
# Under pytest each process gets its own queue, channel prefix and cache prefix (like its own
# test database), so two test runs sharing one Redis, or the parallel workers of one run (the
# suite runs under pytest-xdist), never consume each other's tasks or share throttle counters;
# a prefix given in the environment is suffixed too.
_TEST_SUFFIX = f"-test-{os.getpid()}" if "pytest" in sys.modules else ""
REDIS_URL = env_str("REDIS_URL")
# How long connecting to Redis may take before the caller gives up: a broadcast, a throttle
# lookup or an enqueue during an outage fails in this time instead of holding the request.
REDIS_CONNECT_TIMEOUT_SECONDS = env_float("REDIS_CONNECT_TIMEOUT_SECONDS", 2.0, minimum=0.1)
# Probe an idle connection after 5 s, every 2 s, give up after 3 unanswered (Linux names).
_REDIS_KEEPALIVE = {
    getattr(socket, name): value
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3))
    if hasattr(socket, name)
}
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "compaction_app.realtime.layers.LedgerRedisChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        # No socket timeout. With one, redis-py wraps each write in
                        # asyncio.wait_for, which on Python 3.11 drops a cancellation that
                        # lands as the write completes (fixed in 3.12): a websocket closed
                        # right after connecting left its receive blocking on Redis forever.
                        # (redis-py's default, 5 s, also equals the BZPOPMIN block of a
                        # websocket's receive, so idle sockets closed with 1011.) A receive
                        # still returns every 5 s from the server's side; a restarted Redis
                        # resets the connection; keepalive probes notice a silent peer in
                        # about 11 s, and a health check pings a connection idle for 30 s.
                        "socket_timeout": None,
                        "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_SECONDS,
                        "socket_keepalive": True,
                        "socket_keepalive_options": _REDIS_KEEPALIVE,
                        "health_check_interval": 30,
                    }
                ],
                "prefix": env_str("CHANNELS_PREFIX", "ledger") + _TEST_SUFFIX,
            },
        }
    }
    CACHES = {
        "default": {
            # Its clear() deletes only the cache's keys: the broker and the channel layer
            # live in the same database (config/redis_cache.py).
            "BACKEND": "config.redis_cache.LedgerRedisCache",
            "LOCATION": REDIS_URL,
            # Not the channel prefix: clear() deletes "<KEY_PREFIX>:*", and channels_redis
            # keeps its groups under "<CHANNELS_PREFIX>:group:".
            "KEY_PREFIX": "ledger-cache" + _TEST_SUFFIX,
            "OPTIONS": {
                # Django makes one cache object per request context under ASGI, each with its
                # own pool that nothing closes; one shared, bounded pool per process instead.
                "pool_class": "config.redis_pool.SharedBlockingConnectionPool",
                "max_connections": env_int("REDIS_CACHE_MAX_CONNECTIONS", 20, minimum=1),
                "timeout": REDIS_CONNECT_TIMEOUT_SECONDS,
                "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_SECONDS,
                "socket_timeout": REDIS_CONNECT_TIMEOUT_SECONDS,
                "health_check_interval": 30,
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "compaction_app.realtime.layers.ThreadSafeInMemoryChannelLayer"}
    }
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# The in-memory transport ignores the host, but kombu warns "No hostname was supplied" on
# every enqueue without one.
CELERY_BROKER_URL = REDIS_URL or "memory://localhost/"
# Kombu's Redis transport with its restart fault fixed: a worker holding an unacknowledged task
# when Redis restarted exited instead of reconnecting (config/redis_broker.py).
CELERY_BROKER_TRANSPORT = "config.redis_broker:Transport" if REDIS_URL else None
# An enqueue during a Redis outage retries briefly, then the request answers 503.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.5,
    "interval_max": 0.5,
}
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_QUEUE", "context-ledger") + _TEST_SUFFIX
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A running compaction beats every COMPACTION_STALE_SECONDS / 4; the sweeper fails a running
# run whose heartbeat is older than this, and re-queues a pending one queued longer ago.
COMPACTION_STALE_SECONDS = env_float("COMPACTION_STALE_SECONDS", 120.0, minimum=1.0)
COMPACTION_SWEEP_SECONDS = env_float("COMPACTION_SWEEP_SECONDS", 30.0, minimum=0.1)
# Redis redelivers a task nobody acknowledged within this window (default: an hour). Matched to
# the sweeper: a task lost with a killed worker comes back when the sweeper would act anyway,
# and a redelivered compaction task whose run another delivery started does nothing.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": COMPACTION_STALE_SECONDS,
    # An enqueue during a Redis outage gives up in this time (then the request answers 503).
    "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_SECONDS,
}
if not REDIS_URL:
    # The in-memory transport has no blocking receive: its worker sleeps this long whenever the
    # queue is empty (kombu's default is a second, which a compaction or index pass then waits
    # before it starts). A tenth of a second costs ten cheap dict lookups a second when idle.
    CELERY_BROKER_TRANSPORT_OPTIONS["polling_interval"] = 0.1
# Production's periodic sweep (run `celery -A config beat`, or a worker with -B). The embedded
# profile sweeps on a timer thread started by `manage.py serve` instead.
CELERY_BEAT_SCHEDULE = {
    "sweep-stale-compactions": {
        "task": "compaction_app.tasks.sweep_stale_compactions",
        "schedule": COMPACTION_SWEEP_SECONDS,
        # A sweep that waited longer than one interval is superseded by the next one.
        "options": {"expires": COMPACTION_SWEEP_SECONDS},
    }
}
# Embedded profile: the server process runs a Celery worker thread itself.
EMBEDDED_WORKER = env_bool("EMBEDDED_WORKER", not REDIS_URL)

# --- Auth, static ---------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:sessions"
LOGOUT_REDIRECT_URL = "login"
# An open websocket re-checks its credential (token, or login session and its password hash)
# and its permissions this often (compaction_app/realtime/revocation.py): what no signal of
# this process reports (another process's change, SQL) closes it within this time.
WS_AUTH_RECHECK_SECONDS = env_float("WS_AUTH_RECHECK_SECONDS", 15.0, minimum=0.1)
# Websockets one user may hold open at once, across server processes; the next handshake is
# closed with 4429 (compaction_app/realtime/ws_limits.py). 0: no cap.
WS_MAX_CONNECTIONS_PER_USER = env_int("WS_MAX_CONNECTIONS_PER_USER", 64, minimum=0)

# Content-Security-Policy on every page (django-csp). Scripts only from this origin, or inline
# with the response's nonce (`{{ request.csp_nonce }}`); the pages' own scripts are files.
# Inline styles stay allowed: style attributes (usage bars), htmx's indicator style and the
# Swagger UI's page use them, and a style cannot run code.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, "'unsafe-inline'"],
        "img-src": [SELF, "data:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [SELF],
    }
}
# Login throttle (compaction_app/dashboard/login_throttle.py): failures counted per username
# and per client address within the window; at the limit, logins are refused with 429.
LOGIN_THROTTLE_USERNAME_FAILURES = 10
LOGIN_THROTTLE_ADDRESS_FAILURES = 50
LOGIN_THROTTLE_WINDOW_SECONDS = 900

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"

# --- API ------------------------------------------------------------------------------------
API_MAX_BODY_BYTES = env_int("API_MAX_BODY_BYTES", 32 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_BODY_BYTES
# Under ASGI Django spools a request's body before the view runs: in memory up to this size,
# in a temporary file beyond. The view reads its own copy, so a spool kept in memory (2.5 MB
# by default) was one more copy of a body held for the whole request (issue 22, row 14).
FILE_UPLOAD_MAX_MEMORY_SIZE = 256 * 1024
# `manage.py serve` (compaction_app/http_server.py): a request body must arrive within this
# many seconds of its request line (else 408, connection closed), and a connection with
# nothing to send is closed after HTTP_IDLE_TIMEOUT_SECONDS.
HTTP_BODY_TIMEOUT_SECONDS = env_int("HTTP_BODY_TIMEOUT_SECONDS", 20, minimum=1)
HTTP_IDLE_TIMEOUT_SECONDS = env_int("HTTP_IDLE_TIMEOUT_SECONDS", 60, minimum=1)
# Past this many open connections (and never past half the process's file descriptors), the
# one that has waited longest without a request in progress is closed for each new one
# (compaction_app/http_server.py): half-written requests cannot exhaust the descriptors.
HTTP_MAX_CONNECTIONS = env_int("HTTP_MAX_CONNECTIONS", 4096, minimum=16)
API_THROTTLE_RATE = env_str("API_THROTTLE_RATE", "1200/min")
# Heavy requests (/context, compaction dry runs, recall) one user may have running at once,
# counted across processes in the cache (Redis on the production profile); a slot a crashed
# process never released expires after HEAVY_REQUEST_EXPIRY_SECONDS. 0 turns the limit off.
HEAVY_REQUESTS_PER_USER = env_int("HEAVY_REQUESTS_PER_USER", 2, minimum=0)
HEAVY_REQUEST_EXPIRY_SECONDS = env_int("HEAVY_REQUEST_EXPIRY_SECONDS", 300, minimum=1)
# How long a server process's thread may hold the GIL while another waits for it (config/asgi.py
# sets it; Python's default is 5 ms). A heavy request's thread is CPU-bound: a light request on
# the same process waits for the GIL after each database round trip, up to this long each time.
# 0.5 ms took another user's p99 under a heavy load from 394 to 108 ms on the production
# profile (bench/bench_fairness.py; docs/operations.md, "Heavy requests per user").
GIL_SWITCH_INTERVAL_MS = env_float("GIL_SWITCH_INTERVAL_MS", 0.5, minimum=0.05)
# Allocations between two of the cycle collector's youngest-generation passes in a server
# process (config/asgi.py sets it; Python's default is 700). A gateway call's parsed body is
# thousands of objects that die with the call (1,600 objects for a 1,600-message
# conversation): at 700 the collector ran during every such call and traversed them, on the
# event loop and on the worker threads, more with every message (about 0.6 ms of a
# 1,600-message call; docs/benchmarks.md, "The hot path, flat"). At 20,000 they are freed by
# their reference counts before a pass sees them.
GC_GEN0_THRESHOLD = env_int("GC_GEN0_THRESHOLD", 20_000, minimum=100)
API_PAGE_SIZE = env_int("API_PAGE_SIZE", 50, minimum=1)
API_MAX_EVENTS_PER_REQUEST = env_int("API_MAX_EVENTS_PER_REQUEST", 5000, minimum=1)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["sessions_app.api.parsers.LedgerJSONParser"],
    "DEFAULT_THROTTLE_CLASSES": (
        []
        if API_THROTTLE_RATE.lower() == "off"
        else ["sessions_app.api.throttling.UserRateThrottle"]
    ),
    "DEFAULT_THROTTLE_RATES": {
        "user": None if API_THROTTLE_RATE.lower() == "off" else API_THROTTLE_RATE
    },
    "EXCEPTION_HANDLER": "sessions_app.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Context Ledger API",
    "DESCRIPTION": "LLM conversation sessions as an append-only ledger with exact token accounting.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "sessions_app.api.openapi.complete_schema",
    ],
}

# --- Models and compaction ------------------------------------------------------------------
# Extra or corrected context windows, {"model": tokens}; merged over the genai-prices snapshot.
MODEL_CONTEXT_OVERRIDES: dict[str, int] = {
    "gemini-3-pro": 1_000_000,
    # genai-prices lists these without a window.
    "gemini-2.5-pro": 1_048_576,
    "gemini-3-pro-preview": 1_048_576,
    "gemini-3.1-pro-preview": 1_048_576,
    **context_windows(
        "MODEL_CONTEXT_OVERRIDES",
        env_json("MODEL_CONTEXT_OVERRIDES", {}),
        maximum=100_000_000,  # sessions_app.services.MAX_CONTEXT_LIMIT
    ),
}
OPENAI_API_KEY = env_str("OPENAI_API_KEY")
OPENAI_BASE_URL = env_str("OPENAI_BASE_URL")
OPENAI_SUMMARY_MODEL = env_str("OPENAI_SUMMARY_MODEL", "gpt-4o-mini")
ANTHROPIC_API_KEY = env_str("ANTHROPIC_API_KEY")
ANTHROPIC_BASE_URL = env_str("ANTHROPIC_BASE_URL")
ANTHROPIC_SUMMARY_MODEL = env_str("ANTHROPIC_SUMMARY_MODEL", "claude-haiku-4-5")
# Anthropic's count-tokens API as the exact counter of Claude sessions (off unless asked for);
# it calls LEDGER_ANTHROPIC_UPSTREAM (see the gateway settings below).
LEDGER_ANTHROPIC_COUNT_TOKENS = env_bool("LEDGER_ANTHROPIC_COUNT_TOKENS", False)
LEDGER_ANTHROPIC_COUNT_TIMEOUT_SECONDS = env_float(
    "LEDGER_ANTHROPIC_COUNT_TIMEOUT_SECONDS", 10.0, minimum=0.1
)
LEDGER_ANTHROPIC_COUNT_MAX_RETRIES = env_int("LEDGER_ANTHROPIC_COUNT_MAX_RETRIES", 5, minimum=0)
LEDGER_ANTHROPIC_COUNT_BACKOFF_SECONDS = env_float(
    "LEDGER_ANTHROPIC_COUNT_BACKOFF_SECONDS", 2.0, minimum=0.0
)
SUMMARIZER_TIMEOUT_SECONDS = env_float("SUMMARIZER_TIMEOUT_SECONDS", 60.0, minimum=0.1)
SUMMARIZER_WINDOW_TOKENS = env_int("SUMMARIZER_WINDOW_TOKENS", 100_000, minimum=2_000)
MEMORY_FLUSH_WEBHOOK_URL = env_str("MEMORY_FLUSH_WEBHOOK_URL")
# A Prometheus scraper's bearer token for /metrics (staff API tokens work too).
METRICS_TOKEN = env_str("METRICS_TOKEN")
MEMORY_FLUSH_WEBHOOK_TIMEOUT_SECONDS = env_float(
    "MEMORY_FLUSH_WEBHOOK_TIMEOUT_SECONDS", 10.0, minimum=0.1
)
# Budgets (sessions_app.budgets): where their 80 % / 100 % alerts are POSTed (besides the
# `budget_threshold` log line), and the output a call is assumed to produce when its request
# sets no max_tokens (its reservation).
BUDGET_WEBHOOK_URL = env_str("BUDGET_WEBHOOK_URL")
BUDGET_WEBHOOK_TIMEOUT_SECONDS = env_float("BUDGET_WEBHOOK_TIMEOUT_SECONDS", 10.0, minimum=0.1)
LEDGER_BUDGET_OUTPUT_ALLOWANCE = env_int("LEDGER_BUDGET_OUTPUT_ALLOWANCE", 4096, minimum=1)
# First retry delay of a compaction after a transient provider error; doubles per attempt.
COMPACTION_RETRY_BACKOFF_SECONDS = env_float("COMPACTION_RETRY_BACKOFF_SECONDS", 2.0, minimum=0.0)

# --- Gateway --------------------------------------------------------------------------------
LEDGER_OPENAI_UPSTREAM = env_str("LEDGER_OPENAI_UPSTREAM", "https://api.openai.com/v1")
LEDGER_ANTHROPIC_UPSTREAM = env_str("LEDGER_ANTHROPIC_UPSTREAM", "https://api.anthropic.com")
LEDGER_GEMINI_UPSTREAM = env_str(
    "LEDGER_GEMINI_UPSTREAM", "https://generativelanguage.googleapis.com"
)
# The window of a model the registry does not know (a local model behind Ollama or vLLM), for
# the sessions the gateway creates; 0: none (the call is refused with `unknown_model` unless
# it sends X-Ledger-Context-Limit). MODEL_CONTEXT_OVERRIDES names windows model by model.
# A window the API itself accepts (sessions_app.services.MAX_CONTEXT_LIMIT, 100,000,000): a
# larger one started the server and then failed every unknown model's call (issue 42, row 12).
LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT = env_int(
    "LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT", 0, minimum=0, maximum=100_000_000
)
# The bytes of recent request bodies a server process keeps so an agent's next call reads only
# the messages it adds (compaction_app/gateway/body.py, KnownBodies); 0 turns it off.
LEDGER_GATEWAY_KNOWN_BODY_BYTES = env_int(
    "LEDGER_GATEWAY_KNOWN_BODY_BYTES", 64 * 1024 * 1024, minimum=0
)
LEDGER_UPSTREAM_TIMEOUT_SECONDS = env_float("LEDGER_UPSTREAM_TIMEOUT_SECONDS", 600.0, minimum=0.1)
# One streamed reply is cut (with the provider's error event; what arrived is recorded and
# marked incomplete) past this size or duration (compaction_app/gateway/stream_limits.py).
LEDGER_GATEWAY_STREAM_MAX_BYTES = 16 * 1024 * 1024
LEDGER_GATEWAY_STREAM_MAX_SECONDS = 1800.0

LOG_LEVEL = env_str("DJANGO_LOG_LEVEL", "INFO").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # No line shows a provider key sent in a URI (config/redact.py).
    "filters": {"redact_keys": {"()": "config.redact.RedactKeys"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["redact_keys"],
        }
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "sessions_app": {"level": LOG_LEVEL},
        "compaction_app": {"level": LOG_LEVEL},
        "context": {"level": LOG_LEVEL},
    },
}
