"""Which backends and execution modes can run here, and why not when they cannot."""

from __future__ import annotations

import torch

from .registry import DispatchPolicy, probe_nki

__all__ = ["backend_report"]


def backend_report(nki_emulator: bool = False, nki_simulator: bool = False):
    """Rows ``(backend, mode, available, reason)`` for pytorch (cpu, cuda) and nki (hardware,
    simulator, emulator). ``nki_emulator`` / ``nki_simulator`` say whether the user opted in."""
    rows = [("pytorch", "cpu", True, f"torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads")]
    if torch.cuda.is_available():
        rows.append(("pytorch", "cuda", True, torch.cuda.get_device_name(0)))
    else:
        rows.append(("pytorch", "cuda", False, "torch.cuda.is_available() is False here"))
    for mode, policy in (
        ("hardware", DispatchPolicy("nki")),
        ("simulator", DispatchPolicy("nki", nki_simulator=True)),
        ("emulator", DispatchPolicy("nki", nki_emulator=True)),
    ):
        found, reason = probe_nki(policy)
        if found == mode:
            note = "available"
            if mode == "emulator":
                note = ("dfmp2's NumPy emulator: correctness only, never a performance number; "
                        + ("opted in" if nki_emulator else "opt in with --nki-emulator"))
            rows.append(("nki", mode, True, note))
        else:
            why = reason if found is None else f"this host resolves to {found} mode instead"
            rows.append(("nki", mode, False, why))
    return rows
