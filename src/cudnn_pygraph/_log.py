"""The package's logging, the way Python libraries do it: records go to named loggers under
`cudnn_pygraph` and the application decides where they end up. Nothing here touches the
root logger.

  cudnn_pygraph           decisions: engine verdicts, the backend's outcome per mode, the
                          plan list, the selected plan, builds, autotune, cache hits/misses
  cudnn_pygraph.progress  work that can take a second or more (builds, autotune), as it runs

CUDNN_PYGRAPH_LOG turns them on without code: 1 / true / on / yes / info -> INFO, debug ->
DEBUG, warning / error -> that level; 0 / false / off / empty -> untouched. An unknown value
means INFO (a typo should not silence the logs it asked for). It attaches ONE stderr handler
to the `cudnn_pygraph` logger and stops propagation, so records are not printed twice where
the application also configured the root logger.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time

LOG_ENV = "CUDNN_PYGRAPH_LOG"
FORMAT = "%(levelname)s:%(name)s:%(message)s"

log = logging.getLogger("cudnn_pygraph")
progress_log = logging.getLogger("cudnn_pygraph.progress")
# A library's loggers carry a NullHandler so that, with logging unconfigured, Python's
# last-resort handler does not print our warnings on its own.
log.addHandler(logging.NullHandler())

_LEVELS = {
    "1": logging.INFO,
    "true": logging.INFO,
    "on": logging.INFO,
    "yes": logging.INFO,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}
_OFF = ("", "0", "false", "off", "no", "none")
_HANDLER_FLAG = "_cudnn_pygraph_env_handler"


class StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of each record (a redirected or
    captured stderr included), not the stream that was current when it was attached."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


def level_from_env(value: str | None) -> int | None:
    """The level CUDNN_PYGRAPH_LOG asks for, or None for "leave logging alone"."""
    if value is None or value.strip().lower() in _OFF:
        return None
    text = value.strip().lower()
    if text.isdigit():
        return int(text) if int(text) > 1 else logging.INFO
    return _LEVELS.get(text, logging.INFO)


def enable(level: int = logging.INFO) -> None:
    """Print this package's records at `level` and above on stderr: one handler, added
    once, on our logger only."""
    log.setLevel(level)
    for h in log.handlers:
        if getattr(h, _HANDLER_FLAG, False):
            h.setLevel(level)
            return
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.setLevel(level)
    setattr(handler, _HANDLER_FLAG, True)
    log.addHandler(handler)
    log.propagate = False


def configure_from_env() -> None:
    level = level_from_env(os.environ.get(LOG_ENV))
    if level is not None:
        enable(level)


@contextlib.contextmanager
def progress(what: str, after_s: float = 1.0, every_s: float = 5.0):
    """Say on `cudnn_pygraph.progress` (INFO) that `what` is still running once it has
    taken `after_s` seconds, then every `every_s` seconds, and how long it took when it
    ends. Work shorter than `after_s` says nothing here: its caller logs the outcome."""
    if not progress_log.isEnabledFor(logging.INFO):
        yield
        return
    start = time.perf_counter()
    done = threading.Event()
    announced = []

    def announce():
        wait = after_s
        while not done.wait(wait):
            announced.append(True)
            progress_log.info("%s: still running (%.0f s)", what, time.perf_counter() - start)
            wait = every_s

    watcher = threading.Thread(target=announce, name="cudnn_pygraph-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        if announced:
            progress_log.info("%s: done in %.1f s", what, time.perf_counter() - start)


configure_from_env()
