"""Configuration: one pydantic-settings model, read from ``JOBQ_*`` variables.

Nested sections use ``__``: ``JOBQ_CONSUMER__CONCURRENCY=8``,
``JOBQ_REAPER__MAX_SLEEP_S=0.5``. Unknown keys are rejected so a typo in a
setting fails at start instead of being silently ignored. Services receive
their section; nothing else reads ``os.environ``.

Per-queue behaviour (lease length, max stalls, attempts, timeouts, backoff)
is *not* here: it lives in the ``jobq.queue`` table so every process agrees.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConsumerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(default=4, ge=1, le=10_000)
    # Unacked messages the broker may push ahead of free slots. A message waits
    # unacked (so it is redelivered if we die) until a slot frees up.
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


class ReaperSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Upper bound on sleep between sweeps; the reaper otherwise wakes at the
    # next lease deadline or relay time it knows of, or on NOTIFY.
    max_sleep_s: float = Field(default=0.5, gt=0, le=60)
    # Added to a deadline before waking, so the lease has surely lapsed by the
    # database clock when the sweep runs.
    wake_slack_s: float = Field(default=0.05, ge=0, le=5)
    batch_size: int = Field(default=500, ge=1, le=100_000)
    # Lost-message check: every lost_check_s, a queue whose broker queue is
    # empty while rows published over republish_after_s ago still wait gets
    # those rows republished.
    lost_check_s: float = Field(default=5.0, gt=0)
    republish_after_s: float = Field(default=15.0, gt=0)


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

    database_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    # AMQP heartbeat (unless the URL sets ?heartbeat=). Short on purpose: a
    # frozen consumer keeps the messages it prefetched until the broker
    # notices it stopped answering, so this bounds how long a requeued job
    # can sit in a frozen worker's buffer.
    amqp_heartbeat_s: int = Field(default=5, ge=1, le=600)
    # Prefix of the AMQP exchange and queue names: exchange "<ns>", queues
    # "<ns>.<queue>". Lets several deployments (or test runs) share a broker.
    namespace: str = Field(default="jobq", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    # Serve /healthz and /readyz on this port (consume and reap); unset = off.
    health_port: int | None = Field(default=None, ge=0, le=65535)
    health_host: str = "0.0.0.0"
    log_level: str = "INFO"
    log_json: bool = False
    # Crash points for fault tests ("consumer.after_claim" or "name:N" for the
    # N-th hit). Empty in production: checking it costs one comparison.
    crash_at: str = ""

    consumer: ConsumerSettings = ConsumerSettings()
    reaper: ReaperSettings = ReaperSettings()
    producer: ProducerSettings = ProducerSettings()

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, v: str) -> str:
        if urlsplit(v).scheme not in ("postgres", "postgresql"):
            raise ValueError(
                f"JOBQ_DATABASE_URL must look like postgresql://user@host:5432/db, got {v!r}"
            )
        return v

    @field_validator("amqp_url")
    @classmethod
    def _check_amqp_url(cls, v: str) -> str:
        if urlsplit(v).scheme not in ("amqp", "amqps"):
            raise ValueError(
                f"JOBQ_AMQP_URL must look like amqp://user:pass@host:5672/vhost, got {v!r}"
            )
        return v

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, v: str) -> str:
        v = v.upper()
        if v not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("JOBQ_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR")
        return v
