"""Settings of the example project: the one database is the app's and
jobq's (schema jobq, installed by ``jobq migrate``); its login needs the
``jobq_producer`` role to call ``jobq.enqueue``."""

import os
from urllib.parse import unquote, urlsplit

_db = urlsplit(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/myapp"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "signup.urls"
INSTALLED_APPS = ["signup"]
MIDDLEWARE: list[str] = []
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.path.lstrip("/"),
        "USER": unquote(_db.username or ""),
        "PASSWORD": unquote(_db.password or ""),
        "HOST": _db.hostname or "",
        "PORT": _db.port or 5432,
    }
}
