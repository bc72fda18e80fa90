"""Django for real (issue #50, item 7): a consumer of a Django project runs
ORM handlers as a Django request would.

- ``jobq consume APP`` (and each ``--pool process`` child) calls
  ``django.setup()`` before it imports APP when ``DJANGO_SETTINGS_MODULE`` is
  set, so the app's module may import models (without it: AppRegistryNotReady
  or ImproperlyConfigured at import, and the consumer stopped).
- Every sync handler runs between two ``close_old_connections()`` calls in
  its own thread (Django's connections are per thread): a connection past
  ``CONN_MAX_AGE``, or broken since the last job (the database restarted, a
  pooler closed it), is replaced, as Django does around each request. Async
  handlers are left alone: the ORM from the event loop needs
  ``sync_to_async`` anyway, which brings its own.
- :func:`publish_on_commit`: a typed task's job published once the current
  transaction commits (Celery's ``delay_on_commit``). A process that dies
  between the commit and the publish loses that job: when the job must exist
  if and only if the transaction commits, enqueue it in the transaction
  with ``SELECT jobq.enqueue(...)`` on Django's connection
  (docs/how-to/frameworks.md).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Unpack

from jobq.errors import ConfigError
from jobq.newjob import JobOptions

if TYPE_CHECKING:
    from jobq.client.task import Task
    from jobq.handlers import Handlers

__all__ = ["instrument", "publish_on_commit", "setup"]


def setup() -> bool:
    """``django.setup()`` if ``DJANGO_SETTINGS_MODULE`` is set (once); True
    if Django is in use. One line (ConfigError) for what cannot be set up."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return False
    try:
        import django
        from django.apps import apps
        from django.core.exceptions import ImproperlyConfigured
    except ImportError:
        raise ConfigError("DJANGO_SETTINGS_MODULE is set but Django is not installed: "
                          "pip install django, or unset DJANGO_SETTINGS_MODULE") from None
    if not apps.ready:
        try:
            django.setup()
        except (ImproperlyConfigured, ImportError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"Django could not be set up from DJANGO_SETTINGS_MODULE="
                              f"{os.environ['DJANGO_SETTINGS_MODULE']}: {first}") from None
    return True


def instrument(app: Handlers) -> None:
    """Run each sync handler of ``app`` between close_old_connections()."""
    for table in (app.handlers, *app.tasks.values()):  # named tasks too
        for name, handler in list(table.items()):
            if not handler.is_async and not getattr(handler.fn, "_jobq_django", False):
                table[name] = replace(handler, fn=_closing(handler.fn))


def _closing(fn: Callable[..., Any]) -> Callable[..., Any]:
    from django.db import close_old_connections

    @functools.wraps(fn)
    def run(job: Any) -> Any:
        close_old_connections()  # a connection broken or too old since the last job
        try:
            return fn(job)
        finally:
            close_old_connections()

    run._jobq_django = True  # type: ignore[attr-defined]  # instrumented once
    return run


def publish_on_commit(task: Task[Any], payload: Any, *, using: str | None = None,
                      **options: Unpack[JobOptions]) -> None:
    """Publish ``task``'s job once the transaction of ``using`` (Django's
    default database) commits; nothing if it rolls back. The payload is
    checked now, so a bad one raises in the caller, before the commit."""
    from django.db import transaction

    task.job(payload, **options)  # validated here: InvalidPayload / ValidationError now
    transaction.on_commit(lambda: task.publish_sync(payload, **options), using=using)
