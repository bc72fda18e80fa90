"""The application object: which handler runs which queue.

::

    app = jobq.App()

    @app.handler("emails")
    async def send(job: jobq.Job) -> None: ...

    @app.handler("thumbnails", payload=ThumbnailRequest)   # pydantic model
    def resize(job: jobq.Job) -> None: ...                 # sync: runs in a thread

A payload model validates ``job.payload`` before the handler runs; a payload
that fails validation fails the job at once (no retries: it cannot get better).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from jobq.errors import ConfigError

QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")


@dataclass(frozen=True)
class Handler:
    queue: str
    fn: Callable[..., Any]
    is_async: bool
    payload_model: type[BaseModel] | None = None


class App:
    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}

    def handler(
        self, queue: str, *, payload: type[BaseModel] | None = None
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if not QUEUE_NAME.match(queue):
            raise ConfigError(f"invalid queue name {queue!r}")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if queue in self.handlers:
                raise ConfigError(f"queue {queue!r} already has a handler")
            self.handlers[queue] = Handler(queue, fn, inspect.iscoroutinefunction(fn), payload)
            return fn

        return register

    @property
    def queues(self) -> list[str]:
        return sorted(self.handlers)


def load(spec: str) -> App:
    """Import ``module:attribute`` and check it is an App."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"APP must look like module:attribute (e.g. jobq.demo:app), got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"{spec} is not a jobq.App (got {type(app).__name__})")
    return app
