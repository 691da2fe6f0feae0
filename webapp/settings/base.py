"""Settings shared by every environment; values come from the environment."""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from orchestrator.launcher import recorded_endpoints, var_dir_from_env
from webapp.settings.env import database_from_url, env_bool, env_int, env_list, env_str

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
INPUT_ROOTS = env_list("BPCONSOLE_INPUT_ROOTS", [str(VAR_DIR / "inputs"), str(DATA_DIR)])
# A match reached through a symbolic link is refused unless this is set (the link's
# target must still lie inside the input roots).
INPUT_FOLLOW_SYMLINKS = env_bool("BPCONSOLE_INPUT_FOLLOW_SYMLINKS", default=False)
# How long a worker owns a claimed batch without renewing it (it renews every third of
# this while the batch runs) before others may take it over.
BPCONSOLE_LEASE_S = float(env_str("BPCONSOLE_LEASE_S", "60"))
# Most input one operator batch takes from its node's pool. Every Spark job costs about
# a second of planning and JIT whatever its size (docs/benchmarks.md), so a backlog
# goes in as few jobs as this allows.
BPCONSOLE_BATCH_MB = float(env_str("BPCONSOLE_BATCH_MB", "512"))
# The longest a worker may hold one batch: a hung worker's batch goes back to the pool.
BPCONSOLE_BATCH_MAX_S = float(env_str("BPCONSOLE_BATCH_MAX_S", "1800"))
# The largest input the built-in generator writes for one run, in MB (4 GB by default):
# a run's generator spec asking for more is refused before anything is written, so an
# operator cannot fill the data folder's disk (docs/security.md, "Bounded generation").
BPCONSOLE_GENERATOR_MAX_MB = env_int("BPCONSOLE_GENERATOR_MAX_MB", 4096)
if BPCONSOLE_GENERATOR_MAX_MB < 1:
    raise ImproperlyConfigured(
        f"BPCONSOLE_GENERATOR_MAX_MB={BPCONSOLE_GENERATOR_MAX_MB} must be at least 1 (MB)"
    )

SECRET_KEY = env_str("SECRET_KEY", "")
HEALTH_TOKEN = env_str("BPCONSOLE_HEALTH_TOKEN", "")
DEBUG = env_bool("DEBUG", default=False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list(
    "CSRF_TRUSTED_ORIGINS", ["http://127.0.0.1:8000", "http://localhost:8000"]
)

INSTALLED_APPS = [
    "daphne",
    "webapp.console.admin_apps.ConsoleAdminConfig",  # django.contrib.admin, admins by role
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "webapp.console",
    "orchestrator",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
        "rest_framework.authentication.BasicAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Backpressure console API",
    "VERSION": "1",
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
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
    "loggers": {"kazoo": {"level": "WARNING"}, "py4j": {"level": "WARNING"}},
}
CELERY_BEAT_SCHEDULE = {
    "watchdog": {"task": "orchestrator.watchdog", "schedule": 2.0, "options": {"queue": "control"}},
}
CELERY_TASK_ROUTES = {
    "orchestrator.drive_run": {"queue": "control"},
    "orchestrator.watchdog": {"queue": "control"},
    "orchestrator.process_batch": {"queue": "spark"},
}
