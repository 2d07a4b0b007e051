"""Settings, read from environment variables (every one is documented in docs/operators.md)."""

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from icrlhf.ops.catalogue import DEFAULT_LOCAL_MODEL, UnknownLocalModel, local_model

# Generic classes (ModelAdmin[Example], QuerySet[Item]) subscriptable at runtime, as typed.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("ICRLHF_VAR_DIR", BASE_DIR / "var"))


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from error


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return float(value)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from error


def env_list(name: str, default: str) -> list[str]:
    return [part.strip() for part in os.environ.get(name, default).split(",") if part.strip()]


def llm_endpoints(raw: str) -> dict[str, dict[str, str]]:
    """LLM_ENDPOINTS read and checked: name → model, api_base and key (from `key_env`)."""
    try:
        listed = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as error:
        raise ImproperlyConfigured(f"LLM_ENDPOINTS must be a JSON object: {error}") from error
    if not isinstance(listed, dict):
        raise ImproperlyConfigured("LLM_ENDPOINTS must be a JSON object of named endpoints.")
    endpoints = {}
    for name, entry in listed.items():
        if name == "default":
            raise ImproperlyConfigured("LLM_ENDPOINTS: “default” is the install's own endpoint.")
        if not (isinstance(entry, dict) and entry.get("model") and entry.get("api_base")):
            raise ImproperlyConfigured(
                f"LLM_ENDPOINTS[{name!r}] needs a `model` and an `api_base` (and a `key_env`)."
            )
        endpoints[str(name)] = {
            "model": str(entry["model"]),
            "api_base": str(entry["api_base"]).rstrip("/"),
            "key": os.environ.get(str(entry.get("key_env") or ""), ""),
            **_context_window_of(name, entry),
        }
    return endpoints


def _context_window_of(name: str, entry: dict[str, Any]) -> dict[str, str]:
    """An endpoint's `context_window` (tokens), when LLM_ENDPOINTS gives one."""
    window = entry.get("context_window")
    if window is None:
        return {}
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ImproperlyConfigured(
            f"LLM_ENDPOINTS[{name!r}]: `context_window` must be a positive number of tokens."
        )
    return {"context_window": str(window)}


DEBUG = env_bool("DEBUG", False)

# The key comes from SECRET_KEY, or from the file SECRET_KEY_FILE names (`make run` writes one
# under var/ on first start, so a local install gets a strong key without any set-up).
SECRET_KEY = os.environ.get("SECRET_KEY", "")
SECRET_KEY_FILE = Path(env_str("SECRET_KEY_FILE", str(VAR_DIR / "secret_key")))
if not SECRET_KEY and SECRET_KEY_FILE.is_file():
    SECRET_KEY = SECRET_KEY_FILE.read_text().strip()
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "Set SECRET_KEY (or SECRET_KEY_FILE) when DEBUG is off; see docs/operators.md."
        )
    SECRET_KEY = "django-insecure-development-only-key-do-not-use-in-production"

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

# Behind TLS (production): secure cookies, HSTS and the redirect that `check --deploy` wants.
HTTPS = env_bool("HTTPS", False)
SECURE_SSL_REDIRECT = HTTPS
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = 31_536_000 if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
if env_bool("BEHIND_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Scripts only from our own static files: no inline script, no eval, no CDN. Inline styles
# stay allowed (htmx's indicator styles, the API docs' widgets); images only ours or data:.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF, CSP.UNSAFE_INLINE],
    "img-src": [CSP.SELF, "data:"],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
# Messages (a new token among them, shown once) live in the session, never in a cookie.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "ninja",
    "icrlhf.queues",
    "icrlhf.playbook",
    "icrlhf.reflection",
    "icrlhf.generation",
    "icrlhf.review",
    "icrlhf.memory",
    "icrlhf.triage",
    "icrlhf.ingest",
    "icrlhf.export",
    "icrlhf.insights",
    "icrlhf.gateway",
    "icrlhf.trajectories",
    "icrlhf.accounts",
    "icrlhf.ops",
]
# The benchmarks and the fault suite live beside the package, in the repository only (the
# image and the wheel ship without them): their commands exist where their folder does.
if importlib.util.find_spec("bench") is not None:
    INSTALLED_APPS.append("bench")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "icrlhf.middleware.RefuseNulCharactersMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Every page needs a login unless its view says otherwise (only the login page does).
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "icrlhf.urls"
# The gateway process (`icrlhf.gateway.asgi`) serves only the OpenAI-compatible API: its own
# URLs, authenticated by bearer tokens, so none of the pages' sessions, CSRF or login.
if env_str("ICRLHF_PROCESS", "web") == "gateway":
    ROOT_URLCONF = "icrlhf.gateway.urls"
    MIDDLEWARE = ["icrlhf.gateway.handler.SecurityHeaders"]
WSGI_APPLICATION = "icrlhf.wsgi.application"

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
                "icrlhf.queues.context_processors.roles",
            ],
        },
    }
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
        # Kept for the life of its thread: a new one costs 7–9 ms on PostgreSQL (a server
        # process to start, its caches cold), which a limited age made some requests and
        # tasks pay each time it ran out.
        conn_max_age=None,
        # A kept connection is checked before its first use in a request or a task, so one
        # that died (a database restart) is replaced instead of failing the work.
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web server and the worker's threads write concurrently: WAL lets readers go on,
    # IMMEDIATE takes the write lock up front so two writers queue instead of deadlocking.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
# PostgreSQL: the generation pipeline's commits do not wait for the disk (its steps are redone
# when lost; icrlhf.integrations.database). People's work always commits synchronously.
PIPELINE_ASYNCHRONOUS_COMMIT = env_bool("PIPELINE_ASYNCHRONOUS_COMMIT", True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "review:queue_list"
# Login attempts per minute, counted per client address and per user name.
LOGIN_ATTEMPTS_PER_MINUTE = env_int("LOGIN_ATTEMPTS_PER_MINUTE", 10)
# All names together from one address (an office behind one NAT logs in from one address).
LOGIN_ATTEMPTS_PER_ADDRESS_PER_MINUTE = env_int("LOGIN_ATTEMPTS_PER_ADDRESS_PER_MINUTE", 50)
# Proxies of the install's own in front of the web process (0: clients connect directly);
# the client's address is then read from X-Forwarded-For, that many entries from the right.
TRUSTED_PROXY_COUNT = env_int("TRUSTED_PROXY_COUNT", 0)
# API calls per minute per token (and failed authentications per client address).
API_REQUESTS_PER_MINUTE = env_int("API_REQUESTS_PER_MINUTE", 600)
# Items a person may create per minute through the queue page, and tickets a token may
# create per minute through the API (a batch counts each of its tickets).
ITEMS_PER_MINUTE_PER_USER = env_int("ITEMS_PER_MINUTE_PER_USER", 30)
TICKETS_PER_MINUTE_PER_TOKEN = env_int("TICKETS_PER_MINUTE_PER_TOKEN", 600)
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
# Serve from the app folders without collectstatic when no manifest was built (the dev run).
WHITENOISE_USE_FINDERS = True
# A file missing from the manifest (collectstatic not re-run after an upgrade) is served under
# its plain name instead of failing the whole page.
WHITENOISE_MANIFEST_STRICT = False
WHITENOISE_AUTOREFRESH = DEBUG

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"LiteLLM": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}

# --- Celery (the worker/ package reads every CELERY_* setting) ---------------------------
CELERY_BROKER_URL = env_str("BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_QUEUE", "icrlhf")
# Django's cache holds the rate-limit counters: Redis (the broker's, by default), so that every
# web process counts the same attempts.
CACHE_URL = env_str("CACHE_URL", CELERY_BROKER_URL)
CACHES = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": CACHE_URL,
            "KEY_PREFIX": CELERY_TASK_DEFAULT_QUEUE,  # installs sharing one Redis stay apart
        }
        if CACHE_URL.startswith(("redis://", "rediss://"))
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}
# Celery closes a worker thread's database connection before and after every task, so each
# task opened a new one (on PostgreSQL ~10 ms, three per generation); kept instead, closed
# every 1000 tasks, and checked before each task (worker/app.py).
CELERY_DB_REUSE_MAX = 1000
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
# Only the maintenance tasks that answer a management command keep a result, for an hour.
CELERY_RESULT_BACKEND = env_str("RESULT_BACKEND_URL", "") or CELERY_BROKER_URL
CELERY_RESULT_EXPIRES = 3600
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Work that touches the vector store has a queue of its own: `make run` gives it a worker of
# its own (the one that owns the embedded store), so a retrieval the gateway waits for never
# queues behind minutes of LLM calls. A worker started without -Q consumes both.
CELERY_MEMORY_QUEUE = f"{CELERY_TASK_DEFAULT_QUEUE}.memory"
CELERY_TASK_QUEUES: dict[str, dict[str, str]] = {
    CELERY_TASK_DEFAULT_QUEUE: {},
    CELERY_MEMORY_QUEUE: {},
}
CELERY_TASK_ROUTES = {
    "memory.*": {"queue": CELERY_MEMORY_QUEUE},
    "generation.prepare": {"queue": CELERY_MEMORY_QUEUE},
    "generation.rank": {"queue": CELERY_MEMORY_QUEUE},  # it embeds
}

# --- The local LLM of the embedded defaults (`make run` builds and starts it) ----------------
# Which of the catalogue's models (icrlhf/ops/catalogue.py): smollm2-135m, qwen2.5-coder-0.5b
# or qwen2.5-coder-1.5b. `manage.py build_models --llm` assembles it.
LOCAL_LLM = env_str("LOCAL_LLM", DEFAULT_LOCAL_MODEL)
try:
    _LOCAL_MODEL = local_model(LOCAL_LLM)
except UnknownLocalModel as _error:
    raise ImproperlyConfigured(f"LOCAL_LLM: {_error}") from None
# Assembled once per machine (like llama-server's build) and linked into var/models.
MODEL_CACHE_DIR = Path(
    env_str(
        "MODEL_CACHE_DIR",
        str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "icrlhf" / "models"),
    )
)

# --- LLM (any litellm model) ----------------------------------------------------------------
LLM_MODEL = env_str("LLM_MODEL", f"openai/{_LOCAL_MODEL.alias}")
LLM_API_BASE = env_str("LLM_API_BASE", "http://127.0.0.1:8081/v1")
LLM_API_KEY = env_str("LLM_API_KEY", "local")
# The endpoints a queue may call, by name: the install's own ("default": LLM_MODEL at
# LLM_API_BASE with LLM_API_KEY), and those LLM_ENDPOINTS adds, as JSON:
#   {"openai": {"model": "openai/gpt-4o-mini", "api_base": "https://api.openai.com/v1",
#               "key_env": "OPENAI_API_KEY", "context_window": 128000}}
# Each key is read from the variable its `key_env` names and goes to that endpoint only. A
# queue picks an endpoint by name, and only superusers pick: whoever may edit a queue cannot
# point it at their own server and receive a key. `context_window` is optional (see
# LLM_CONTEXT_WINDOW).
LLM_ENDPOINTS = llm_endpoints(env_str("LLM_ENDPOINTS", ""))
# The context window, in tokens, of LLM_MODEL at LLM_API_BASE (a named endpoint's is its
# `context_window` in LLM_ENDPOINTS). 0: what the server reports (llama.cpp's server does),
# else what litellm knows of the model, else unknown (the prompt is then not fitted).
LLM_CONTEXT_WINDOW = env_int("LLM_CONTEXT_WINDOW", 0)
LLM_TIMEOUT_S = env_float("LLM_TIMEOUT_S", 60.0)
LLM_MAX_RETRIES = env_int("LLM_MAX_RETRIES", 3)
# How often the sweeper looks for generations a dead worker or a lost message left behind.
GENERATION_SWEEP_INTERVAL_S = env_int("GENERATION_SWEEP_INTERVAL_S", 60)
# Work still pending this long, while the broker holds fewer messages than there are such
# rows, lost its message (a broker restart): the sweeper enqueues it again. Must exceed the
# longest retry backoff (60 s).
GENERATION_LOST_AFTER_S = env_int("GENERATION_LOST_AFTER_S", 120)
# Review generation's share of an endpoint (its base URL): at most this many generations call
# it at once, across every worker (counted in the cache's Redis); the others wait, pending, and
# ask again shortly. The gateway's calls take no share, so a flood of captured items never
# fills the endpoint that applications are served from. 0: no cap.
# Reflection (the playbook's proposals): the model that reads a batch of decisions the first
# candidate lost and proposes rules (any litellm model; default the queues' own), its
# endpoint (empty: LLM_API_BASE), and how many decisions one reflection reads.
REFLECTOR_MODEL = env_str("REFLECTOR_MODEL", LLM_MODEL)
REFLECTOR_API_BASE = env_str("REFLECTOR_API_BASE", "")
REFLECTION_BATCH = env_int("REFLECTION_BATCH", 10)
REVIEW_GENERATION_MAX_CONCURRENT = env_int("REVIEW_GENERATION_MAX_CONCURRENT", 2)

# acks_late redelivers a task whose worker died only after the visibility timeout: it must
# exceed the longest a task can legitimately run (one LLM call and its backoff), or Redis
# would hand a still-running call to a second worker.
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {
    "visibility_timeout": env_int("BROKER_VISIBILITY_TIMEOUT_S", 3600),
    # Ten priority lists (0 is served first) for fairness across queues: see
    # generation.pipeline.fair_priority.
    "priority_steps": list(range(10)),
    "queue_order_strategy": "priority",
}
if CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] <= LLM_TIMEOUT_S * 2:
    raise ImproperlyConfigured(
        "BROKER_VISIBILITY_TIMEOUT_S must exceed twice LLM_TIMEOUT_S, or running LLM calls "
        "would be delivered twice."
    )

# --- Memory: embeddings and the vector store ---------------------------------------------------
EMBEDDING_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDING_MODEL_DIR = Path(
    env_str("EMBEDDING_MODEL_DIR", str(VAR_DIR / "models" / "all-MiniLM-L6-v2"))
)
# One: with more, ONNX Runtime's extra threads spin while they wait for work, and on cores
# shared with the gateway and the web that took a core from them (measured at 32 gateway
# clients, with numpy's BLAS threads likewise: the store's owner used 1.2-1.3 cores with two
# threads each, 0.5-0.8 with one, and answered more retrievals a second). Raise it on a
# machine where the embedder has cores to itself.
EMBEDDING_THREADS = env_int("EMBEDDING_THREADS", 1)
# How many recent texts' vectors each process keeps, so an exact repeat is not embedded again
# (~3 KB each; 0 keeps none).
EMBEDDING_CACHE_SIZE = env_int("EMBEDDING_CACHE_SIZE", 4096)
QDRANT_URL = env_str("QDRANT_URL", "")
QDRANT_API_KEY = env_str("QDRANT_API_KEY", "")
QDRANT_PATH = Path(env_str("QDRANT_PATH", str(VAR_DIR / "qdrant")))
QDRANT_COLLECTION_PREFIX = env_str("QDRANT_COLLECTION_PREFIX", "icrlhf")
# How often the sweeper re-enqueues examples that are still unindexed.
MEMORY_SWEEP_INTERVAL_S = env_int("MEMORY_SWEEP_INTERVAL_S", 60)
# How often low-utility examples are retired (thresholds are per queue).
MEMORY_PRUNE_INTERVAL_S = env_int("MEMORY_PRUNE_INTERVAL_S", 3600)
# Gateway calls keep what end users wrote this many days (0: forever); checked this often.
CALL_RETENTION_DAYS = env_int("CALL_RETENTION_DAYS", 30)
CALL_PURGE_INTERVAL_S = env_int("CALL_PURGE_INTERVAL_S", 3600)
# Personal data (e-mail, phone, card and IBAN numbers) replaced by placeholders before a
# gateway call is stored: "captured" (calls that go to review, and so into memory), "all"
# (every stored call), "off". Phone numbers without a +country code are read in this region.
REDACTION = env_str("REDACTION", "captured")
# Webhooks to loopback, private or link-local addresses are refused unless this is set (a
# receiver on the same host or network as the install).
WEBHOOK_ALLOW_PRIVATE = env_bool("WEBHOOK_ALLOW_PRIVATE", False)
REDACTION_PHONE_REGION = env_str("REDACTION_PHONE_REGION", "US")
# How often queues with new decisions get their ranking's confidence refitted.
CALIBRATION_REFIT_INTERVAL_S = env_int("CALIBRATION_REFIT_INTERVAL_S", 300)
# How often queues that reflect by themselves (their `reflect_after`) are checked.
REFLECTION_CHECK_INTERVAL_S = env_int("REFLECTION_CHECK_INTERVAL_S", 600)

# --- The gateway: the OpenAI-compatible endpoint applications call ------------------------------
# Requests per minute per token (counted atomically in the cache, like the API's).
GATEWAY_REQUESTS_PER_MINUTE = env_int("GATEWAY_REQUESTS_PER_MINUTE", 3000)
# Calls one token may have in flight at once, all gateway processes together (then 429): one
# tenant cannot take every thread and upstream connection.
GATEWAY_MAX_IN_FLIGHT_PER_TOKEN = env_int("GATEWAY_MAX_IN_FLIGHT_PER_TOKEN", 64)
# The longest one call may take, from its arrival to its last byte, streamed or not (then 504,
# or an error event in a stream): an upstream that drips slowly cannot hold a call open.
GATEWAY_CALL_DEADLINE_S = env_float("GATEWAY_CALL_DEADLINE_S", 2 * LLM_TIMEOUT_S)
# A request body larger than this is refused with 413 before it is read.
GATEWAY_MAX_REQUEST_BYTES = env_int("GATEWAY_MAX_REQUEST_BYTES", 1_000_000)
# With the embedded store (no QDRANT_URL) the worker owns it and answers the gateway's
# retrievals; past this wait the call is answered without memory.
GATEWAY_RECALL_TIMEOUT_S = env_float("GATEWAY_RECALL_TIMEOUT_S", 2.0)
# Identical requests (the same messages) to one queue are captured for review once
# within this window.
CAPTURE_DEDUPE_WINDOW_S = env_int("CAPTURE_DEDUPE_WINDOW_S", 3600)
# Threads per gateway process for its blocking work (database, retrieval, the log's hand-over);
# calls waiting for their upstream hold none. Calls beyond it queue for a thread: on two
# cores, 8 threads against 48 took the overhead p95 at 32 clients from 371 to 276 ms and
# memory answers' p95 from 639 to 325 ms (bench_gateway), as 32 threads contending for one
# interpreter cost more than the wait. Each keeps a database connection.
GATEWAY_THREADS = env_int("GATEWAY_THREADS", 8)
# Gateway processes `make run` starts (uvicorn's workers; docker-compose sets its own). One
# process's Python runs on one core at a time: two on two cores carried 32 clients with an
# overhead p95 of 216 ms against one's 315 (bench_gateway), then one per two cores. They
# share the store through its owner, and the call log's one writer.
_CORES = os.cpu_count() or 1
GATEWAY_PROCESSES = env_int("GATEWAY_PROCESSES", min(_CORES, max(2, _CORES // 2)))
# Who writes the gateway's call log from its journal (with Redis as the cache): "process", a
# process of its own (`manage.py call_log_writer`, which make run, docker-compose and the
# benchmarks start), or "gateway", a thread in each gateway process, for a gateway run alone.
# Writing the rows (the call, its run's step) was most of a memory answer's CPU in the
# gateway's interpreter (py-spy), where it took turns with the calls. Either way one writer at
# a time holds the journal's lock, and the worker's sweep writes what no writer is writing.
CALL_LOG_WRITER = env_str("CALL_LOG_WRITER", "process")
if CALL_LOG_WRITER not in ("process", "gateway"):
    raise ImproperlyConfigured(
        f"CALL_LOG_WRITER must be `process` or `gateway`, got {CALL_LOG_WRITER!r}"
    )

# --- Input limits ----------------------------------------------------------------------------
ITEM_INPUT_MAX_CHARS = env_int("ITEM_INPUT_MAX_CHARS", 20_000)

# --- How the local LLM is served ----------------------------------------------------------------
# The GGUF file served: LOCAL_LLM's own, unless this names another file.
LOCAL_LLM_MODEL_PATH = Path(
    env_str("LOCAL_LLM_MODEL_PATH", str(VAR_DIR / "models" / _LOCAL_MODEL.file_name))
)
# Requests the local llama.cpp server decodes at once (its parallel slots); more wait in line.
# A generation's N candidates arrive together when N fits.
LOCAL_LLM_SLOTS = env_int("LOCAL_LLM_SLOTS", 4)
# The chat template llama.cpp renders with: `auto` is the catalogue entry's (SmolLM2, whose
# own template knows no tools, gets the shipped ChatML template that teaches it tools; Qwen2.5
# its own); `model` is always the model's own; anything else is the path of a Jinja template.
LOCAL_LLM_CHAT_TEMPLATE = env_str("LOCAL_LLM_CHAT_TEMPLATE", "auto")

# Datasets for the demo and the benchmarks (../shared/data beside the checkout).
SHARED_DATA_DIR = Path(env_str("SHARED_DATA_DIR", str(BASE_DIR.parent / "shared" / "data")))

# --- Review -----------------------------------------------------------------------------------
# A claimed item is held for this long, renewed while its page is open.
REVIEW_CLAIM_TTL_S = env_int("REVIEW_CLAIM_TTL_S", 600)
# How long after a decision its reviewer may undo it.
REVIEW_UNDO_WINDOW_S = env_int("REVIEW_UNDO_WINDOW_S", 30)
