"""Configuration: one pydantic-settings model, read from ``JOBQ_*`` variables.

Nested sections use ``__``: ``JOBQ_CONSUMER__CONCURRENCY=8``,
``JOBQ_REAPER__MAX_SLEEP_S=0.5``. Unknown keys are rejected so a typo in a
setting fails at start instead of being silently ignored. Services receive
their section; nothing else reads ``os.environ``.

Per-queue behaviour (lease length, max stalls, attempts, timeouts, backoff)
is *not* here: it lives in the ``jobq.queue`` table so every process agrees.
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from jobq.endpoints import hosts, split_amqp

# JOBQ_ variables that are not settings: test and demo harnesses read them.
_NOT_SETTINGS = ("JOBQ_TEST_", "JOBQ_DEMO_")


def _redacted(url: str) -> str:
    """A URL as it may appear in an error: no password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def _check_port(url: str, what: str) -> None:
    try:
        hosts(url)  # raises for "notaport" and 99999, host by host
    except ValueError:
        raise ValueError(f"{what} has a bad port (0-65535): {_redacted(url)}") from None


class ConsumerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Jobs one consumer process runs at once (also --concurrency).
    concurrency: int = Field(default=4, ge=1, le=10_000)
    # Unacked messages the broker may push ahead of free slots. A message waits
    # unacked (so it is redelivered if we die) until a slot frees up; one that
    # carries several ids takes a slot per id, and ids a busy consumer cannot
    # start soon go back to the fleet.
    prefetch: int | None = Field(default=None, ge=1, le=65_535)
    # Renew every lease every lease_s * renew_fraction seconds.
    renew_fraction: float = Field(default=1 / 3, gt=0, lt=0.5)
    # Stop trusting a lease this fraction of lease_s before the database
    # would let it lapse (the local "trusted until" of self-fencing).
    fence_margin_fraction: float = Field(default=0.15, gt=0, lt=0.5)
    # SIGTERM: how long in-flight jobs may run before their leases are released.
    shutdown_grace_s: float = Field(default=25.0, ge=0)
    # Threads for synchronous handlers (default: concurrency).
    sync_threads: int | None = Field(default=None, ge=1)
    # Where sync handlers run: "thread" (a thread pool; the default) or
    # "process" (pre-started child processes, one job each at a time: a
    # child's death is charged to its job alone, lease loss and timeouts stop
    # the handler, CPU-bound handlers use every core).
    pool: Literal["thread", "process"] = "thread"
    # Recycle a child after this many jobs, or once its RSS is over this
    # (checked after each job), as Celery's max_tasks_per_child and
    # max_memory_per_child do. Unset: never.
    max_jobs_per_child: int | None = Field(default=None, ge=1)
    max_memory_per_child_mb: float | None = Field(default=None, gt=0)
    # A child told to stop (lease lost, timeout, shutdown) gets SIGTERM, then
    # SIGKILL after this long.
    child_kill_grace_s: float = Field(default=2.0, ge=0, le=60)


class ReaperSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Upper bound on sleep between sweeps; the reaper otherwise wakes at the
    # next lease deadline or relay time it knows of, or on NOTIFY.
    max_sleep_s: float = Field(default=0.5, gt=0, le=60)
    # With no job active, due or parked, the reaper sleeps up to this long
    # between probes instead (never past the shortest queue lease, never
    # under max_sleep_s); a delayed or SQL-only enqueue wakes it at once.
    # What an idle fleet costs the database.
    idle_sleep_s: float = Field(default=2.0, gt=0, le=60)
    # Added to a deadline before waking, so the lease has surely lapsed by the
    # database clock when the sweep runs.
    wake_slack_s: float = Field(default=0.05, ge=0, le=5)
    # Rows one sweep statement requeues, relays or unparks at most.
    batch_size: int = Field(default=500, ge=1, le=100_000)
    # Lost-message check: every lost_check_s, rows of a queue published over
    # republish_after_s before now (its broker queue empty) or before a job
    # consumers started recently (a backlog) are republished.
    lost_check_s: float = Field(default=5.0, gt=0)
    republish_after_s: float = Field(default=15.0, gt=0)
    # Retention (jobq.queue.keep_completed_s / keep_failed_s): every
    # prune_every_s a reaper deletes expired finished jobs, prune_batch rows a
    # statement and at most prune_max_batches statements a round, so pruning
    # never holds up a sweep for long. 0 turns the reaper's pruning off.
    prune_every_s: float = Field(default=60.0, ge=0)
    prune_batch: int = Field(default=500, ge=1, le=100_000)
    prune_max_batches: int = Field(default=20, ge=1)
    # Backlog gauges (jobq_queue_depth, jobq_queue_oldest_wait_seconds): a
    # sample of jobq.backlog every backlog_every_s (0: off), given up after
    # backlog_timeout_s (the statement reads every queued row).
    backlog_every_s: float = Field(default=15.0, ge=0)
    backlog_timeout_s: float = Field(default=2.0, gt=0, le=60)
    # The invariant monitor (reaper/audit.py): a check of what happened since
    # the last one every audit_every_s (0: off); a lease lapsed, or a ready
    # job unpublished, longer than audit_grace_s ago is a violation.
    audit_every_s: float = Field(default=2.0, ge=0)
    audit_grace_s: float = Field(default=60.0, ge=5)
    # Dependants (jobs published `after` others): a sweep settles at most
    # settle_budget edges, in at most settle_rounds rounds (a chain one level
    # a round), in one transaction; the probe brings the reaper straight back
    # for the rest. What bounds a huge fan-out or a long chain per sweep.
    settle_budget: int = Field(default=1000, ge=1, le=100_000)
    settle_rounds: int = Field(default=100, ge=1, le=10_000)


class ProducerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The producer publishes right after commit; the reaper takes over a row
    # nobody marked as published after this grace.
    relay_grace_s: float = Field(default=5.0, ge=0)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="JOBQ_",
        env_nested_delimiter="__",
        extra="forbid",
    )

    # PostgreSQL; several hosts (a primary and standbys) as
    # h1:5432,h2:5432/db?target_session_attrs=read-write.
    database_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    # JOBQ_DATABASE_URL goes through a transaction-pooling proxy (PgBouncer
    # pool_mode=transaction): no prepared statement is kept between
    # transactions and no setting is sent at login (set them on the role).
    database_pooled: bool = False
    # A direct session to PostgreSQL (not through such a proxy) for what
    # needs one: the consumer's registry lock and renewals, LISTEN (reaper
    # wake-ups, client.result), migrate's lock. Unset: JOBQ_DATABASE_URL.
    direct_database_url: str | None = None
    # RabbitMQ; several, comma-separated: a cluster's nodes (amqps:// for TLS).
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    # AMQP heartbeat (unless the URL sets ?heartbeat=). Short on purpose: a
    # frozen consumer keeps the messages it prefetched until the broker
    # notices it stopped answering, so this bounds how long a requeued job
    # can sit in a frozen worker's buffer.
    amqp_heartbeat_s: int = Field(default=5, ge=1, le=600)
    # Prefix of the AMQP exchange and queue names: exchange "<ns>", queues
    # "<ns>.<queue>". Lets several deployments (or test runs) share a broker.
    namespace: str = Field(default="jobq", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    # The install's group roles are <prefix>_owner, _producer, _consumer,
    # _reaper and _reader. Roles belong to the whole PostgreSQL cluster: give
    # each install on one cluster its own prefix, or a login of one reaches
    # the other's database (jobq migrate warns when the roles are shared).
    role_prefix: str = Field(default="jobq", pattern=r"^[a-z][a-z0-9_]{0,29}$")
    # Serve /healthz and /readyz on this port (consume and reap); unset = off.
    health_port: int | None = Field(default=None, ge=0, le=65535)
    # The address they listen on (127.0.0.1 keeps them local).
    health_host: str = "0.0.0.0"
    # DEBUG, INFO, WARNING or ERROR.
    log_level: str = "INFO"
    # One JSON object per line instead of key=value text.
    log_json: bool = False
    # The services' event loop: uvloop when it is installed (jobq[fast]),
    # or asyncio's own; "asyncio" rules uvloop out (a comparison, a suspect).
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    # Crash points for fault tests ("consumer.after_claim" or "name:N" for the
    # N-th hit). Empty in production: checking it costs one comparison.
    crash_at: str = ""
    # `jobq dashboard --allow-actions`: operators sign in with this token.
    # A secret: never printed, never a command-line argument; at least 16
    # characters (a guessable one is a door, however slow guessing is).
    dashboard_token: SecretStr | None = None
    # Every dashboard page needs a signed-in session (payloads, results and
    # errors are then seen by operators only); needs the token.
    dashboard_signin_to_view: bool = False
    # Host names the dashboard answers to besides loopback and the address
    # it binds (comma-separated): a DNS-rebinding page gets a 400.
    dashboard_hosts: str = ""
    # Mark the session cookie Secure (the dashboard is behind HTTPS).
    dashboard_secure_cookie: bool = False

    consumer: ConsumerSettings = ConsumerSettings()
    reaper: ReaperSettings = ReaperSettings()
    producer: ProducerSettings = ProducerSettings()

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_variables(cls, data: Any) -> Any:
        """A typo (JOBQ_DATABSE_URL) must not silently fall back to a default."""
        known = {f"JOBQ_{name.upper()}" for name in cls.model_fields}
        for section in ("consumer", "reaper", "producer"):
            model = cls.model_fields[section].annotation
            known |= {f"JOBQ_{section.upper()}__{n.upper()}"
                      for n in getattr(model, "model_fields", {})}
        for var in os.environ:
            up = var.upper()
            if up.startswith("JOBQ_") and up not in known and not up.startswith(_NOT_SETTINGS):
                near = difflib.get_close_matches(up, sorted(known), n=1)
                hint = f"; did you mean {near[0]}?" if near else ""
                raise ValueError(f"unknown setting {var}{hint}")
        return data

    @field_validator("dashboard_token")
    @classmethod
    def _long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 16:
            raise ValueError("JOBQ_DASHBOARD_TOKEN must be at least 16 characters "
                             "(e.g. python -c 'import secrets; print(secrets.token_urlsafe())')")
        return v

    @property
    def session_url(self) -> str:
        """Where a session-level feature connects (see direct_database_url)."""
        return self.direct_database_url or self.database_url

    @field_validator("database_url", "direct_database_url")
    @classmethod
    def _check_database_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if urlsplit(v).scheme not in ("postgres", "postgresql"):
            raise ValueError("JOBQ_DATABASE_URL must look like postgresql://user@host:5432/db, "
                             f"got {_redacted(v)!r}")
        _check_port(v, "JOBQ_DATABASE_URL")
        return v

    @field_validator("amqp_url")
    @classmethod
    def _check_amqp_url(cls, v: str) -> str:
        urls = split_amqp(v)
        for url in urls or [v]:  # one URL, or several comma-separated (a cluster's nodes)
            _check_port(url, "JOBQ_AMQP_URL")
            if urlsplit(url).scheme not in ("amqp", "amqps") or len(hosts(url)) != 1:
                raise ValueError("JOBQ_AMQP_URL must look like amqp://user:pass@host:5672/vhost "
                                 "(several separated by commas), got "
                                 f"{', '.join(_redacted(u) for u in urls)!r}")
        return v

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, v: str) -> str:
        if v == "amq" or v.startswith("amq."):
            raise ValueError("JOBQ_NAMESPACE may not be amq or start with amq. "
                             "(RabbitMQ reserves those names)")
        return v

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, v: str) -> str:
        v = v.upper()
        if v not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("JOBQ_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR")
        return v
