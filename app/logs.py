"""Structured logs: one JSON object a line, on standard error, configured here and only here.

Invariants kept here:
- a log line carries what its caller put in it (the request log: request id, tenant, route
  template, method, status, duration), never a request body or a query string;
- an exception is written as its type alone, never its message or traceback: a database
  error's message can quote stored text;
- a line written without a record (`log_fields`) is the line its record would have made.
"""

from __future__ import annotations

import json
import logging
import math
import time
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, TextIO

import orjson

# Every attribute a plain LogRecord has; whatever else a record carries came in `extra`, but for
# the copy of its message with terminal colours that uvicorn adds to some records.
_NOT_EXTRA = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}

# A line has no source location, thread or process name: a record need not find them, which
# every record otherwise does (the frame walk alone is most of a record's cost). The logging
# HOWTO's own optimisations; set on import, in every process that formats with this module.
logging._srcfile = None
logging.logThreads = False
logging.logProcesses = False
logging.logMultiprocessing = False


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time, level, logger, message, and its `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({name: v for name, v in vars(record).items() if name not in _NOT_EXTRA})
        if record.exc_info and record.exc_info[0] is not None:
            entry["exc_type"] = record.exc_info[0].__name__
        return _json_line(entry)


def _json_line(entry: dict[str, Any]) -> str:
    # One line a request: orjson writes it in half the time. What it refuses (an integer past
    # 64 bits, a key that is not a string) the standard encoder writes.
    try:
        return orjson.dumps(entry, default=str).decode()
    except orjson.JSONEncodeError:
        return json.dumps(entry, ensure_ascii=False, default=str)


class JsonLineHandler(logging.StreamHandler[TextIO]):
    """The service's handler: a `StreamHandler` that also writes lines made without a record
    (`log_fields`), under the same lock, so that no two lines interleave."""

    def write_line(self, line: str) -> None:
        self.acquire()
        try:
            self.stream.write(line + self.terminator)
            self.stream.flush()
        finally:
            self.release()


def log_fields(logger: logging.Logger, message: str, fields: dict[str, Any]) -> None:
    """Log `message` with `fields` at INFO, as `logger.info(message, extra=fields)` would.

    Where the record would reach one handler, the service's (`JsonLineHandler` writing with
    `JsonFormatter`), and no filter, its line is made and written without the record: the
    request log's line cost a request 27 us through `logging`, 10 us this way. Anywhere else (a
    test's capturing handler, a filter, a second handler) it goes through `logging`, and a line
    that fails to write is given to it again, to be reported as `logging` reports failures.
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    handler = _sole_json_handler(logger)
    if handler is not None:
        entry = {
            "time": timestamp(time.time()),
            "level": "INFO",
            "logger": logger.name,
            "message": message,
            **fields,
        }
        try:
            handler.write_line(_json_line(entry))
            return
        except Exception:
            pass  # given to `logging` below, which reports it as it reports its own
    logger.info(message, extra=fields)


def _sole_json_handler(logger: logging.Logger) -> JsonLineHandler | None:
    """The one handler an INFO record of `logger` reaches, when it is the service's and
    nothing filters the record; else None. Walked as `Logger.callHandlers` walks."""
    if logger.filters:
        return None
    found: JsonLineHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if handler.level > logging.INFO:
                continue
            if (
                found is not None
                or type(handler) is not JsonLineHandler
                or handler.filters
                or type(handler.formatter) is not JsonFormatter
            ):
                return None
            found = handler
        current = current.parent if current.propagate else None
    return found


def timestamp(created: float) -> str:
    """`created` (seconds since the epoch) as `datetime.fromtimestamp(created, UTC)` writes it
    to the millisecond (`isoformat`), character for character.

    The date and time to the second are written once a second; only the milliseconds each
    time, as making a datetime was half the cost of formatting a line. They are cut from the
    microseconds rounded half to even, as `fromtimestamp` rounds them, a rounding up to the next
    second included.
    """
    second = math.floor(created)
    micros = round((created - second) * 1_000_000)
    if micros == 1_000_000:
        second, micros = second + 1, 0
    return f"{_second(second)}.{micros // 1000:03d}+00:00"


@lru_cache(maxsize=4)
def _second(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).replace(tzinfo=None).isoformat()


def logging_config(level: str = "INFO") -> dict[str, Any]:
    """The `logging.config.dictConfig` of the service (uvicorn applies it in every worker)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "app.logs.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "app.logs.JsonLineHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            # uvicorn's own loggers write through the root handler, as JSON too.
            "uvicorn": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.error": {"level": level, "handlers": [], "propagate": True},
            # The request log is the service's (app.requests); uvicorn's would repeat it.
            "uvicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
            # At INFO SQLAlchemy logs every statement, and at DEBUG every row it reads.
            "sqlalchemy": {"level": "WARNING"},
        },
    }
