"""CPU threads per phase of a request (``runtime.threads``, ``runtime.prefill_threads``).

A prompt's prefill is one forward over many rows: matrix products large enough for every
core. A decoding round is many forwards over a few rows (one draft token, γ + 1 verified
ones): on small models each operator takes microseconds, and handing it to a second
thread can cost more than it saves (bench/RESULTS.md, "CPU threads"). So the engine runs
the two phases at their own counts. torch.set_num_threads is process-wide and cheap to
change (microseconds), and the results do not depend on it beyond float rounding, which
target-only decoding shares (it runs under the same plan).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


# the process's own count (torch's default: one per core, or OMP_NUM_THREADS), read before
# any plan changed it: a phase a plan leaves to auto runs at this count
PROCESS_THREADS = torch.get_num_threads()


@dataclass(frozen=True)
class ThreadPlan:
    """Thread counts per phase; a plan of two Nones never touches the process's count.
    ``with_defaults`` fills one None with ``PROCESS_THREADS`` when the other phase is set
    (else the first request's rounds would leave the next prefill at their count)."""

    prefill: int | None = None
    decode: int | None = None
    # a request whose prompt holds at least this many positions decodes at the prefill's
    # count: every round's attention then reads the whole context, compute enough for
    # every core (bench/long-threads-cpu.txt: the video head's rounds 25% faster on 2
    # threads at 8192 video tokens, the same at 128). None: never
    long_context: int | None = None

    def enter(self, phase: str, context: int = 0) -> None:
        """Set the count of ``phase`` ("prefill" or "decode"; ``context``: the positions the
        rounds attend over)."""
        long = self.long_context is not None and context >= self.long_context
        n = self.prefill if phase == "prefill" or long else self.decode
        if n is not None and n != torch.get_num_threads():
            torch.set_num_threads(n)

    def with_defaults(self) -> "ThreadPlan":
        if self.prefill is None and self.decode is None:
            return self
        return ThreadPlan(prefill=self.prefill or PROCESS_THREADS, decode=self.decode or PROCESS_THREADS,
                          long_context=self.long_context)

    def describe(self) -> str:
        """E.g. "1 CPU thread decoding, 2 prefilling"; "" when nothing is set."""
        parts = []
        for n, what in ((self.decode, "decoding"), (self.prefill, "prefilling")):
            if n is not None:
                parts.append(f"{n} {what}")
        if parts and self.long_context is not None and self.prefill != self.decode:
            parts[0] += f" ({self.prefill} from {self.long_context} positions)"
        return f"CPU threads: {', '.join(parts)}" if parts else ""
