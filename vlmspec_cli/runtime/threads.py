"""CPU threads per phase of a request (``runtime.threads``, ``runtime.prefill_threads``).

A prompt's prefill is one forward over many rows: matrix products large enough for every
core. A decoding round is many forwards over a few rows (one draft token, γ + 1 verified
ones): on small models each operator takes microseconds, and handing it to a second
thread can cost more than it saves (bench/history/RESULTS-until-2026-12-07.md, "CPU threads"). So the engine runs
the two phases at their own counts. torch.set_num_threads is process-wide and cheap to
change (microseconds), and the results do not depend on it beyond float rounding, which
target-only decoding shares (it runs under the same plan).

A count left on auto is a ceiling, not a promise: an OpenMP region waits for its slowest
thread, so a thread whose core another process holds stalls the whole operator. On the
2-core CPU beside two CPU-bound processes the demo's prefills took up to 4.4 s on 2
threads, at most 0.09 s on 1, and its speedup fell from 2.1-2.3x to 0.6-1.1x (issue 34;
bench/runs/2026-11-26/threads-load-cpu.txt). Before each phase the plan lowers an auto count to the
cores other processes leave free (``FreeCores``), and raises it again when they stop. A
count the profile sets is never changed.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch


# the process's own count (torch's default: one per core, or OMP_NUM_THREADS), read before
# any plan changed it: a phase a plan leaves to auto runs at this count at most
PROCESS_THREADS = torch.get_num_threads()

# /proc/stat counts in clock ticks (USER_HZ, 100 on Linux)
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# an estimate covers at least this much wall time since the one before (else the one
# before stands): /proc/stat and os.times() count ticks of a hundredth of a second, so
# over 0.2 s a tick is 5% of a core. Requests shorter than that are followed every few
# requests
MIN_INTERVAL_S = 0.2
# a core other processes use less than this share of the time still counts as free
# (kernel threads, daemons, tick rounding). Small on purpose: a thread that waits for
# its core costs many times its work (the module's docstring), one thread fewer at most
# doubles it
SLACK = 0.1

# busy fields of a /proc/stat cpu line: user nice system [idle iowait] irq softirq steal
# (guest time is inside user already; steal is time the hypervisor gave to another guest)
_BUSY = (0, 1, 2, 5, 6, 7)


def _read_proc_stat() -> str:
    with open("/proc/stat") as f:
        return f.read()


def _own_cpu_s() -> float:
    """CPU seconds this process used so far, every thread of it (not its children)."""
    t = os.times()
    return t.user + t.system


def _affinity() -> frozenset[int]:
    """The cores this process may run on (every core where the OS cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def busy_ticks(stat: str, cpus: frozenset[int]) -> int | None:
    """Busy clock ticks so far of the cores ``cpus``, summed from /proc/stat's ``cpuN``
    lines; None when no line names one of them."""
    busy, seen = 0, False
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            fields = [int(v) for v in rest.split()]
            busy += sum(fields[i] for i in _BUSY if i < len(fields))
            seen = True
    return busy if seen else None


@dataclass
class _Reading:
    wall_s: float
    own_s: float            # this process's CPU seconds
    busy: int | None        # busy ticks of our cores (None: /proc/stat unreadable)


class FreeCores:
    """How many of this process's cores other processes leave free, over the interval
    since the estimate before (at least MIN_INTERVAL_S; the first from construction):

        others = (busy ticks of our cores / ticks per second − our own CPU seconds) / wall seconds
        free   = cores − others            (cores: os.sched_getaffinity)

    Our own CPU time (every thread, spinning OpenMP workers included) is subtracted, so
    our threads never count as competition. Without /proc/stat (not Linux): others =
    the 1-minute load average − our own CPU seconds per second; without either, nothing is
    known (``free`` returns None). Reading both costs microseconds; nothing sleeps.

    The sources are arguments, for tests: ``stat`` returns /proc/stat's text (OSError:
    unreadable), ``own`` this process's CPU seconds, ``loadavg`` os.getloadavg()'s triple,
    ``clock`` seconds."""

    def __init__(self, stat: Callable[[], str] = _read_proc_stat,
                 own: Callable[[], float] = _own_cpu_s, cpus: frozenset[int] | None = None,
                 loadavg: Callable[[], tuple] | None = getattr(os, "getloadavg", None),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stat, self._own, self._loadavg, self._clock = stat, own, loadavg, clock
        self.cpus = cpus if cpus is not None else _affinity()
        self.cores = len(self.cpus)
        self.others: float | None = None    # the last estimate, in cores
        self._last = self._read()

    def _read(self) -> _Reading:
        try:
            busy = busy_ticks(self._stat(), self.cpus)
        except (OSError, ValueError):
            busy = None
        return _Reading(self._clock(), self._own(), busy)

    def free(self) -> float | None:
        """The cores free of other processes (a fraction of a core counts), from the last
        interval of at least MIN_INTERVAL_S; None while nothing can be read."""
        if self._clock() - self._last.wall_s >= MIN_INTERVAL_S:
            now = self._read()
            self.others = self._others(self._last, now, now.wall_s - self._last.wall_s)
            self._last = now
        return None if self.others is None else max(0.0, self.cores - self.others)

    def _others(self, before: _Reading, now: _Reading, wall: float) -> float | None:
        own = now.own_s - before.own_s
        if before.busy is not None and now.busy is not None:
            busy = (now.busy - before.busy) / _TICKS_PER_S
            return max(0.0, (busy - own) / wall)
        if self._loadavg is None:
            return None
        try:
            load = self._loadavg()[0]
        except OSError:
            return None
        return max(0.0, load - own / wall)


# one per process (the cores are the process's): every plan of it reads this one
CPU = FreeCores()


@dataclass(frozen=True)
class ThreadPlan:
    """Thread counts per phase; a plan of two Nones never touches the process's count.
    ``with_defaults`` fills one None with ``PROCESS_THREADS`` when the other phase is set
    (else the first request's rounds would leave the next prefill at their count), and
    both when both are on auto."""

    prefill: int | None = None
    decode: int | None = None
    # a request whose prompt holds at least this many positions decodes at the prefill's
    # count: every round's attention then reads the whole context, compute enough for
    # every core (bench/runs/2026-11-24/long-threads-cpu.txt: the video head's rounds 25% faster on 2
    # threads at 8192 video tokens, the same at 128). None: never
    long_context: int | None = None
    # the phases ("prefill", "decode") left on auto: their count is a ceiling, lowered
    # while other processes use the cores (``fit``)
    auto: frozenset[str] = frozenset()
    # where the free cores are read: the process's one (tests pass their own)
    cpu: FreeCores = field(default=CPU, compare=False, repr=False)

    def count(self, phase: str, context: int = 0) -> int | None:
        """The count ``phase`` runs at now (``context``: the positions the rounds attend
        over); None: the process's count as it is."""
        long = self.long_context is not None and context >= self.long_context
        source = "prefill" if phase == "prefill" or long else "decode"
        n = getattr(self, source)
        return self.fit(n) if n is not None and source in self.auto else n

    def fit(self, ceiling: int) -> int:
        """An auto count under the free cores: max(1, min(ceiling, ⌊free + SLACK⌋))."""
        free = self.cpu.free()
        return ceiling if free is None else max(1, min(ceiling, math.floor(free + SLACK)))

    def enter(self, phase: str, context: int = 0) -> None:
        """Set the count of ``phase`` ("prefill" or "decode")."""
        n = self.count(phase, context)
        if n is not None and n != torch.get_num_threads():
            torch.set_num_threads(n)

    def with_defaults(self) -> "ThreadPlan":
        if self.prefill is None and self.decode is None and not self.auto:
            return self
        return replace(self, prefill=self.prefill or PROCESS_THREADS,
                       decode=self.decode or PROCESS_THREADS)

    def describe(self) -> str:
        """E.g. "1 CPU thread decoding, 2 prefilling", with "(1 while other processes use
        1.6 of 2 cores)" after an auto count lowered now; "" when nothing is set."""
        parts = []
        for phase, what in (("decode", "decoding"), ("prefill", "prefilling")):
            n = getattr(self, phase)
            if n is None:
                continue
            parts.append(f"{n} {what}")
            now = self.fit(n) if phase in self.auto else n
            if now < n:
                parts[-1] += (f" ({now} while other processes use {self.cpu.others:.1f} of "
                              f"{self.cpu.cores} cores)")
        if parts and self.long_context is not None and self.prefill != self.decode:
            parts[0] += f" ({self.prefill} from {self.long_context} positions)"
        return f"CPU threads: {', '.join(parts)}" if parts else ""
