"""Quiet the libraries' own printing for one thread, without touching any other thread's output.

PySCF prints advice to ``sys.stdout``/``sys.stderr`` (install basis-set-exchange, ETB recipes,
'ECP not found') and warns about basis sets; qcelemental prints its warnings. dfmp2 turns those
libraries' failures into its own one-line errors, so their text must not reach the terminal.
``contextlib.redirect_stdout`` would replace the process's streams for every thread: a run in a
worker thread (a notebook's background task, a thread pool) would swallow what the other threads
print, and two runs at once would restore each other's replacement and leave it for good.

:func:`quiet` instead installs, while any thread is inside it, one pair of stream proxies that
send the writes of the threads inside it to their own buffers and every other thread's to the
stream they replaced; the last thread to leave puts the original streams back (where nothing
else replaced them meanwhile). The warnings filter is added and removed the same way.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
import warnings

__all__ = ["quiet"]

_local = threading.local()  # .buffer: this thread's StringIO while it is quiet
_lock = threading.Lock()
_users = 0
_installed: dict = {}  # "stdout"/"stderr" -> (the proxy, the stream it replaced); "filter"


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


#: Every proxy made, by the id of the stream it stands for, kept for the process's life: a
#: thread inside ``print`` holds a borrowed reference to the ``sys.stdout`` it looked up, so a
#: proxy freed when another thread puts the original stream back would crash it. One proxy per
#: stream is reused, so this holds a few objects however many runs a process makes.
_proxies: dict[int, tuple] = {}


def _proxy_for(stream) -> _PerThread:
    if isinstance(stream, _PerThread):  # already ours (a stream someone saved and gave back)
        return stream
    kept = _proxies.get(id(stream))
    if kept is None or kept[0] is not stream:
        kept = (stream, _PerThread(stream))
        _proxies[id(stream)] = kept
    return kept[1]


@contextlib.contextmanager
def quiet(ignore_warnings: str | None = None):
    """Inside: what this thread prints to ``sys.stdout``/``sys.stderr`` is kept in a buffer,
    and warnings whose message matches the regular expression ``ignore_warnings`` are not
    shown (any thread's, while one is inside). Yields the buffer (a ``StringIO``). Nested uses
    in one thread share the outer buffer."""
    global _users
    outer = getattr(_local, "buffer", None)
    if outer is not None:
        yield outer
        return
    buffer = io.StringIO()
    with _lock:
        if _users == 0:
            for name in ("stdout", "stderr"):
                stream = getattr(sys, name)
                proxy = _proxy_for(stream)
                setattr(sys, name, proxy)
                _installed[name] = (proxy, stream)
        if ignore_warnings is not None and ("filter", ignore_warnings) not in _installed:
            warnings.filterwarnings("ignore", message=ignore_warnings)
            _installed["filter", ignore_warnings] = warnings.filters[0]
        _users += 1
    _local.buffer = buffer
    try:
        yield buffer
    finally:
        _local.buffer = None
        with _lock:
            _users -= 1
            if _users == 0:
                for name in ("stdout", "stderr"):
                    proxy, stream = _installed.pop(name)
                    if getattr(sys, name) is proxy:  # else someone replaced it since: theirs
                        setattr(sys, name, stream)
                for key in [k for k in _installed if isinstance(k, tuple)]:
                    entry = _installed.pop(key)
                    with contextlib.suppress(ValueError):
                        warnings.filters.remove(entry)
                _filters_mutated()


def _filters_mutated() -> None:
    """Tell the warnings machinery its filter list changed (as ``filterwarnings`` does), so no
    call site keeps a decision cached under the removed filter; the hook's name differs across
    Python versions, and without one the cache only lasts until the next filter change."""
    for name in ("_filters_mutated", "_filters_mutated_lock_held"):
        hook = getattr(warnings, name, None)
        if hook is not None:
            with contextlib.suppress(Exception):
                hook()
            return
