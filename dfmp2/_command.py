"""The ``dfmp2`` console command (and ``python -m dfmp2``): :func:`dfmp2.cli.main` with the
process's signal lines in force from its first moment to its last.

A run installs its own handlers (``cli._raise_on_signals``: clean-up, a failure record, one
line). Outside them, a signal used to end the process with no line (SIGTERM, SIGHUP during the
imports of its first second) or with a traceback (SIGINT during them). Here every signal of
:data:`SIGNALS` that the process does not ignore gets a handler before anything else loads:
while the command runs it raises :class:`~dfmp2.errors.Interrupted` (the command group prints
one line, exit status 128 + n); once a run's interruption has said its exit status, a later
signal ends the process with that status at once. When the command returns, the handlers that
were there before are put back (a program that ran the command in its own process, through
``runpy`` or ``%run -m dfmp2``, goes on with its own); a signal in the interpreter's last moments
after that ends the process as it would have without dfmp2. In a thread other than the main one,
where no handler can be set, the command runs with the process's handlers as they are.
"""

from __future__ import annotations

import os
import signal
import sys

#: What ends a run with one line and exit status 128 + n: terminals' (INT, QUIT), a closed
#: session's (HUP) and batch schedulers' (TERM; USR1 and USR2, SGE's and SLURM's notices).
SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT",
                                                   "SIGUSR1", "SIGUSR2") if hasattr(signal, name))


class _Process:
    """Where the console command stands: ``status`` the exit status an interruption's line has
    said, None until then."""

    status: int | None = None

    def handler(self, signum, _frame) -> None:
        if self.status is None:
            from .errors import Interrupted

            raise Interrupted(signum, signal.Signals(signum).name)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(self.status)


#: The console command's state (one per process, as its signal handlers are).
PROCESS = _Process()


def main() -> None:
    PROCESS.status = None
    previous = {}
    for sig in SIGNALS:  # (one the process ignores, under nohup or in a background job, stays)
        if signal.getsignal(sig) is not signal.SIG_IGN:
            try:
                previous[sig] = signal.signal(sig, PROCESS.handler)
            except ValueError:  # not the main thread: no handler can be set
                break
    from .cli import main as command

    try:
        command()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
