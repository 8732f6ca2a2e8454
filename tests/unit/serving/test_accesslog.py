"""serving/accesslog.py: Serve's access-log records are not built while every handler would
drop them; every other line, and the access log when it is on, pass as before. Serve's own
logger, configured by Serve's own function into a temporary folder (no Ray cluster)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.serve._private import replica as serve_replica
from ray.serve._private.logging_utils import access_log_msg, configure_component_logger
from ray.serve.schema import LoggingConfig

from serve_app.serving.accesslog import AccessLogGate, access_log_dropped, gate_access_log

ACCESS = {"serve_access_log": True, "skip_context_filter": True}


@pytest.fixture
def serve_logger() -> Iterator[logging.Logger]:
    """Serve's logger as a test leaves it: its handlers, level and propagation restored."""
    logger = logging.getLogger("ray.serve")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    for h in logger.handlers:
        h.close()
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


@pytest.fixture
def records(monkeypatch) -> list[logging.LogRecord]:
    """Every LogRecord built while the test runs."""
    built: list[logging.LogRecord] = []
    factory = logging.getLogRecordFactory()

    def counting(*args, **kwargs):
        record = factory(*args, **kwargs)
        built.append(record)
        return record

    monkeypatch.setattr(logging, "_logRecordFactory", counting)
    return built


def configure(tmp_path: Path, access_log: bool) -> Path:
    config = LoggingConfig(encoding="JSON", enable_access_log=access_log, logs_dir=str(tmp_path))
    configure_component_logger(
        component_name="app#model",
        component_id="r1",
        logging_config=config,
        max_bytes=10**6,
        backup_count=1,
    )
    (log_file,) = tmp_path.glob("*.log")
    return log_file


def access_line(gate: AccessLogGate) -> None:
    msg = access_log_msg(method="POST", route="/v1/embeddings", status="200", latency_ms=1.5)
    gate.info(msg, extra=dict(ACCESS))


def lines(log_file: Path) -> list[dict]:
    return [json.loads(x) for x in log_file.read_text().splitlines()]


def test_off_builds_no_access_record_and_passes_other_lines(
    tmp_path: Path, serve_logger: logging.Logger, records: list[logging.LogRecord]
) -> None:
    log_file = configure(tmp_path, access_log=False)
    gate = AccessLogGate(serve_logger)
    assert access_log_dropped(serve_logger)
    access_line(gate)
    assert records == [] and log_file.read_text() == ""
    gate.info("replica %s started", "r1")  # not an access-log line: written as before
    (record,) = records
    assert record.getMessage() == "replica r1 started"
    # the caller is named, not the gate: one frame more than a direct call
    assert (record.pathname, record.funcName) == (
        __file__,
        "test_off_builds_no_access_record_and_passes_other_lines",
    )
    assert [x["message"] for x in lines(log_file)] == ["replica r1 started"]


def test_on_writes_every_access_line(
    tmp_path: Path, serve_logger: logging.Logger, records: list[logging.LogRecord]
) -> None:
    log_file = configure(tmp_path, access_log=True)
    gate = AccessLogGate(serve_logger)
    assert not access_log_dropped(serve_logger)
    access_line(gate)
    access_line(gate)
    assert len(records) == 2
    assert [("POST /v1/embeddings 200" in x["message"]) for x in lines(log_file)] == [True, True]


def test_a_handler_without_serves_filter_still_gets_the_access_log(
    tmp_path: Path, serve_logger: logging.Logger, records: list[logging.LogRecord]
) -> None:
    configure(tmp_path, access_log=False)
    seen: list[logging.LogRecord] = []
    extra_handler = logging.Handler()
    extra_handler.emit = seen.append  # type: ignore[method-assign]
    serve_logger.addHandler(extra_handler)
    assert not access_log_dropped(serve_logger)
    access_line(AccessLogGate(serve_logger))
    assert len(records) == 1 and len(seen) == 1


def test_gate_access_log_wraps_serves_replica_logger_once(monkeypatch) -> None:
    monkeypatch.setattr(serve_replica, "logger", logging.getLogger("ray.serve"))
    assert gate_access_log() and gate_access_log()
    gate = serve_replica.logger
    assert isinstance(gate, AccessLogGate)
    assert gate.name == "ray.serve" and gate.isEnabledFor(logging.ERROR) is True  # delegated
    monkeypatch.setattr(serve_replica, "logger", logging.getLogger("elsewhere"))
    assert gate_access_log() is False  # not Serve's logger: left as it is, with a warning
    assert isinstance(serve_replica.logger, logging.Logger)
