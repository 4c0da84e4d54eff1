"""Quiet the libraries' own printing for one thread, without touching any other thread's output.

PySCF prints advice to ``sys.stdout``/``sys.stderr`` (install basis-set-exchange, ETB recipes,
'ECP not found') and warns about basis sets; qcelemental prints its warnings. dfmp2 turns those
libraries' failures into its own one-line errors, so their text must not reach the terminal.
``contextlib.redirect_stdout`` would replace the process's streams for every thread: a run in a
worker thread (a notebook's background task, a thread pool) would swallow what the other threads
print, and two runs at once would restore each other's replacement and leave it for good.

:func:`quiet` instead installs, while any thread is inside it, a pair of stream proxies that send
the writes of the threads inside it to their own buffers and every other thread's to the stream
they stand in for; when the last thread leaves, the streams they replaced are put back (where
nothing else replaced them meanwhile). A warning a quiet thread raises is shown through
``sys.stderr`` by Python's default ``showwarning``, so it lands in that thread's buffer too; the
process's warning filters are never changed (a filter is global: adding and removing one while
other threads run would race with theirs).
"""

from __future__ import annotations

import collections
import contextlib
import io
import sys
import threading

__all__ = ["quiet"]

_local = threading.local()  # .buffer: this thread's StringIO while it is quiet
_lock = threading.Lock()
_inside: set[int] = set()  # the threads inside quiet(); one set.add/discard each, so a signal
#                            between two statements cannot leave a count wrong
_installed: dict[str, tuple] = {}  # "stdout"/"stderr" -> (the proxy, the stream it replaced)
#: Proxies taken out of ``sys.stdout``/``sys.stderr``, kept alive a while: a thread inside
#: ``print`` holds a borrowed reference to the stream it looked up, which must not be freed
#: under it when another thread puts the original back. A bounded number, so a process that
#: makes many runs under many different streams (a test runner's captures) holds few of them.
_retired: collections.deque = collections.deque(maxlen=64)


class _PerThread:
    """A stream that writes a quiet thread's text to its buffer and any other thread's to the
    stream it stands in for (every other attribute is that stream's)."""

    def __init__(self, target):
        self._target = target

    def write(self, text):
        buffer = getattr(_local, "buffer", None)
        return buffer.write(text) if buffer is not None else self._target.write(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        if getattr(_local, "buffer", None) is None:
            self._target.flush()

    def __getattr__(self, name):
        return getattr(self._target, name)


def _install() -> None:
    """Put the proxies in place (once: a no-op while they are). A stream that is None (no
    console: pythonw, some daemons) stays None, where printing already does nothing."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if name in _installed or stream is None:
            continue
        proxy = _PerThread(stream)
        _installed[name] = (proxy, stream)
        setattr(sys, name, proxy)


def _uninstall() -> None:
    """Put the replaced streams back where the proxies still stand."""
    for name in list(_installed):
        proxy, stream = _installed.pop(name)
        if getattr(sys, name) is proxy:  # else someone replaced it since: theirs stays
            setattr(sys, name, stream)
        _retired.append(proxy)


@contextlib.contextmanager
def quiet():
    """Inside: what this thread prints to ``sys.stdout``/``sys.stderr`` (warnings included)
    is kept in a buffer, which is yielded (a ``StringIO``). Nested uses in one thread share the
    outer buffer. Other threads' output goes where it went."""
    outer = getattr(_local, "buffer", None)
    if outer is not None:
        yield outer
        return
    buffer = io.StringIO()
    me = threading.get_ident()
    try:
        with _lock:
            _install()
            _inside.add(me)
        _local.buffer = buffer
        yield buffer
    finally:
        _local.buffer = None
        with _lock:
            _inside.discard(me)
            if not _inside:
                _uninstall()
