"""Logging set-up: one line per event, ``key=value`` text or JSON.

Job transitions are logged with ``event``, ``job``, ``queue``, ``attempt`` and
``worker`` fields (passed as ``extra={"f": {...}}``), so a grep for a job id
tells its story across consumer and reaper logs.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from jobq.telemetry.current import JobContextFilter

_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]}
_CONTROL.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})


def printable(text: str, limit: int = 4000) -> str:
    """User text (a handler's error, a payload) made safe for one log line or
    a terminal: control characters escaped (a newline cannot forge a second
    log line, an ANSI/OSC escape cannot reach the terminal), cut to ``limit``."""
    cut = text[:limit].translate(_CONTROL)
    return cut + f"... ({len(text) - limit} more characters)" if len(text) > limit else cut


def fields(**kw: Any) -> dict[str, Any]:
    """``log.info("msg", extra=fields(job=..., queue=...))``; ``traceback``:
    a failed job's, printed under the line (indented: no line of it can pass
    for a log line of its own) or as the JSON field ``traceback``."""
    tb = kw.pop("traceback", None)
    return {"f": kw, "jobq_traceback": tb}


def _indented(text: str) -> str:
    return "\n".join("    " + printable(ln, 1000) for ln in text.rstrip("\n").splitlines())


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        extra = getattr(record, "f", None) or {}
        kv = " ".join(f"{k}={v}" for k, v in extra.items())
        line = (f"{ts}.{int(record.msecs):03d}Z {record.levelname:<7} {record.name}: "
                f"{record.getMessage()}")
        if kv:
            line += " " + kv
        if record.exc_info and record.levelno >= logging.ERROR:
            line += "\n" + self.formatException(record.exc_info)
        if tb := getattr(record, "jobq_traceback", None):
            line += "\n" + _indented(tb)
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update({k: str(v) if not isinstance(v, (int, float, bool)) else v
                    for k, v in (getattr(record, "f", None) or {}).items()})
        if record.exc_info and record.levelno >= logging.ERROR:
            doc["exc"] = self.formatException(record.exc_info)
        if tb := getattr(record, "jobq_traceback", None):
            doc["traceback"] = tb
        return json.dumps(doc)


def setup(level: str = "INFO", as_json: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if as_json else _TextFormatter())
    handler.addFilter(JobContextFilter())  # a handler's own records carry its job
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Driver chatter (connect errors, reconnect tracebacks) is summarised by
    # our own one-line messages; show it only when debugging.
    for noisy in ("aio_pika", "aiormq"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if level == "DEBUG" else logging.CRITICAL)
