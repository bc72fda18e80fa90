"""Typed task handles: publish a handler's jobs without naming its queue.

::

    class Email(BaseModel):
        to: str

    @app.task("emails", payload=Email)
    async def send_email(job: jobq.Job[Email]) -> None: ...

    await send_email.publish(Email(to="a@example.com"), priority=5)   # async code
    send_email.publish_sync(Email(to="a@example.com"))                # Django, Flask

mypy (strict) accepts an ``Email`` and rejects anything else, because the
handle is ``Task[Email]``. At run time a payload that does not fit the model
(a dict from untyped code, a ``model_construct``-ed instance) is refused with
one line before anything is written: nothing is half-published.

Which client publishes: the one passed as ``client=``, else the one given to
``app.use(...)``, else one the app opens on first use from ``jobq.Settings()``
(one per event loop for ``publish``, one per process for ``publish_sync``,
which is fork-safe) and closes in ``app.close()`` / ``await app.aclose()``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError
from typing_extensions import Unpack

from jobq.errors import InvalidPayload
from jobq.handlers import envelope
from jobq.newjob import JobOptions, NewJob, new_job
from jobq.runtime.validation import every_error

if TYPE_CHECKING:
    from jobq.client.defaults import Clients
    from jobq.client.producer import Client
    from jobq.client.sync import SyncClient

M = TypeVar("M", bound=BaseModel)  # a handle without a model is Task[Any]


class Task(Generic[M]):
    """The handle ``@app.task`` returns; calling it calls the handler itself
    (so unit tests and ``jobq.testing`` use it as the plain function)."""

    def __init__(self, clients: Clients, queue: str, fn: Callable[..., Any],
                 model: type[BaseModel] | None, task: str | None = None) -> None:
        self.clients = clients
        self.queue = queue
        self.fn = fn
        self.model = model
        self.task = task  # its name where several tasks share the queue
        self.__name__ = getattr(fn, "__name__", queue)
        self.__doc__ = fn.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        model = self.model.__name__ if self.model else "JSON"
        task = f" task={self.task}" if self.task else ""
        return f"<jobq.Task {self.__name__} queue={self.queue}{task} payload={model}>"

    def job(self, payload: M, **options: Unpack[JobOptions]) -> NewJob:
        """A :class:`jobq.NewJob` of this task, for ``publish_many`` and
        :class:`jobq.Workflow` (``workflow.add(task.job(...))``)."""
        return new_job(self.queue, self.encode(payload), options, "job")

    async def publish(self, payload: M, *, client: Client | None = None,
                      **options: Unpack[JobOptions]) -> uuid.UUID:
        """Publish one job of this task (options as :meth:`jobq.Client.publish`)."""
        new = self.job(payload, **options)
        publisher = client or await self.clients.async_client()
        (job_id,) = await publisher.publish_many([new])
        return job_id

    def publish_sync(self, payload: M, *, client: SyncClient | None = None,
                     **options: Unpack[JobOptions]) -> uuid.UUID:
        """``publish`` from sync code (views, scripts, threads)."""
        new = self.job(payload, **options)
        (job_id,) = (client or self.clients.sync_client()).publish_many([new])
        return job_id

    def encode(self, payload: Any) -> Any:
        """The payload as JSON-ready data, checked against the model first; a
        named task's in its envelope ({"task": name, "payload": ...})."""
        data = self._checked(payload)
        return data if self.task is None else envelope(self.task, data)

    def _checked(self, payload: Any) -> Any:
        if self.model is None:
            return payload
        data = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
        try:  # also checks an instance: model_construct() skips validation
            checked = self.model.model_validate(data)
        except ValidationError as exc:
            raise InvalidPayload(
                f"payload for {self.__name__} (queue {self.queue}) does not fit "
                f"{self.model.__name__}: {every_error(exc)}; pass a valid "
                f"{self.model.__name__}(...)") from None
        return checked.model_dump(mode="json")
