"""Tests of dfmp2's NKI kernels and host wrappers (emulator; simulator, hardware if present)."""
