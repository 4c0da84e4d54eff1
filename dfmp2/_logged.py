"""The warnings a run logs, kept for its record.

A run's WARNING lines (a loosely converged SCF, a fitting set short of the orbital basis's
angular momentum, ``--max-memory`` beyond the machine, ...) go to the ``dfmp2`` logger and
from there to the terminal; the JSON a workflow reads later must say them too
(``Result.warnings``, ``extras.warnings``). :func:`kept_warnings` collects the messages of the
WARNING (and higher) records logged under ``dfmp2`` by the calling thread while its block runs:
another thread's run keeps its own. Blocks nest (a counterpoise run around the runs of its
complex and fragments): a record goes to every block open in the thread, so each run keeps its
own warnings and the outer block all of them.

A block of :func:`labelled` names whose run a record is about (a counterpoise fragment's):
the keeper keeps its warnings as ``label: message``, and :class:`LabelledFormatter` (the
``dfmp2`` command's terminal) shows its lines so.

Only records the ``dfmp2`` logger lets through are seen: every WARNING unless a caller raised
that logger's level above WARNING (the ``dfmp2`` command keeps the logger at WARNING and
quietens its terminal handler instead, so ``-q`` runs keep their warnings in the JSON).
"""

from __future__ import annotations

import contextlib
import logging
import threading

__all__ = ["LabelledFormatter", "kept_warnings", "keeper_handlers", "labelled"]

_local = threading.local()  # .open: the lists of this thread's open blocks, innermost last;
# .labels: the labels of this thread's open labelled() blocks, outermost first


@contextlib.contextmanager
def labelled(label: str):
    """Records the calling thread logs while the block runs are about ``label`` (e.g.
    'fragment 2 in its own basis'): kept and shown as ``label: message``."""
    labels = _local.__dict__.setdefault("labels", [])
    labels.append(label)
    try:
        yield
    finally:
        labels.pop()


def _with_label(message: str) -> str:
    """``message`` under the calling thread's open labels, if any."""
    labels = getattr(_local, "labels", ())
    return ": ".join([*labels, message])


class LabelledFormatter(logging.Formatter):
    """A formatter whose message is under the labels of the thread that logs (handlers format
    in the logging thread)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        if getattr(_local, "labels", None):
            record = logging.makeLogRecord({**record.__dict__,
                                            "message": _with_label(record.message)})
        return super().formatMessage(record)


class _Keeper(logging.Handler):
    """Appends each WARNING record's message to the open blocks of the thread that logged it.
    Where no other handler would see the record, it hands it to Python's last resort (stderr),
    as logging does when a logger has no handler: a program that set up no logging shows
    dfmp2's warnings with this handler on the logger as it does without it."""

    def emit(self, record: logging.LogRecord) -> None:
        for kept in getattr(_local, "open", ()):
            kept.append(_with_label(record.getMessage()))
        if logging.lastResort is not None and record.levelno >= logging.lastResort.level \
                and not _other_handlers(record.name):
            logging.lastResort.handle(record)


def _other_handlers(name: str) -> bool:
    """Whether a record of logger ``name`` reaches a handler other than the keeper. The logger
    is looked up without logging's lock: ``emit`` runs under the keeper's lock, and
    ``logging.config`` takes logging's lock and then every handler's (a deadlock otherwise)."""
    logger = logging.Logger.manager.loggerDict.get(name)
    if not isinstance(logger, logging.Logger):  # (a record's logger exists; say it is handled)
        return True
    while logger is not None:
        if any(handler is not _keeper for handler in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


_keeper = _Keeper(level=logging.WARNING)
_lock = threading.Lock()
_users = 0  # threads inside kept_warnings(): the handler is on the logger while any is


def keeper_handlers(source) -> list[logging.Handler]:
    """The keeper among ``source``'s handlers (a logger or a list of handlers): what code that
    replaces the ``dfmp2`` logger's handlers (the CLI's logging set-up) must keep while a
    block is open, so that a run in another thread keeps its record."""
    handlers = source.handlers if isinstance(source, logging.Logger) else source
    return [handler for handler in handlers if handler is _keeper]


def _attach(attached: bool) -> None:
    """Put the keeper on the ``dfmp2`` logger or take it off by giving the logger a new list
    of handlers (under logging's lock where it has one): a thread that is calling the
    handlers meanwhile goes on over the list it had, where removing from it in place would
    make it skip the handler after the keeper."""
    logger = logging.getLogger("dfmp2")
    with getattr(logging, "_lock", None) or contextlib.nullcontext():
        others = [handler for handler in logger.handlers if handler is not _keeper]
        logger.handlers = [*others, _keeper] if attached else others


@contextlib.contextmanager
def kept_warnings():
    """A list that receives, while the block runs, the message of each WARNING the calling
    thread logs under ``dfmp2``."""
    global _users
    kept: list[str] = []
    blocks = _local.__dict__.setdefault("open", [])
    with _lock:
        if _users == 0:
            _attach(True)
        _users += 1
    blocks.append(kept)
    try:
        yield kept
    finally:
        del blocks[next(i for i, block in enumerate(blocks) if block is kept)]  # not by ==
        with _lock:
            _users -= 1
            if _users == 0:
                _attach(False)
