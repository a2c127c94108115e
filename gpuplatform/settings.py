"""Settings for gpuplatform, driven by environment variables (see README, Configuration).

Local defaults need no server: SQLite and a filesystem Celery broker under var/.
Production (DJANGO_DEBUG=false) refuses to start with the development secret.
"""

from pathlib import Path

import environ
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()
env.read_env(BASE_DIR / ".env", overwrite=False)

VAR_DIR = Path(env.str("GPUPLATFORM_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

# The development secret is public (it is in this file); production refuses it.
DEV_SECRET_KEY = "django-insecure-gpuplatform-development-only-never-use-in-production"  # noqa: S105
DEBUG = env.bool("DJANGO_DEBUG", default=True)
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default=DEV_SECRET_KEY)
if not DEBUG and (not SECRET_KEY.strip() or SECRET_KEY == DEV_SECRET_KEY):
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY must be set to a secret value when DJANGO_DEBUG is false."
    )

ALLOWED_HOSTS = env.list(
    "DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"] if DEBUG else []
)
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
SITE_URL = env.str("GPUPLATFORM_SITE_URL", default="http://127.0.0.1:8000")

INSTALLED_APPS = [
    # the admin with no login form of its own: staff come in through the code step
    "gpuplatform.admin_apps.PlatformAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "django_htmx",
    "django_celery_beat",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "csp",
    "gpuplatform",
    "nodes",
    "tenants",
    "incidents",
    "gateway",
    "edge",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # the Content-Security-Policy header (CONTENT_SECURITY_POLICY below)
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # request.user.is_verified(): did this session pass the second factor (docs/two-factor.md)
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # after messages: staff without a verified second factor are sent to set it up
    "tenants.two_factor.StaffTwoFactorMiddleware",
]

# Content-Security-Policy (django-csp, docs/security-headers.md): scripts, styles, images and
# fetches come only from this origin and nothing inline runs or applies (no 'unsafe-inline',
# no 'unsafe-hashes', no 'unsafe-eval'), so markup that slipped past escaping can neither run
# a script nor restyle the page; no page is framed, forms post only here. Confirmations are
# data-confirm attributes read by static/js/confirm.js, never onsubmit/onclick.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],  # Pico's and Swagger UI's icons are data: images
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

ROOT_URLCONF = "gpuplatform.urls"
WSGI_APPLICATION = "gpuplatform.wsgi.application"

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
                "tenants.context_processors.membership",
                "tenants.context_processors.credit_rate",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------
DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # web, worker and beat share the file: wait for locks instead of failing.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL;",
    }
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=60))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Cache (throttling, shared across processes when Redis is configured) --------
REDIS_URL = env.str("REDIS_URL", default="")
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "gpuplatform",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- Auth ---------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "tenants:account"
LOGOUT_REDIRECT_URL = "login"
INVITATION_TTL_DAYS = env.int("GPUPLATFORM_INVITATION_TTL_DAYS", default=7)
# The VRAM estimator reads a model named by its Hugging Face id (docs/estimator.md, "A
# model id from the Hub"): the Hub's address as huggingface_hub reads it (a mirror works),
# an optional token for gated models (server-side only, never shown), seconds per request,
# and how long a read is cached (by commit; a branch or tag's commit for HUB_REF_TTL).
HF_ENDPOINT = env.str("HF_ENDPOINT", default="https://huggingface.co").rstrip("/")
HF_TOKEN = env.str("HF_TOKEN", default="")
HF_HUB_TIMEOUT = env.float("GPUPLATFORM_HF_HUB_TIMEOUT", default=10.0)
HF_HUB_CACHE_TTL = env.int("GPUPLATFORM_HF_HUB_CACHE_TTL", default=24 * 3600)
HF_HUB_REF_TTL = env.int("GPUPLATFORM_HF_HUB_REF_TTL", default=600)
# Volumes (docs/volumes.md): the largest a tenant may create, how many, what a GB costs per
# hour until ops set a price, and how long a volume whose storage went unpaid is kept.
# Slice logs: the lines kept per slice (the oldest go first) and for how long after it stops.
SLICE_LOG_KEEP_LINES = env.int("GPUPLATFORM_SLICE_LOG_KEEP_LINES", default=5000)
SLICE_LOG_RETENTION_DAYS = env.int("GPUPLATFORM_SLICE_LOG_RETENTION_DAYS", default=7)
VOLUME_MAX_GB = env.int("GPUPLATFORM_VOLUME_MAX_GB", default=2000)
VOLUMES_PER_TENANT = env.int("GPUPLATFORM_VOLUMES_PER_TENANT", default=20)
VOLUME_PRICE_GB_HOUR = env.str("GPUPLATFORM_VOLUME_PRICE_GB_HOUR", default="0.0002")
VOLUME_UNPAID_GRACE_DAYS = env.int("GPUPLATFORM_VOLUME_UNPAID_GRACE_DAYS", default=7)
# Failed logins per client address in 15 minutes before further attempts are refused.
LOGIN_FAILURE_LIMIT = env.int("GPUPLATFORM_LOGIN_FAILURE_LIMIT", default=20)
# POSTs per client address to the page forms (tenants/form_limits.py), every attempt
# counted: past the rate the page answers 429 and runs nothing. The forms that send mail
# (sign-up, password reset) get the lower rate. How long an emailed sign-up link works.
FORM_RATE = env.str("GPUPLATFORM_FORM_RATE", default="20/min")
MAIL_FORM_RATE = env.str("GPUPLATFORM_MAIL_FORM_RATE", default="10/hour")
SIGN_UP_LINK_TTL_HOURS = env.int("GPUPLATFORM_SIGN_UP_LINK_TTL_HOURS", default=24)
# The name authenticator apps show beside the account (docs/two-factor.md).
OTP_TOTP_ISSUER = "gpuplatform"

# --- Email (console by default; EMAIL_URL=smtp+tls://user:pass@host:587 in production)
vars().update(env.email_url("EMAIL_URL", default="consolemail://"))
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="gpuplatform <noreply@localhost>")
SERVER_EMAIL = DEFAULT_FROM_EMAIL

# --- I18N / static ---------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = env.str("DJANGO_TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env.str("DJANGO_STATIC_ROOT", default=str(VAR_DIR / "staticfiles")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

# --- Security (production defaults; every one can be overridden) -------------------
SESSION_COOKIE_SECURE = env.bool("DJANGO_SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = env.bool("DJANGO_CSRF_COOKIE_SECURE", default=not DEBUG)
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=not DEBUG)
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool(
    "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=not DEBUG
)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=not DEBUG)
if env.bool("DJANGO_BEHIND_TLS_PROXY", default=not DEBUG):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# The container health check calls /healthz/ over plain HTTP from inside the container.
SECURE_REDIRECT_EXEMPT = [r"^healthz/$"]
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

# --- REST framework ---------------------------------------------------------------
# The proxies' own addresses or networks; when set, X-Forwarded-For is read only on
# requests that came from one of them (gpuplatform.http.client_address).
TRUSTED_PROXIES = env.list("GPUPLATFORM_TRUSTED_PROXIES", default=[])
REST_FRAMEWORK = {
    # Token first: its WWW-Authenticate header makes anonymous calls 401, not 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiTokenAuthentication",
        "tenants.authentication.StaffVerifiedSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "gpuplatform.api.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
        "rest_framework.filters.SearchFilter",
    ],
    "DEFAULT_THROTTLE_CLASSES": [
        "gpuplatform.api.throttling.AnonThrottle",
        "gpuplatform.api.throttling.UserThrottle",
    ],
    # How many proxies in front append to X-Forwarded-For (gpuplatform.http.client_address):
    # none unless said, so with nothing in front a forged header is ignored; behind one,
    # only the address the proxy saw counts.
    "NUM_PROXIES": env.int("GPUPLATFORM_NUM_PROXIES", default=0),
    "DEFAULT_THROTTLE_RATES": {
        "anon": env.str("GPUPLATFORM_THROTTLE_ANON", default="60/min"),
        "user": env.str("GPUPLATFORM_THROTTLE_USER", default="1200/min"),
        # failed token attempts per client address (see tenants.authentication)
        "auth_failure": env.str("GPUPLATFORM_THROTTLE_AUTH_FAILURES", default="30/min"),
        # failed SSH sign-ins at the gateway per client address: a bucket of its own, so
        # a flood at one door does not lock good tokens or keys out at the other
        "gateway_auth_failure": env.str(
            "GPUPLATFORM_THROTTLE_GATEWAY_AUTH_FAILURES", default="30/min"
        ),
        # Hub models not read before (tenants.hub): each is up to one request to the Hub per
        # shard, so a budget of its own, per address (anonymous) or per account; a model
        # read before is free. /fit/, the estimate API and the launch all draw on it.
        "hub_read_anon": env.str("GPUPLATFORM_THROTTLE_HUB_READ_ANON", default="10/hour"),
        "hub_read_user": env.str("GPUPLATFORM_THROTTLE_HUB_READ_USER", default="60/hour"),
    },
    "DEFAULT_SCHEMA_CLASS": "gpuplatform.api.schema.ErrorAutoSchema",
    "EXCEPTION_HANDLER": "gpuplatform.api.errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PARSER_CLASSES": ["gpuplatform.api.parsers.BoundedJSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "gpuplatform API",
    "DESCRIPTION": "Rent VRAM-tiered GPU slices. "
    "Authenticate with `Authorization: Bearer <token>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # Served from static/vendor (pinned npm package), so the docs work offline.
    "SWAGGER_UI_DIST": "/static/vendor/swagger-ui",
    "SWAGGER_UI_FAVICON_HREF": "/static/vendor/swagger-ui/favicon-32x32.png",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "TenantStatusEnum": "tenants.models.Tenant.Status",
        "NodeStatusEnum": "nodes.models.Node.Status",
        "NodeAccessEnum": "nodes.models.Node.Access",
        "IncidentStatusEnum": "incidents.models.Incident.Status",
        "IncidentEventKindEnum": "incidents.models.IncidentEvent.Kind",
        "WebhookDeliveryStatusEnum": "incidents.models.WebhookDelivery.Status",
        "LedgerEntryKindEnum": "tenants.models.LedgerEntry.Kind",
        "CreditRequestStatusEnum": "tenants.models.CreditRequest.Status",
        "VolumeStateEnum": "tenants.models.Volume.State",
        "SliceStateEnum": "tenants.models.Slice.State",
    },
}

# Tenant webhooks may only reach public addresses (checked when sent); a private test
# network can allow its own.
WEBHOOKS_ALLOW_PRIVATE = env.bool("GPUPLATFORM_WEBHOOKS_ALLOW_PRIVATE", default=False)
# Ops are mailed every incident event; resolutions too unless this is off.
INCIDENTS_MAIL_OPS_RESOLVED = env.bool("GPUPLATFORM_MAIL_OPS_RESOLVED", default=True)

# --- GPU nodes (SSH, telemetry) --------------------------------------------------------
NODES_SSH_KEY_PATH = env.str(
    "GPUPLATFORM_SSH_KEY_PATH", default=str(VAR_DIR / "ssh" / "id_ed25519")
)
NODES_SSH_CONNECT_TIMEOUT = env.float("GPUPLATFORM_SSH_CONNECT_TIMEOUT", default=5.0)
NODES_SSH_COMMAND_TIMEOUT = env.float("GPUPLATFORM_SSH_COMMAND_TIMEOUT", default=15.0)
NODES_SSH_MAX_CONCURRENCY = env.int("GPUPLATFORM_SSH_MAX_CONCURRENCY", default=64)
NODES_SAMPLE_INTERVAL = env.int("GPUPLATFORM_SAMPLE_INTERVAL", default=30)
NODES_UNREACHABLE_AFTER = env.int("GPUPLATFORM_UNREACHABLE_AFTER", default=3)
# A node unreachable for longer than this is judged again (a new preflight) before it
# takes slices once it answers: what came back may not be the machine that was judged.
NODES_REJUDGE_AFTER_ABSENCE_MINUTES = env.int(
    "GPUPLATFORM_REJUDGE_AFTER_ABSENCE_MINUTES", default=10
)
# --- the node agent: holds each container to its quota on the node (docs/isolation.md) ---
# its journal pulled, and its health judged, this often (seconds)
NODE_AGENT_PULL_INTERVAL = env.float("GPUPLATFORM_AGENT_PULL_INTERVAL", default=5.0)
NODE_AGENT_INTERVAL_S = env.float("GPUPLATFORM_AGENT_INTERVAL_S", default=0.5)  # NVML readings
# a breach is acted on after this many readings in a row over quota + margin
NODE_AGENT_CONFIRM_READINGS = env.int("GPUPLATFORM_AGENT_CONFIRM_READINGS", default=2)
# a CUDA context (300-600 MiB), which the quota library does not count, fits in it
NODE_AGENT_MARGIN_MB = env.int("GPUPLATFORM_AGENT_MARGIN_MB", default=512)
# --- the SSH gateway: renters reach their slices' ports through it, no node port open -------
# host:port it listens on (never beyond it); the host shown in the commands renters copy
GATEWAY_ADDRESS = env.str("GPUPLATFORM_GATEWAY_ADDRESS", default="127.0.0.1:2222")
GATEWAY_PUBLIC_HOST = env.str("GPUPLATFORM_GATEWAY_PUBLIC_HOST", default="")
# its host key, generated at first use and kept, so renters can pin it
GATEWAY_HOST_KEY_PATH = env.str(
    "GPUPLATFORM_GATEWAY_HOST_KEY_PATH", default=str(VAR_DIR / "gateway" / "ssh_host_ed25519_key")
)
GATEWAY_CHANNELS_PER_USER = env.int("GPUPLATFORM_GATEWAY_CHANNELS_PER_USER", default=256)
GATEWAY_CHANNELS_PER_SLICE = env.int("GPUPLATFORM_GATEWAY_CHANNELS_PER_SLICE", default=512)
GATEWAY_IDLE_TIMEOUT_S = env.int("GPUPLATFORM_GATEWAY_IDLE_TIMEOUT_S", default=900)
# how often open streams are checked against the slice, the key and the membership
GATEWAY_RECHECK_S = env.float("GPUPLATFORM_GATEWAY_RECHECK_S", default=2.0)
# how long the gateway remembers a container's host PID (0: asks the node at every open)
GATEWAY_PID_CACHE_S = env.float("GPUPLATFORM_GATEWAY_PID_CACHE_S", default=30.0)
# the ciphers offered to renters' clients: AES-GCM only by default, the one the gateway
# re-encrypts at speed (a client without it, PuTTY before 0.76, is told "no matching
# cipher"; add aes128-ctr to let it in at a third of the throughput)
GATEWAY_CIPHERS = env.list(
    "GPUPLATFORM_GATEWAY_CIPHERS", default=["aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]
)
# the key exchanges and MACs offered to renters: those ssh-audit's hardened OpenSSH
# policy accepts (gateway/ssh-audit-policy.txt holds the gateway to it); no SHA-1, no
# group exchange (asyncssh cannot be held to a 3072-bit modulus). A key exchange this
# asyncssh lacks (a post-quantum one without its library) is left out. The host key
# algorithm is the host key's own: ssh-ed25519 only.
GATEWAY_KEX_ALGS = env.list(
    "GPUPLATFORM_GATEWAY_KEX_ALGS",
    default=[
        "mlkem768x25519-sha256",
        "curve25519-sha256",
        "curve25519-sha256@libssh.org",
        "diffie-hellman-group16-sha512",
        "diffie-hellman-group18-sha512",
    ],
)
GATEWAY_MACS = env.list(
    "GPUPLATFORM_GATEWAY_MACS",
    default=[
        "hmac-sha2-256-etm@openssh.com",
        "hmac-sha2-512-etm@openssh.com",
        "umac-128-etm@openssh.com",
    ],
)
# public keys one connection may offer before it is cut off (OpenSSH's MaxAuthTries)
GATEWAY_MAX_AUTH_TRIES = env.int("GPUPLATFORM_GATEWAY_MAX_AUTH_TRIES", default=6)
# per client address: connections not signed in yet at once, and new ones that do not
# sign in (a burst, then so many a minute; one that signs in gives its place back); past
# either a new connection is closed at once (OpenSSH's MaxStartups and
# PerSourcePenalties: each key exchange costs the gateway CPU, the DHEat flood)
GATEWAY_STARTUPS_PER_ADDRESS = env.int("GPUPLATFORM_GATEWAY_STARTUPS_PER_ADDRESS", default=10)
GATEWAY_STARTUP_BURST = env.int("GPUPLATFORM_GATEWAY_STARTUP_BURST", default=10)
GATEWAY_STARTUPS_PER_MINUTE = env.float("GPUPLATFORM_GATEWAY_STARTUPS_PER_MINUTE", default=60)

# --- the edge: the web terminal's WebSockets and the slices' HTTPS addresses (edge/) ----
# host:port the edge process listens on (aiohttp, beside the gateway; never beyond it)
EDGE_ADDRESS = env.str("GPUPLATFORM_EDGE_ADDRESS", default="127.0.0.1:8001")
# the edge's address as browsers reach it for the web terminal (scheme://host[:port]);
# empty: http://EDGE_ADDRESS (make run); behind TLS, the public https address
EDGE_PUBLIC_URL = env.str("GPUPLATFORM_EDGE_PUBLIC_URL", default="")
# the domain every slice port's address lies under: s<slice>-<port>.<domain>. It must lie
# outside the platform's own registrable domain (a slice's page can then never read or
# set the platform's cookies); a wildcard DNS name and certificate point it at the edge.
PROXY_DOMAIN = env.str("GPUPLATFORM_PROXY_DOMAIN", default="gpp-proxy.localhost")
PROXY_SCHEME = env.str("GPUPLATFORM_PROXY_SCHEME", default="https")
# the port in the addresses shown to renters ("" for the scheme's own: 443 behind TLS)
PROXY_PUBLIC_PORT = env.str("GPUPLATFORM_PROXY_PUBLIC_PORT", default="")
# how long the platform's signed hand-off to a port's address may wait to be used
PROXY_HANDOFF_S = env.int("GPUPLATFORM_PROXY_HANDOFF_S", default=60)
# how long a port address's own session cookie lasts (then: Open again on the slice page)
PROXY_SESSION_S = env.int("GPUPLATFORM_PROXY_SESSION_S", default=4 * 3600)
PROXY_MAX_BODY_BYTES = env.int("GPUPLATFORM_PROXY_MAX_BODY_BYTES", default=64 * 1024 * 1024)
PROXY_IDLE_TIMEOUT_S = env.int("GPUPLATFORM_PROXY_IDLE_TIMEOUT_S", default=900)
# one WebSocket message, either way (a notebook's output with its images fits)
PROXY_MAX_MESSAGE_BYTES = env.int("GPUPLATFORM_PROXY_MAX_MESSAGE_BYTES", default=32 * 1024 * 1024)
# requests and WebSockets in flight at once: per user (or per public address), per slice,
# and in all
PROXY_CONNECTIONS_PER_USER = env.int("GPUPLATFORM_PROXY_CONNECTIONS_PER_USER", default=256)
PROXY_CONNECTIONS_PER_SLICE = env.int("GPUPLATFORM_PROXY_CONNECTIONS_PER_SLICE", default=512)
PROXY_CONNECTIONS_TOTAL = env.int("GPUPLATFORM_PROXY_CONNECTIONS_TOTAL", default=4096)
# how long a decision to let a user's requests through is reused before the database is
# asked again (open WebSockets are rechecked on the gateway's GATEWAY_RECHECK_S)
PROXY_RECHECK_S = env.float("GPUPLATFORM_PROXY_RECHECK_S", default=2.0)
# the slice page's Open buttons post to the platform, which redirects the browser to a
# port's address: CSP's form-action covers the redirect's target too
CONTENT_SECURITY_POLICY["DIRECTIVES"]["form-action"].append(f"*.{PROXY_DOMAIN}:*")
# web terminals: how long the page's one-use ticket lasts, sessions open per user at once
TERMINAL_TICKET_S = env.int("GPUPLATFORM_TERMINAL_TICKET_S", default=30)
TERMINAL_SESSIONS_PER_USER = env.int("GPUPLATFORM_TERMINAL_SESSIONS_PER_USER", default=8)

# Whether the nodes can pull an image they do not hold from its registry: "yes", "no", or
# "" (not known). The launch page says so beside an image no node holds.
_PULL_WORDS = {"1": "yes", "true": "yes", "yes": "yes", "0": "no", "false": "no", "no": "no"}
NODES_CAN_PULL = _PULL_WORDS.get(
    env.str("GPUPLATFORM_NODES_CAN_PULL", default="").strip().lower(), ""
)
# Images renters bring (docs/images.md). Every image, allowlisted or brought, is refused at
# its start when it is larger than IMAGE_MAX_GB (Docker's size of it, unpacked) or would
# leave the node's Docker disk less than IMAGE_DISK_RESERVE_GB free.
IMAGE_MAX_GB = env.float("GPUPLATFORM_IMAGE_MAX_GB", default=80.0)
IMAGE_DISK_RESERVE_GB = env.float("GPUPLATFORM_IMAGE_DISK_RESERVE_GB", default=5.0)
# The secrets a tenant's registry logins are sealed with (tenants/sealing.py): the first
# seals, all unseal (put a new one first to rotate). Empty: derived from DJANGO_SECRET_KEY,
# so changing that key makes the stored logins unreadable (renters then enter them again).
CREDENTIALS_KEYS: list[str] = env.list("GPUPLATFORM_CREDENTIALS_KEYS", default=[])
# Seconds to wait after `docker run` before checking the container still runs.
NODES_CONTAINER_SETTLE_S = env.float("GPUPLATFORM_CONTAINER_SETTLE_S", default=1.0)
# A slice still provisioning after this long is retried (3 attempts) or failed by reconcile.
SLICES_PROVISION_TIMEOUT_S = env.int("GPUPLATFORM_PROVISION_TIMEOUT", default=300)
SLICES_RECONCILE_INTERVAL = env.int("GPUPLATFORM_RECONCILE_INTERVAL", default=60)
# The notice an interruptible slice gets before a full-price launch takes its room (the
# buy page promises it): a SIGTERM, a webhook and a timeline entry, then the stop.
SLICES_PREEMPT_NOTICE_S = env.int("GPUPLATFORM_PREEMPT_NOTICE_S", default=30)
if SLICES_PREEMPT_NOTICE_S < 30:
    raise ImproperlyConfigured("GPUPLATFORM_PREEMPT_NOTICE_S is at least 30 (the promise).")
NODES_RAW_RETENTION_HOURS = env.int("GPUPLATFORM_RAW_RETENTION_HOURS", default=48)
NODES_ROLLUP_RETENTION_DAYS = env.int("GPUPLATFORM_ROLLUP_RETENTION_DAYS", default=30)
# On PostgreSQL raw samples live in time partitions of this many hours (UTC-aligned; must
# divide 24): retention drops whole partitions, so a raw row is kept its retention and at
# most one period more (nodes/partitions.py, docs/telemetry.md).
NODES_RAW_PARTITION_HOURS = env.int("GPUPLATFORM_RAW_PARTITION_HOURS", default=6)
if NODES_RAW_PARTITION_HOURS < 1 or 24 % NODES_RAW_PARTITION_HOURS:
    raise ImproperlyConfigured(
        "GPUPLATFORM_RAW_PARTITION_HOURS must divide 24 (1, 2, 3, 4, 6, 8, 12 or 24)."
    )
# Bearer token for /metrics (Prometheus); empty turns the endpoint off.
METRICS_TOKEN = env.str("GPUPLATFORM_METRICS_TOKEN", default="")

# --- Celery -------------------------------------------------------------------------
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, str | int | bool] = {"visibility_timeout": 3600}
else:
    # A broker that needs no server: messages are files under var/celery, shared by
    # the web, worker and beat processes of one machine.
    _broker_dir = VAR_DIR / "celery" / "broker"
    _broker_dir.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir),
        "data_folder_out": str(_broker_dir),
        "control_folder": str(VAR_DIR / "celery" / "control"),
        "store_processed": False,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env.int("CELERY_TASK_SOFT_TIME_LIMIT", default=120)
CELERY_TASK_TIME_LIMIT = env.int("CELERY_TASK_TIME_LIMIT", default=150)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = TIME_ZONE
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_QUEUE_NAMES = ["default", "provision", "telemetry", "incidents"]
CELERY_TASK_QUEUES = [Queue(n, Exchange(n), routing_key=n) for n in CELERY_QUEUE_NAMES]
# Route by task-name prefix: each app names its tasks "<queue>.<what>" or "<app>.<what>".
CELERY_TASK_ROUTES = {
    "provision.*": {"queue": "provision"},
    "telemetry.*": {"queue": "telemetry"},
    "incidents.*": {"queue": "incidents"},
}
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# The one beat schedule of the platform; later issues add their periodic tasks here.
CELERY_BEAT_SCHEDULE = {
    "sample-fleet": {
        "task": "telemetry.fan_out",
        "schedule": float(NODES_SAMPLE_INTERVAL),
        "options": {"expires": NODES_SAMPLE_INTERVAL},
    },
    # the preflight gate, once a day (registration, discovery and policy changes run it too)
    "node-agents": {
        "task": "telemetry.agents_check",
        "schedule": NODE_AGENT_PULL_INTERVAL,
        "options": {"expires": NODE_AGENT_PULL_INTERVAL},
    },
    "preflight-fleet": {
        "task": "telemetry.preflight_all",
        "schedule": crontab(hour=4, minute=10),
    },
    "rollup-and-prune-samples": {
        "task": "telemetry.rollup_and_prune",
        "schedule": crontab(minute="*/5"),
    },
    "meter-running-slices": {
        "task": "tenants.meter",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    "reconcile-slices": {
        "task": "provision.reconcile",
        "schedule": float(SLICES_RECONCILE_INTERVAL),
        "options": {"expires": SLICES_RECONCILE_INTERVAL},
    },
    "dispatch-slice-queue": {
        "task": "provision.dispatch_queue",
        "schedule": 30.0,
        "options": {"expires": 30},
    },
    "incidents-sweep": {
        "task": "incidents.sweep",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    "measure-volumes": {
        "task": "telemetry.volumes_measure_all",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    "meter-volumes": {
        "task": "tenants.volumes_meter",
        "schedule": crontab(minute="*/10"),
    },
    "prune-slice-logs": {
        "task": "tenants.prune_slice_logs",
        "schedule": crontab(hour=3, minute=40),
    },
    "purge-expired-invitations": {
        "task": "tenants.purge_expired_invitations",
        "schedule": crontab(minute=17),
    },
}

# --- Logging ------------------------------------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("DJANGO_LOG_LEVEL", default="INFO")},
    # paramiko logs every connection and key exchange at INFO: too chatty for a fleet.
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "paramiko": {"level": "WARNING"},
    },
}
