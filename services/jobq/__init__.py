"""jobq: crash-safe background jobs.

RabbitMQ delivers job ids; PostgreSQL holds the job row and the lease that
proves a worker is alive; a reaper brings back jobs whose lease lapsed.
Read in this order: schema/current.sql, queries.sql, db.py (the one gateway)
and rows.py, lease.py, worker/consumer.py (it names the consumer's units),
reaper/ (one file per duty); docs/contributing.md says more.
"""

from jobq.app import App
from jobq.client.producer import Client
from jobq.client.results import JobFailed
from jobq.client.stream import Chunk, RunBoundary
from jobq.client.sync import ClientClosed, SyncClient
from jobq.client.task import Task
from jobq.client.workflow import Workflow
from jobq.errors import (
    DuplicateJob,
    Fail,
    InvalidPayload,
    JobqError,
    LeaseLost,
    RateLimited,
    Retry,
    SignalTimeout,
    Snooze,
    UnknownJob,
)
from jobq.handlers import RunEnd
from jobq.job import Job, Status
from jobq.newjob import NewJob
from jobq.settings import Settings
from jobq.telemetry.current import job_context

__all__ = [
           "App",
           "Chunk",
           "Client",
           "ClientClosed",
           "DuplicateJob",
           "Fail",
           "InvalidPayload",
           "Job",
           "JobFailed",
           "JobqError",
           "LeaseLost",
           "NewJob",
           "RateLimited",
           "Retry",
           "RunBoundary",
           "RunEnd",
           "Settings",
           "SignalTimeout",
           "Snooze",
           "Status",
           "SyncClient",
           "Task",
           "UnknownJob",
           "Workflow",
           "job_context",
]
__version__ = "0.1.0"
