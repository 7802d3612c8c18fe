"""What other libraries print that is not the user's business, silenced for a command's
run (each names the library and what it says; everything else they say still shows):

- transformers: "`past_key_values` is deprecated ... Use `cache` instead" (FutureWarning).
  vlmspec passes the name the installed version takes (runtime/adapters/base.py
  ``cache_arg``); this is for a model whose forward hides its parameters (remote code).
- bitsandbytes: "Failed to load CPU gemm_4bit_forward from kernels-community" (a log
  warning when it is imported on a CPU with AVX512-BF16 and without the optional
  ``kernels`` package; its own 4-bit CPU kernels are used instead).
- Ray: its C++ core worker's log lines, which it writes to file descriptor 2 past Python
  (an ERROR for every --executor ray run: "Actor ... has constructor arguments in the
  object store and max_restarts > 0", about Ray Data's own actor pool). A failed worker
  or input still fails its records, and Ray's Python messages still show.
  (RAY_BACKEND_LOG_LEVEL cannot do it: setting it prints a line of its own.)"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import warnings


class _Drop(logging.Filter):
    """Drops the log records whose message holds ``needle``."""

    def __init__(self, needle: str) -> None:
        super().__init__()
        self.needle = needle

    def filter(self, record: logging.LogRecord) -> bool:
        return self.needle not in record.getMessage()


_BNB_CPU = logging.getLogger("bitsandbytes.backends.cpu.ops")


def silence_library_noise() -> None:
    """Install the filters of transformers' and bitsandbytes' messages (idempotent)."""
    warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated",
                            category=FutureWarning)
    if not any(isinstance(f, _Drop) for f in _BNB_CPU.filters):
        _BNB_CPU.addFilter(_Drop("gemm_4bit_forward"))


# "[2026-11-26 11:40:09,436 E 8030 8030] core_worker.cc:2465: ..." (spdlog's pattern)
_RAY_BACKEND_LINE = re.compile(rb"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [TDIWEF] \d+ \d+\] ")


@contextlib.contextmanager
def ray_backend_lines_hidden():
    """While Ray runs: file descriptor 2 is a pipe whose lines go on to the real stderr,
    but for Ray's C++ log lines; Python's ``sys.stderr`` writes to the real stderr
    directly (a progress display keeps its terminal). Nothing changes where ``sys.stderr``
    is not descriptor 2 (a test runner capturing it)."""
    try:
        sys.stderr.flush()
        if sys.stderr.fileno() != 2:
            raise ValueError("stderr is not descriptor 2")
        real = os.dup(2)
    except (AttributeError, OSError, ValueError):   # io.UnsupportedOperation is both
        yield
        return
    read, write = os.pipe()
    os.dup2(write, 2)     # Ray's processes started now inherit the pipe, and keep it
    os.close(write)
    pump = threading.Thread(target=_copy_lines, args=(read, real), daemon=True)
    pump.start()
    python_stderr = sys.stderr
    sys.stderr = open(real, "w", encoding=python_stderr.encoding, errors=python_stderr.errors,
                      buffering=1, closefd=False)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = python_stderr
        os.dup2(real, 2)  # the pump keeps copying what Ray's processes still write


def _copy_lines(read: int, real: int) -> None:
    with open(read, "rb") as pipe:
        for line in iter(pipe.readline, b""):
            if not _RAY_BACKEND_LINE.match(line):
                os.write(real, line)
