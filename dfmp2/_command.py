"""The ``dfmp2`` console command (and ``python -m dfmp2``): :func:`dfmp2.cli.main` with the
process's signal lines in force from its first moment to its last.

A run installs its own handlers (``cli._raise_on_signals``: clean-up, a failure record, one
line). Outside them, a signal used to end the process with no line (SIGTERM, SIGHUP during the
imports of its first second) or with a traceback (SIGINT during them). Here every signal of
:data:`SIGNALS` that the process does not ignore gets a handler before anything else loads:
while the command runs it raises :class:`~dfmp2.errors.Interrupted` (the command group prints
one line, exit status 128 + n); once a run's interruption has said its exit status, a later
signal ends the process with that status at once; and once the command has returned (its
output complete), with the command's own status, at once and without a word: the interpreter's
shutdown takes up to a second, and a signal there killed it silently with another status than
the run's (one that hangs there still ends on the signal, as it did before).
Only the console command does this: ``cli.main`` called inside a program (a notebook, a test)
leaves the program's handlers alone.
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
    """Where the console command stands: ``status`` the exit status it has said (an
    interruption's, or the command's own once it returned), None until then."""

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
    handled = [sig for sig in SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN]
    for sig in handled:  # (one the process ignores, under nohup or in a background job, stays)
        signal.signal(sig, PROCESS.handler)
    from .cli import main as command

    try:
        command()
    except SystemExit as exc:  # click ends every command so
        if PROCESS.status is None:
            code = exc.code
            PROCESS.status = code if isinstance(code, int) else 0 if code is None else 1
        raise
    finally:
        if PROCESS.status is None:  # an exception the command did not turn into a status
            PROCESS.status = 1
