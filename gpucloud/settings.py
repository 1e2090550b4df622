"""The settings: every deployment difference is an environment variable (the API's part: settings_api).

Embedded mode (the default) is REDIS_URL unset: SQLite in the data directory,
in-memory channel layer and cache, Celery on an in-process transport. Setting
DATABASE_URL and REDIS_URL makes the same code run distributed. The variables
and their meanings are listed in compose/.env.example.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from common import fastpaths, task_names
from common.origins import OriginPattern, parse_origin_pattern
from common.protocol.messages import LogBatches, Reconcile
from gpucloud.env import (
    env_bool,
    env_choice,
    env_int,
    env_list,
    env_networks,
    env_path,
    env_str,
    env_url,
    loopback_only,
    parse_database_url,
    private_file,
    secret_key,
)
from gpucloud.settings_api import SCHEMA_SETTINGS, api_settings

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = env_path("GPUCLOUD_DATA_DIR", BASE_DIR / "data")

DEBUG = env_bool("DEBUG", False)
# `agent`: a remote agent on a GPU host (`gpucloud agent join|run` sets it). It reaches the console over
# HTTPS with a credential of its own and is given none of the console's secrets: REDIS_URL and DATABASE_URL
# are never read, the database is a dummy that raises on any query, and SECRET_KEY is random per process
# (the agent signs nothing; Django only needs one to start).
ROLE = env_choice("GPUCLOUD_ROLE", "console", ("console", "agent"))
AGENT_ROLE = ROLE == "agent"
REDIS_URL = None if AGENT_ROLE else env_url("REDIS_URL", None, schemes=("redis", "rediss", "unix"))
EMBEDDED = REDIS_URL is None


SECRET_KEY = secrets.token_urlsafe(64) if AGENT_ROLE else secret_key(DATA_DIR, required=not EMBEDDED and not DEBUG)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
CSRF_FAILURE_VIEW = "gpucloud.views.csrf_failure"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "channels",
    "axes",
    "tenants",
    "inventory",
    "jobs",
    "accounting",
    "notifications",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "tenants.middleware.RequestContextMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "common.csp.ConsoleCSPMiddleware",  # the Content-Security-Policy below
    # Answers a login that django-axes locked out with 429. Above the last, synchronous-only middleware, so
    # Django runs it synchronously like the rest instead of switching threads around it.
    "axes.middleware.AxesMiddleware",
    "common.api.middleware.ApiExceptionMiddleware",
]

ROOT_URLCONF = "gpucloud.urls"
ASGI_APPLICATION = "gpucloud.asgi.application"
WSGI_APPLICATION = "gpucloud.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "common.templating.TextSafeTemplates",  # Django's; pages never fail on bad stored text
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "frontend.context.navigation",
            ],
        },
    },
]

_database = parse_database_url(
    "DATABASE_URL",
    (None if AGENT_ROLE else env_str("DATABASE_URL")) or f"sqlite:///{DATA_DIR / 'gpucloud.sqlite3'}",
)
if _database.engine == "django.db.backends.sqlite3" and not AGENT_ROLE:
    private_file(Path(_database.name))  # the ledger is the console's alone (0600): workloads may run beside it
DATABASES: dict[str, dict[str, Any]] = {
    "default": {
        "ENGINE": _database.engine,
        "NAME": _database.name,
        "USER": _database.user,
        "PASSWORD": _database.password,
        "HOST": _database.host,
        "PORT": _database.port,
        "OPTIONS": dict(_database.options),
        "CONN_MAX_AGE": env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0),
        "CONN_HEALTH_CHECKS": True,
        "TEST": {"NAME": env_str("DATABASE_TEST_NAME")},
    }
}
if _database.engine.endswith("postgresql") and env_int("DATABASE_POOL_SIZE", 20, minimum=0):
    # Under ASGI every request runs in a context of its own, so a persistent
    # connection is never reused: each request paid a new Postgres connection
    # (about 15 ms here, most of a simple API request). psycopg's pool hands
    # connections across requests instead; Django requires CONN_MAX_AGE 0 with it.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"]["pool"] = {"min_size": 2, "max_size": env_int("DATABASE_POOL_SIZE", 20)}
if _database.engine.endswith("sqlite3"):
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # WAL lets the web server read while the in-process workers write;
    # IMMEDIATE makes write transactions take the lock up front instead of
    # failing with "database is locked" when a read upgrades to a write.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=5000;",
    }
    # Tests get a file too, not Django's in-memory default: its shared cache
    # locks whole tables and fails at once ("database table is locked")
    # instead of waiting, so in-process workers would not behave as they do
    # on the embedded console's file.
    # One per test process, so that concurrent runs in one checkout never share it.
    DATABASES["default"]["TEST"]["NAME"] = DATABASES["default"]["TEST"]["NAME"] or str(
        Path(tempfile.gettempdir()) / f"gpucloud-test-{os.getpid()}.sqlite3"
    )
if AGENT_ROLE:
    # Any query raises ImproperlyConfigured: an agent that reached for the database would fail, loudly.
    DATABASES = {"default": {"ENGINE": "django.db.backends.dummy"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CACHES: dict[str, dict[str, Any]]
CHANNEL_LAYERS: dict[str, dict[str, Any]]
if EMBEDDED:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}

# --- Live data (WebSocket streams) ---------------------------------------------------
# Every live stream (logs, GPU samples, workload events, access changes) goes through the
# "live" channel layer. Distributed, the default is Redis pub/sub: one delivery per web
# process and group, fanned out in the process, where the stock layer ("core") pushes one
# copy per consumer through Redis lists. Embedded, an in-memory layer that threads may publish to.
LIVE_CHANNEL_LAYER = env_str("LIVE_CHANNEL_LAYER", "pubsub") or "pubsub"
if LIVE_CHANNEL_LAYER not in ("pubsub", "core"):
    raise ImproperlyConfigured(f"LIVE_CHANNEL_LAYER={LIVE_CHANNEL_LAYER!r} must be pubsub or core.")
_LIVE_BACKENDS = {
    "pubsub": "channels_redis.pubsub.RedisPubSubChannelLayer",
    "core": "channels_redis.core.RedisChannelLayer",
}
if EMBEDDED:
    CHANNEL_LAYERS["live"] = {"BACKEND": "common.live_layer.InProcessChannelLayer"}
else:
    CHANNEL_LAYERS["live"] = {"BACKEND": _LIVE_BACKENDS[LIVE_CHANNEL_LAYER], "CONFIG": {"hosts": [REDIS_URL]}}
# Open live connections per user, across web processes; one more is closed with code 4429.
LIVE_MAX_CONNECTIONS_PER_USER = env_int("LIVE_MAX_CONNECTIONS_PER_USER", 20, minimum=1, maximum=10000)
# Threads per web process committing large bulk submissions (jobs/api/fast_ingest.py): with two, one is
# validated while the one before it waits on the database.
SUBMISSION_INGEST_BULK_THREADS = env_int("SUBMISSION_INGEST_BULK_THREADS", 2, minimum=1, maximum=16)
# The fast paths (common.fastpaths, docs/fastpaths.md), all on unless named in GPUCLOUD_FAST_PATHS_OFF
# (comma-separated, or `all`): each one off, the framework's own path serves instead. An unknown name stops
# the process here.
try:
    FAST_PATHS = fastpaths.switches(env_list("GPUCLOUD_FAST_PATHS_OFF", []))
except ValueError as error:
    raise ImproperlyConfigured(f"GPUCLOUD_FAST_PATHS_OFF: {error}") from error
# Log lines a log stream starts with when the client names none (`?tail=`), and the most it may ask for.
LIVE_LOG_TAIL_DEFAULT = env_int("LIVE_LOG_TAIL_DEFAULT", 200, minimum=0, maximum=5000)
LIVE_LOG_TAIL_MAX = env_int("LIVE_LOG_TAIL_MAX", 5000, minimum=1, maximum=100000)
# Seconds between the backstop re-checks of every open stream's access (revocations arrive as messages at once).
LIVE_RECHECK_SECONDS = env_int("LIVE_RECHECK_SECONDS", 60, minimum=5, maximum=3600)

CELERY_BROKER_URL = REDIS_URL or "memory://localhost/"
# Every broker socket has a read timeout: without one, a worker closing its channel waits for the reply
# to its outstanding BRPOP, and a connection whose peer went silent (no FIN or RST: a dropped flow, a
# suspended host) never answers, so the worker hangs for good instead of reconnecting (Celery GH-9705;
# seen here as a test worker stuck 30 minutes in its shutdown). Redis answers a BRPOP within its 1 s
# timeout, so 30 s is never a healthy wait.
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = (
    {"socket_timeout": 30, "socket_connect_timeout": 10, "socket_keepalive": True}
    if REDIS_URL
    else {"polling_interval": 0.01}
)
# No task's result is ever read (reports, passes and launches act on the ledger), so none is stored:
# with a result backend, every send also subscribed to its result, and after a Redis restart that
# subscription blocked the sender (beat, a submission) for the backend's 120 s socket timeout.
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "control"
# Bulk data (log batches) has a queue and worker threads of its own, so it never starves control work.
CELERY_TASK_ROUTES = {task_names.INGEST_LOGS: {"queue": "ingest"}, LogBatches.TASK: {"queue": "ingest"}}
CELERY_TASK_ACKS_LATE = True
# Distributed, each worker takes one message per thread at a time, so several workers share a queue
# fairly. Embedded, each queue has one worker, and the in-process transport's worker loop acknowledges
# messages only between two waits of up to 2 s: with a bounded prefetch a worker ran at most `threads`
# tasks per 2 s, and control work fell minutes behind. Unbounded (0), it takes what waits at once.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1 if REDIS_URL else 0
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 300, minimum=1)

# --- Scheduler -----------------------------------------------------------------
# Seconds between periodic scheduling passes (passes also follow submissions and completions).
SCHEDULER_PASS_SECONDS = env_int("SCHEDULER_PASS_SECONDS", 1, minimum=1, maximum=3600)
# Seconds a workload runs before reclaim or priority may preempt it.
SCHEDULER_MIN_RUNTIME_SECONDS = env_int("SCHEDULER_MIN_RUNTIME_SECONDS", 600, minimum=0, maximum=86400)
# Whether passes may preempt borrowers and lower-priority work at all.
SCHEDULER_PREEMPTION = env_bool("SCHEDULER_PREEMPTION", True)

# --- Nodes and agents ----------------------------------------------------------
# Seconds between an agent's heartbeats (each carries its latest GPU samples).
NODE_HEARTBEAT_SECONDS = env_int("NODE_HEARTBEAT_SECONDS", 5, minimum=1, maximum=300)
# Seconds without a heartbeat after which a live node becomes unreachable.
NODE_HEARTBEAT_TIMEOUT_SECONDS = env_int("NODE_HEARTBEAT_TIMEOUT_SECONDS", 30, minimum=2, maximum=3600)
# Seconds a node may stay provisioning before it fails (its agent never answered).
NODE_PROVISION_TIMEOUT_SECONDS = env_int("NODE_PROVISION_TIMEOUT_SECONDS", 600, minimum=10, maximum=86400)
# Image and command of the container every node must run with exit code 0 before it becomes ready.
GPUCLOUD_HEALTHCHECK_IMAGE = env_str("GPUCLOUD_HEALTHCHECK_IMAGE", "busybox:stable") or ""
GPUCLOUD_HEALTHCHECK_COMMAND = env_list("GPUCLOUD_HEALTHCHECK_COMMAND", ["true"])
# Seconds between two NVML samples on an agent (sent to the live views; the latest rides on each heartbeat).
GPU_SAMPLE_SECONDS = env_int("GPU_SAMPLE_SECONDS", 1, minimum=1, maximum=60)
# The agent's node name; in embedded mode the console runs the agent of this node.
GPUCLOUD_NODE_NAME = env_str("GPUCLOUD_NODE_NAME", "local") or "local"
# Allow the `process` runtime (not isolated: single-host development only) on this agent.
GPUCLOUD_AGENT_PROCESS_RUNTIME = env_bool("GPUCLOUD_AGENT_PROCESS_RUNTIME", False)
# Docker Engine the agent drives; unset means the local socket.
DOCKER_HOST = env_str("DOCKER_HOST")
# Allow the agent to pull missing images (the health-check image included).
GPUCLOUD_AGENT_PULL_IMAGES = env_bool("GPUCLOUD_AGENT_PULL_IMAGES", True)
# Registries on loopback, link-local or metadata addresses an image may still name (`host` or `host:port`, e.g.
# 127.0.0.1:5000 for a registry served on every node's loopback): none by default (jobs.services.registries).
IMAGE_REGISTRIES_ALLOWED = env_list("IMAGE_REGISTRIES_ALLOWED", [])
# The agent keeps workload containers off the host's own addresses and link-local/metadata ones (iptables rules:
# inventory.drivers.egress); GPUCLOUD_EGRESS_ALLOWED lets `CIDR:PORT` destinations through anyway.
GPUCLOUD_AGENT_EGRESS = env_bool("GPUCLOUD_AGENT_EGRESS", True)
GPUCLOUD_EGRESS_ALLOWED = env_list("GPUCLOUD_EGRESS_ALLOWED", [])

# --- Execution -----------------------------------------------------------------
# Seconds between SIGTERM and SIGKILL when a workload is stopped or preempted (a pool may set its own).
WORKLOAD_STOP_GRACE_SECONDS = env_int("WORKLOAD_STOP_GRACE_SECONDS", 30, minimum=0, maximum=3600)
# Seconds a workload may stay scheduled or starting before the launch counts as failed.
WORKLOAD_START_TIMEOUT_SECONDS = env_int("WORKLOAD_START_TIMEOUT_SECONDS", 600, minimum=5, maximum=86400)
# Seconds between reconcile runs (ledger against what the agents report).
WORKLOAD_RECONCILE_SECONDS = env_int("WORKLOAD_RECONCILE_SECONDS", 30, minimum=1, maximum=3600)
# How often the controller stops the work of people who lost access (removed members, deactivated accounts
# or tenants); the change itself asks for a sweep at once, this catches what a lost request missed.
WORK_SWEEP_SECONDS = env_int("WORK_SWEEP_SECONDS", 30, minimum=1, maximum=60)
# Notebooks: idle timeout (a tenant or preset may set its own), the warning before it, the GPU
# utilization (percent) under which a GPU counts as idle, and the Jupyter image's server command.
NOTEBOOK_IDLE_TIMEOUT_SECONDS = env_int("NOTEBOOK_IDLE_TIMEOUT_SECONDS", 3600, minimum=60)
NOTEBOOK_IDLE_WARNING_SECONDS = env_int("NOTEBOOK_IDLE_WARNING_SECONDS", 600, minimum=0)
NOTEBOOK_IDLE_UTILIZATION = env_int("NOTEBOOK_IDLE_UTILIZATION", 5, minimum=0, maximum=100)
NOTEBOOK_COMMAND = env_list("NOTEBOOK_COMMAND", ["jupyter", "lab"])
# Accounting: the currency prices are in (an ISO 4217 code, shown beside every amount).
ACCOUNTING_CURRENCY = (env_str("ACCOUNTING_CURRENCY", "USD") or "USD").upper()
# Days workload logs are kept unless the tenant sets its own retention.
LOG_RETENTION_DAYS = env_int("LOG_RETENTION_DAYS", 30, minimum=1, maximum=3650)
# Address the Docker runtime publishes workloads' service ports on (the proxy must reach it).
GPUCLOUD_AGENT_PUBLISH_ADDRESS = env_str("GPUCLOUD_AGENT_PUBLISH_ADDRESS", "127.0.0.1") or "127.0.0.1"

# --- Storage (volumes; docs/storage.md, compose/.env.example) ---------------------------
STORAGE_ROOT = env_path("GPUCLOUD_STORAGE_ROOT", DATA_DIR / "volumes")  # the default backend's root
STORAGE_UID_BASE = env_int("GPUCLOUD_STORAGE_UID_BASE", 100000, minimum=1000)  # + user id: a workload's uid
STORAGE_GID_BASE = env_int("GPUCLOUD_STORAGE_GID_BASE", 200000, minimum=1000)  # + project id: its gid
VOLUME_UPLOAD_MAX_BYTES = env_int("VOLUME_UPLOAD_MAX_BYTES", 20 * 1024**3, minimum=1)  # one upload, at most
VOLUME_USAGE_SECONDS = env_int("VOLUME_USAGE_SECONDS", 300, minimum=10, maximum=86400)

# --- Request bodies (common/bodylimit.py, docs/security.md) ----------------------------
# Checked in the ASGI layer before a byte is buffered: a request without a valid session, API token or node
# credential may send BODY_LIMIT_ANONYMOUS; others the default, or their route's larger limit.
BODY_LIMIT_ANONYMOUS = env_int("BODY_LIMIT_ANONYMOUS", 64 * 1024, minimum=1024)
BODY_LIMIT_DEFAULT = env_int("BODY_LIMIT_DEFAULT", 16 * 1024**2, minimum=BODY_LIMIT_ANONYMOUS)  # the API's JSON cap
BODY_LIMIT_UPLOAD = VOLUME_UPLOAD_MAX_BYTES  # volume uploads (API and file browser)
BODY_LIMIT_AGENT_REPORTS = env_int("BODY_LIMIT_AGENT_REPORTS", 16 * 1024**2, minimum=BODY_LIMIT_ANONYMOUS)
# A body that stops for BODY_IDLE_SECONDS, or averages under BODY_MIN_BYTES_PER_SECOND once the grace is over: 408.
BODY_IDLE_SECONDS = env_int("BODY_IDLE_SECONDS", 30, minimum=1, maximum=3600)
BODY_READ_GRACE_SECONDS = env_int("BODY_READ_GRACE_SECONDS", 30, minimum=1, maximum=3600)
BODY_MIN_BYTES_PER_SECOND = env_int("BODY_MIN_BYTES_PER_SECOND", 16 * 1024, minimum=1)
# Who counts as signed in for the limits above (a function of the Authorization header and session key).
BODY_LIMIT_PRINCIPAL_CHECK = "gpucloud.credentials.has_valid_credentials"
# How often an agent looks at its running jobs' checkpoint directories (inventory/agent/checkpoints.py).
CHECKPOINT_SCAN_SECONDS = env_int("CHECKPOINT_SCAN_SECONDS", 15, minimum=1, maximum=3600)

# --- Notifications (docs/notifications.md) -----------------------------------------
# E-mail goes through Django's SMTP settings; it is on when EMAIL_HOST is set (or NOTIFICATIONS_EMAIL=1).
EMAIL_HOST = env_str("EMAIL_HOST", "localhost") or "localhost"
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "") or ""
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "") or ""
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1, maximum=300)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "gpucloud@localhost") or "gpucloud@localhost"
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL are exclusive: set one of them.")
NOTIFICATIONS_EMAIL = env_bool("NOTIFICATIONS_EMAIL", env_str("EMAIL_HOST") is not None)
# Webhooks may go to private networks (on-prem receivers); link-local and metadata addresses never.
NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = env_bool("NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE", False)
NOTIFICATIONS_WEBHOOK_TIMEOUT_SECONDS = env_int("NOTIFICATIONS_WEBHOOK_TIMEOUT_SECONDS", 10, minimum=1, maximum=60)
# Attempts per delivery, and the back-off between them: the base doubles per attempt up to the maximum.
NOTIFICATIONS_MAX_ATTEMPTS = env_int("NOTIFICATIONS_MAX_ATTEMPTS", 8, minimum=1, maximum=30)
NOTIFICATIONS_RETRY_BASE_SECONDS = env_int("NOTIFICATIONS_RETRY_BASE_SECONDS", 30, minimum=0, maximum=3600)
NOTIFICATIONS_RETRY_MAX_SECONDS = env_int("NOTIFICATIONS_RETRY_MAX_SECONDS", 3600, minimum=1, maximum=86400)

# --- Telemetry -----------------------------------------------------------------
# Days per-minute GPU rollups (charts, idle reclaim, usage accounting) are kept.
TELEMETRY_RETENTION_DAYS = env_int("TELEMETRY_RETENTION_DAYS", 90, minimum=1, maximum=3650)
# Seconds of rollups the idle check reads back: a GPU busy in any minute of them keeps its notebook active.
TELEMETRY_IDLE_WINDOW_SECONDS = env_int("TELEMETRY_IDLE_WINDOW_SECONDS", 120, minimum=60, maximum=3600)

CELERY_BEAT_SCHEDULE = {
    "purge-expired-sessions": {"task": task_names.PURGE_EXPIRED_SESSIONS, "schedule": 3600.0},
    "check-nodes": {"task": task_names.CHECK_NODES, "schedule": 10.0},
    "schedule-pass": {"task": task_names.SCHEDULE_PASS, "schedule": float(SCHEDULER_PASS_SECONDS)},
    "apply-heartbeats": {"task": task_names.APPLY_HEARTBEATS, "schedule": 1.0},
    "heartbeat-simulated-nodes": {
        "task": task_names.HEARTBEAT_SIMULATED_NODES,
        "schedule": float(NODE_HEARTBEAT_SECONDS),
    },
    "reconcile-workloads": {"task": Reconcile.TASK, "schedule": float(WORKLOAD_RECONCILE_SECONDS)},
    "enforce-time-limits": {"task": task_names.ENFORCE_TIME_LIMITS, "schedule": 10.0},
    "check-idle-notebooks": {"task": task_names.CHECK_IDLE_NOTEBOOKS, "schedule": 30.0},
    "stop-orphaned-work": {"task": task_names.STOP_ORPHANED_WORK, "schedule": float(WORK_SWEEP_SECONDS)},
    "measure-volume-usage": {"task": task_names.MEASURE_VOLUME_USAGE, "schedule": float(VOLUME_USAGE_SECONDS)},
    "purge-expired-logs": {"task": task_names.PURGE_EXPIRED_LOGS, "schedule": 3600.0},
    "purge-telemetry": {"task": task_names.PURGE_TELEMETRY, "schedule": 86400.0},
    "send-due-notifications": {"task": task_names.SEND_DUE_DELIVERIES, "schedule": 10.0},
    "roll-up-usage": {"task": task_names.ROLL_UP_USAGE, "schedule": 600.0},
    "expire-increase-requests": {"task": task_names.EXPIRE_INCREASE_REQUESTS, "schedule": 60.0},
    "announce-budget-thresholds": {"task": task_names.ANNOUNCE_BUDGET_THRESHOLDS, "schedule": 60.0},
}

# django-axes' backend comes first: it refuses a locked-out login before any password is checked.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "frontend:login"
LOGIN_REDIRECT_URL = "frontend:home"
LOGOUT_REDIRECT_URL = "frontend:login"
# --- Login lockout (django-axes) ---------------------------------------------------
# Every password login (the console's and the Django admin's) is counted per (username, address); after
# LOGIN_MAX_FAILURES failures in a row, each within LOGIN_LOCKOUT_SECONDS of the last, that pair is locked
# for LOGIN_LOCKOUT_SECONDS after the last failure, whatever the password. A success clears the count;
# attempts refused while locked do not extend the lockout. Counters are in the default cache (Redis when
# distributed); tenants/services/logins.py says which username and address an attempt counts against.
AXES_ENABLED = True  # tests turn it off where they log in with Django's test client (tests/conftest.py)
AXES_HANDLER = "axes.handlers.cache.AxesCacheHandler"
AXES_FAILURE_LIMIT = env_int("LOGIN_MAX_FAILURES", 5, minimum=1, maximum=100)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("LOGIN_LOCKOUT_SECONDS", 900, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_USERNAME_CALLABLE = "tenants.services.logins.login_username"
AXES_CLIENT_IP_CALLABLE = "tenants.services.logins.login_address"
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_COOLOFF_MESSAGE = (
    "Too many failed attempts; logins to this account from this address are locked for up to "
    f"{max(1, (int(AXES_COOLOFF_TIME.total_seconds()) + 59) // 60)} minutes."
)
# The cache handler keeps nothing in axes' tables, so its admin pages would only ever be empty.
AXES_ENABLE_ADMIN = False
# No banner at every start; failed logins are still logged (WARNING), with what they count against.
AXES_VERBOSE = False
# axes warns that a process-memory cache is not shared between processes: embedded, there is one process.
SILENCED_SYSTEM_CHECKS = ["axes.W001"] if EMBEDDED else []
# Longest lifetime an API token may be given, in days.
API_TOKEN_MAX_DAYS = env_int("API_TOKEN_MAX_DAYS", 365, minimum=1, maximum=3650)
# Hours an invitation's one-time link works (tenants/services/invitations.py); an admin can send a new one.
INVITATION_TTL_HOURS = env_int("INVITATION_TTL_HOURS", 72, minimum=1, maximum=720)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = env_path("STATIC_ROOT", DATA_DIR / "static")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}


# --- HTTPS hardening ---------------------------------------------------------------


# Secure cookies, HSTS and the redirect to https are the default with DEBUG
# off, so `check --deploy` passes with SECRET_KEY and ALLOWED_HOSTS alone.
# Plain HTTP stays the default only with DEBUG on, or for a console that
# answers to loopback names alone (the default ALLOWED_HOSTS: `gpucloud up`
# on this machine), where HSTS would only pin `localhost` to https for every
# other local server. A plain-HTTP lab deployment opts out explicitly with
# GPUCLOUD_HTTPS=0.
HTTPS = env_bool("GPUCLOUD_HTTPS", not DEBUG and not loopback_only(ALLOWED_HOSTS))
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS and env_bool("SECURE_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000 if HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS and env_bool("SECURE_HSTS_PRELOAD", True)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("TRUST_X_FORWARDED_PROTO", False) else None
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 12 * 3600, minimum=60)
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy of every console response (common/csp.py adds the page's WebSocket origin to
# connect-src). Scripts only from the console's own files: no inline script, no eval. Inline styles stay
# allowed: pages size bars with style attributes, and htmx, the admin and Swagger UI inject styles.
CONTENT_SECURITY_POLICY: dict[str, Any] = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

# --- Notebooks on an origin of their own (docs/deploy.md, docs/security.md) ---------
# Notebooks (and every app users serve) are never served on the console's origin: what a notebook's
# owner serves there could act with the session of whoever opens it. NOTEBOOK_ORIGIN names their origin:
# a host per notebook (`https://nb-{id}.apps.example.org`: wildcard DNS and certificate) or one apps host.
# A console answering to loopback names alone (`gpucloud up`, `make run`) defaults to the next port on
# loopback (the CLI sets the console's port + 1); anywhere else it must be set, or the console does not
# start (`gpucloud serve`) and `manage.py check` fails (jobs/checks.py).
_notebook_origin = env_str("NOTEBOOK_ORIGIN") or ("http://127.0.0.1:8001" if loopback_only(ALLOWED_HOSTS) else None)
NOTEBOOK_ORIGIN: OriginPattern | None = None
if _notebook_origin is not None:
    NOTEBOOK_ORIGIN = parse_origin_pattern(_notebook_origin)
    if NOTEBOOK_ORIGIN is None:
        raise ImproperlyConfigured(
            f"NOTEBOOK_ORIGIN={_notebook_origin!r} is not an origin: scheme://host[:port], nothing after, "
            "`{id}` at most once in the first label (https://nb-{id}.apps.example.org)."
        )
# Seconds a hand-off ticket from the console to a notebook's origin stays valid (it is single use).
NOTEBOOK_HANDOFF_SECONDS = env_int("NOTEBOOK_HANDOFF_SECONDS", 30, minimum=5, maximum=120)
# The notebook origin's own cookie: another name than the console's, so neither side ever reads the other's.
NOTEBOOK_COOKIE_NAME = "gpucloud_notebook"
# Client addresses come from REMOTE_ADDR unless the console sits behind a
# proxy that sets X-Forwarded-For, which must then be trusted explicitly.
TRUST_X_FORWARDED_FOR = env_bool("TRUST_X_FORWARDED_FOR", False)

# --- Prometheus metrics (/metrics) ----------------------------------------------
# Who may read /metrics (docs/metrics.md): with METRICS_TOKEN, callers sending it as a bearer token;
# with METRICS_ALLOWED_NETWORKS, callers from those networks; with both, callers meeting both; with
# neither, loopback only. A token shorter than 24 characters is refused at start.
METRICS_TOKEN = env_str("METRICS_TOKEN")
if METRICS_TOKEN is not None and len(METRICS_TOKEN) < 24:
    raise ImproperlyConfigured("METRICS_TOKEN must be at least 24 characters long.")


METRICS_ALLOWED_NETWORKS = env_networks("METRICS_ALLOWED_NETWORKS")
# Prometheus scrapes the web process directly over the internal network in plain HTTP; redirecting
# it to HTTPS (GPUCLOUD_HTTPS) would send it to a port that does not serve TLS.
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]

# --- The API: DRF, its throttles (docs/api.md) and the OpenAPI schema -----------------------------
API_THROTTLE, REST_FRAMEWORK = api_settings(num_proxies=1 if TRUST_X_FORWARDED_FOR else 0)
SPECTACULAR_SETTINGS = SCHEMA_SETTINGS

# WhiteNoise streams static files through a synchronous iterator, which
# Django's ASGI handler drains in a thread and warns about on every file.
# Hashed static names are cached by browsers for a year, so each file is
# served about once per client; the warning is noise, not a problem.
warnings.filterwarnings("ignore", message="StreamingHttpResponse must consume synchronous iterators")

_LOG_LEVEL = (env_str("LOG_LEVEL", "INFO") or "INFO").upper()
_ROUTINE_LOG_LEVEL = "DEBUG" if _LOG_LEVEL == "DEBUG" else "WARNING"
_ROUTINE_LOGGERS = ("celery.beat", "celery.worker.strategy", "celery.app.trace")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": _LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        # Beat and the workers log every periodic task sent, received and done at INFO: several lines a
        # second that would push the console's address and first password off the screen. At DEBUG only.
        **{name: {"level": _ROUTINE_LOG_LEVEL} for name in _ROUTINE_LOGGERS},
    },
}
