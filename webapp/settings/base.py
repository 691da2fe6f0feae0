"""Settings shared by every environment; values come from the environment."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from orchestrator.services.launcher import recorded_endpoints, var_dir_from_env
from webapp.settings.env import (
    database_from_url,
    env_bool,
    env_int,
    env_list,
    env_seconds,
    env_str,
    full_origins,
    sink_databases,
)

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = var_dir_from_env()

# Unset service addresses fall back to what a running launcher recorded, so that
# `manage.py ...` in a second shell talks to the services `make run` started.
_recorded = recorded_endpoints(VAR_DIR)
DATABASE_URL = env_str(
    "DATABASE_URL",
    _recorded.database_url if _recorded else "postgresql://postgres@127.0.0.1:5432/bpconsole",
)
REDIS_URL = env_str("REDIS_URL", _recorded.redis_url if _recorded else "redis://127.0.0.1:6379/0")
ZK_HOSTS = env_str("ZK_HOSTS", _recorded.zk_hosts if _recorded else "127.0.0.1:2181")
ZK_ROOT = env_str("BPCONSOLE_ZK_ROOT", "/bpconsole")
SPARK_MASTER = env_str("SPARK_MASTER", "local[*]")
DATA_DIR = Path(env_str("BPCONSOLE_DATA_DIR", str(VAR_DIR / "data")))
# Folders a run started from the console may read its input from (the command line is
# not limited): a browser must not turn any file the server can read into a run's input.
# Nothing inside DATA_DIR or BPCONSOLE_SINK_ROOT is an input, even under a listed root.
INPUT_ROOTS = env_list("BPCONSOLE_INPUT_ROOTS", [str(VAR_DIR / "inputs")])
# Redis servers a run started from the console may read a stream from, besides the
# console's own (REDIS_URL): a run must not make the server connect anywhere it is told.
BPCONSOLE_STREAM_URLS = env_list("BPCONSOLE_STREAM_URLS", [])
# Where a windowed pipeline's sink may write: Parquet sinks below this folder only, and
# PostgreSQL sinks only to the databases named here ("name=postgresql://...", comma
# separated); a pipeline names a database, never a URL (docs/security.md).
BPCONSOLE_SINK_ROOT = Path(env_str("BPCONSOLE_SINK_ROOT", str(VAR_DIR / "sinks")))
BPCONSOLE_SINK_DATABASES = sink_databases(
    env_list("BPCONSOLE_SINK_DATABASES", []), console=DATABASE_URL
)
# A match reached through a symbolic link is refused unless this is set (the link's
# target must still lie inside the input roots).
INPUT_FOLLOW_SYMLINKS = env_bool("BPCONSOLE_INPUT_FOLLOW_SYMLINKS", default=False)
# How long a worker owns a claimed batch without renewing it (it renews every third of
# this while the batch runs) before others may take it over: how soon a batch of a
# worker that died or hangs runs elsewhere.
BPCONSOLE_LEASE_S = float(env_str("BPCONSOLE_LEASE_S", "10"))
# How long a sent batch may wait in its queue, not started, before the driver presumes
# its message lost (prefetched by a worker that died) and sends another. A batch waits
# behind other nodes' batches on a busy worker, so this is longer than the lease.
BPCONSOLE_QUEUED_BATCH_S = float(env_str("BPCONSOLE_QUEUED_BATCH_S", "60"))
# How long a created run may wait for its driver before the watchdog presumes the
# message asking for it lost (taken by a control worker that died, or with Redis) and
# sends another; then again after twice as long each time, so that runs queued behind
# busy control workers are not sent a message every few seconds.
BPCONSOLE_DRIVER_START_S = env_seconds("BPCONSOLE_DRIVER_START_S", 30.0)
# Most runs one control worker drives at once, each in a thread of its own beside the
# pool (orchestrator/run/driver_threads.py): each holds a ZooKeeper session and two
# database connections. A run past it waits for the watchdog to send it elsewhere.
BPCONSOLE_DRIVERS_PER_WORKER = env_int("BPCONSOLE_DRIVERS_PER_WORKER", 32)
# Most input one operator batch takes from its node's pool. Every Spark job costs about
# a second of planning and JIT whatever its size (docs/benchmarks.md), so a backlog
# goes in as few jobs as this allows.
BPCONSOLE_BATCH_MB = float(env_str("BPCONSOLE_BATCH_MB", "512"))
# Spark Celery worker processes (runconsole starts that many): the policy lab's
# simulator shares them among the operators as the live runtime does.
BPCONSOLE_SPARK_WORKERS = env_int("BPCONSOLE_SPARK_WORKERS", 1)
# Rounds of generated batches (six jobs each) a Spark worker's first JVM runs before its
# first batch, so that its first run's batches do not run cold (sparkjobs/warm_up.py).
# A batch that comes first stops it. 0: none.
BPCONSOLE_SPARK_WARM_UP_ROUNDS = env_int("BPCONSOLE_SPARK_WARM_UP_ROUNDS", 4)
if not 0 <= BPCONSOLE_SPARK_WARM_UP_ROUNDS <= 100:
    raise ImproperlyConfigured(
        f"BPCONSOLE_SPARK_WARM_UP_ROUNDS={BPCONSOLE_SPARK_WARM_UP_ROUNDS}: from 0 to 100"
    )
# The policy lab simulates in a process of its own, niced: at most this long and this
# much memory, whatever the workload (docs/console.md, "Policy lab").
BPCONSOLE_LAB_TIMEOUT_S = float(env_str("BPCONSOLE_LAB_TIMEOUT_S", "120"))
BPCONSOLE_LAB_MEMORY_MB = env_int("BPCONSOLE_LAB_MEMORY_MB", 2048)
# The longest a worker may hold one batch: a hung worker's batch goes back to the pool.
BPCONSOLE_BATCH_MAX_S = float(env_str("BPCONSOLE_BATCH_MAX_S", "1800"))
# A continuous run's ledger keeps only recent history (segment files go as soon as every
# row naming them is done, in any run): a done segment's row this long, a merged chunk's
# row this long before it is coalesced into the run's merged prefix. Long enough for the
# driver's flows, an adjustment's outcome and a look at what just happened; a run that
# goes on for days keeps only this much. A bounded run keeps its rows (manage.py
# clean_runs removes them).
BPCONSOLE_SEGMENT_ROWS_KEEP_S = float(env_str("BPCONSOLE_SEGMENT_ROWS_KEEP_S", "120"))
BPCONSOLE_MERGED_KEEP_S = float(env_str("BPCONSOLE_MERGED_KEEP_S", "120"))
# A continuous run's balancer events older than this are thinned to the first of each
# kind at each node in each hour (users' and the system's events are kept whole): the
# last ten minutes whole, as the run page's timeline shows them.
BPCONSOLE_EVENTS_KEEP_S = float(env_str("BPCONSOLE_EVENTS_KEEP_S", "600"))
# A landing folder's rows of files archived or deleted this long ago (and merged: below
# the merged prefix) go: they are not needed for recovery, only for a look at recent
# files and for `run_pipeline --batch --of-run`, which replays a run only while none of
# its rows has gone (it says so otherwise; the archive folder itself can be replayed).
BPCONSOLE_SOURCE_FILES_KEEP_S = float(env_str("BPCONSOLE_SOURCE_FILES_KEEP_S", "600"))
# The largest input the built-in generator writes for one run, in MB (4 GB by default):
# a run's generator spec asking for more is refused before anything is written, so an
# operator cannot fill the data folder's disk (docs/security.md, "Bounded generation").
BPCONSOLE_GENERATOR_MAX_MB = env_int("BPCONSOLE_GENERATOR_MAX_MB", 4096)
if BPCONSOLE_GENERATOR_MAX_MB < 1:
    raise ImproperlyConfigured(
        f"BPCONSOLE_GENERATOR_MAX_MB={BPCONSOLE_GENERATOR_MAX_MB} must be at least 1 (MB)"
    )

# A join's reference table is copied when a run starts and broadcast to every task: it
# must stay small.
BPCONSOLE_REFERENCE_MAX_MB = env_int("BPCONSOLE_REFERENCE_MAX_MB", 64)
if not 1 <= BPCONSOLE_REFERENCE_MAX_MB <= 1024:
    raise ImproperlyConfigured(
        f"BPCONSOLE_REFERENCE_MAX_MB={BPCONSOLE_REFERENCE_MAX_MB} must be between 1 and 1024 (MB)"
    )

# The largest document the console parses, in KB (a pipeline in JSON or YAML: API bodies,
# imports, the editor, load_topology); documents also nest at most 32 levels and YAML
# may have no anchors or aliases (docs/security.md, "Bounded documents").
BPCONSOLE_MAX_DOCUMENT_KB = env_int("BPCONSOLE_MAX_DOCUMENT_KB", 512)
if BPCONSOLE_MAX_DOCUMENT_KB < 1:
    raise ImproperlyConfigured(
        f"BPCONSOLE_MAX_DOCUMENT_KB={BPCONSOLE_MAX_DOCUMENT_KB} must be at least 1 (KB)"
    )
# The largest request body, by its Content-Length, refused (413) before anything reads
# it: one document form-encoded (at most 3 bytes a byte) and a form's other fields.
BPCONSOLE_MAX_BODY_BYTES = 3 * BPCONSOLE_MAX_DOCUMENT_KB * 1024 + 64 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = BPCONSOLE_MAX_BODY_BYTES
FILE_UPLOAD_MAX_MEMORY_SIZE = BPCONSOLE_MAX_BODY_BYTES  # an upload is never written to disk
# Form fields per request: the admin's pipeline form posts about two per node and edge
# (its read-only inlines), every other form a few dozen.
DATA_UPLOAD_MAX_NUMBER_FIELDS = 1000
DATA_UPLOAD_MAX_NUMBER_FILES = 1  # the import's one topology file

SECRET_KEY = env_str("SECRET_KEY", "")
HEALTH_TOKEN = env_str("BPCONSOLE_HEALTH_TOKEN", "")
DEBUG = env_bool("DEBUG", default=False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list(
    "CSRF_TRUSTED_ORIGINS", ["http://127.0.0.1:8000", "http://localhost:8000"]
)
# The pages that may open the run view's websocket: its Origin must equal one of these
# in scheme, host and port (webapp/console/security.py); by default the CSRF origins.
BPCONSOLE_ALLOWED_ORIGINS = full_origins(
    "BPCONSOLE_ALLOWED_ORIGINS"
    if "BPCONSOLE_ALLOWED_ORIGINS" in os.environ
    else "BPCONSOLE_ALLOWED_ORIGINS (from CSRF_TRUSTED_ORIGINS)",
    env_list("BPCONSOLE_ALLOWED_ORIGINS", CSRF_TRUSTED_ORIGINS),
)
# Repeated refusals of one user's action on one run, less than this many seconds apart,
# are one action_refused event whose count goes up (orchestrator/service.py).
BPCONSOLE_REFUSAL_WINDOW_S = env_int("BPCONSOLE_REFUSAL_WINDOW_S", 60)
if BPCONSOLE_REFUSAL_WINDOW_S < 1:
    raise ImproperlyConfigured(
        f"BPCONSOLE_REFUSAL_WINDOW_S={BPCONSOLE_REFUSAL_WINDOW_S} must be at least 1 (s)"
    )

INSTALLED_APPS = [
    "daphne",
    "webapp.console.admin_apps.ConsoleAdminConfig",  # django.contrib.admin, admins by role
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",  # login throttling: its own models and migrations
    "rest_framework",
    "drf_spectacular",
    "channels",
    "webapp.console",
    "orchestrator",
]

MIDDLEWARE = [
    # Outermost, so every answer carries the policy, those of the middleware below too.
    "webapp.console.security.ContentSecurityPolicyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Bounded bodies, read only for a user with the role they need, decided on the headers
    # before the CSRF check (its process_view) or a view reads the body.
    "webapp.console.middleware.BoundedRequestMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "webapp.urls"
ASGI_APPLICATION = "webapp.asgi.application"
WSGI_APPLICATION = "webapp.wsgi.application"

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
                "webapp.console.context.console",
            ],
        },
    },
]

DATABASES = {"default": database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# django-axes first: it refuses a locked-out user name before any password is checked.
# It needs the request, so authenticate() without one (Django's test client login()
# without request=...) raises instead of skipping the throttle.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Login throttling: after this many failed log-ins of one user name from one address,
# that pair is locked out for the cool-off (the page says so, status 429). Keyed on user
# name and address together, so one attacker can neither lock everyone out nor, from
# one address, keep guessing one user's password. A success resets the count.
BPCONSOLE_LOGIN_FAILURE_LIMIT = env_int("BPCONSOLE_LOGIN_FAILURE_LIMIT", 5)
BPCONSOLE_LOGIN_COOLOFF_MIN = env_int("BPCONSOLE_LOGIN_COOLOFF_MIN", 15)
if BPCONSOLE_LOGIN_FAILURE_LIMIT < 1 or BPCONSOLE_LOGIN_COOLOFF_MIN < 1:
    raise ImproperlyConfigured(
        "BPCONSOLE_LOGIN_FAILURE_LIMIT and BPCONSOLE_LOGIN_COOLOFF_MIN must be at least 1"
    )
AXES_FAILURE_LIMIT = BPCONSOLE_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=BPCONSOLE_LOGIN_COOLOFF_MIN)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "webapp.console.security.lockout_response"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "webapp" / "static"]

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        # HTTP Basic under the login throttling (django-axes), a lockout said as 429
        "webapp.console.security.ThrottledBasicAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON only, bounded in size and depth (webapp/console/parsers.py).
    "DEFAULT_PARSER_CLASSES": ["webapp.console.parsers.BoundedJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Backpressure console API",
    "VERSION": "1",
    # The schema is for users with a role, as everything else under /api/ is.
    "SERVE_PERMISSIONS": ["webapp.console.roles.IsViewer"],
    # Run ids are at most 18 digits (webapp/urls.py RunIdConverter).
    "PATH_CONVERTER_OVERRIDES": {
        "run_id": {"type": "integer", "minimum": 0, "maximum": 999_999_999_999_999_999},
    },
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    }
}

# Celery reads every CELERY_* setting (see orchestrator/celery.py).
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
# A batch's result is read only by its run's driver, within a loop or two of the batch
# ending, to see that it finished: kept in Redis two minutes, not Celery's default day,
# so a continuous run's Redis is flat after two minutes.
CELERY_RESULT_EXPIRES = timedelta(minutes=2)
CELERY_TASK_SEND_SENT_EVENT = True
CELERY_WORKER_SEND_TASK_EVENTS = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 3600)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 3900)
CELERY_TASK_DEFAULT_QUEUE = "control"
# Every worker also consumes its own queue: a placed operator instance's batches go there.
CELERY_WORKER_DIRECT = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # axes: every failed log-in and lockout is a WARNING (user name and address masked);
    # its INFO lines repeat each step of each attempt.
    "loggers": {
        "kazoo": {"level": "WARNING"},
        "py4j": {"level": "WARNING"},
        "axes": {"level": "WARNING"},
    },
}
CELERY_BEAT_SCHEDULE = {
    "watchdog": {"task": "orchestrator.watchdog", "schedule": 2.0, "options": {"queue": "control"}},
}
CELERY_TASK_ROUTES = {
    "orchestrator.drive_run": {"queue": "control"},
    "orchestrator.watchdog": {"queue": "control"},
    "orchestrator.process_batch": {"queue": "spark"},
}
