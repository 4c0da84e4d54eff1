"""The ``dfmp2`` console command (and ``python -m dfmp2``): :func:`dfmp2.cli.main` with the
process's signal lines in force from its first moment to its last.

A run installs its own handlers (``cli._raise_on_signals``: clean-up, a failure record, one
line). Outside them, a signal used to end the process with no line (SIGTERM, SIGHUP during the
imports of its first second) or with a traceback (SIGINT during them). Here every signal of
:data:`SIGNALS` that the process does not ignore gets a handler before anything else loads:
outside the run's own handlers (the imports, the checks, the output after the run) it prints one
line and ends the process with status 128 + n at once; once a run's interruption has said its
exit status, a later signal ends the process with that status, silently. When the command
returns, a program's own handlers (and Python's SIGINT one) are put back (a program that ran
the command in its own process, through ``runpy`` or ``%run -m dfmp2``, goes on with its own);
where the default was there, which ends the process, this handler stays: in the interpreter's
last moments a signal still ends it, with the status a line has said. In a thread other than
the main one, where no handler can be set, the command runs with the handlers as they are.
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
        """Outside a run's own handlers nothing needs cleaning up: the line (unless an
        interruption's line has said the status already) and the exit, at once. Raising here
        instead would unwind through whatever runs (torch's compiled import code aborts on it)."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError, RuntimeError):  # (a write under way)
                pass
        if self.status is None:
            self.status = 128 + signum
            line = (f"error: interrupted by {signal.Signals(signum).name}; exit status "
                    f"{self.status}\n")
            try:
                os.write(2, line.encode())
            except OSError:
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
            if handler not in (signal.SIG_DFL, None):  # a program's own (or Python's SIGINT)
                signal.signal(sig, handler)  # the default would end the process: this one too,
            #                                  with the status a line has said, if any
