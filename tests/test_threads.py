"""runtime/threads.py: the cores other processes leave free (FreeCores).

The estimate's sources (/proc/stat's text, this process's CPU seconds, the load average,
a clock) are FreeCores' arguments: ``Machine`` below fakes them.
"""

from __future__ import annotations

import pytest

from vlmspec_cli.runtime import threads
from vlmspec_cli.runtime.threads import FreeCores

HZ = threads._TICKS_PER_S


class Machine:
    """A fake machine: ``cores`` cores this process may use plus one it may not (whose
    busy time must not count), this process's CPU seconds and a clock; ``run`` advances
    them with ``others`` cores' worth of other processes' work and ``own`` of ours."""

    def __init__(self, cores: int = 2) -> None:
        self.cores, self.clock, self.own = cores, 1000.0, 40.0
        self.busy = [3000.0] * (cores + 1)      # ticks; the last core is outside the affinity
        self.idle = [9000.0] * (cores + 1)

    def run(self, seconds: float, others: float, own: float = 0.0) -> None:
        self.clock += seconds
        self.own += own * seconds
        for i in range(self.cores):
            used = (others + own) / self.cores * seconds * HZ
            self.busy[i] += used
            self.idle[i] += seconds * HZ - used
        self.busy[-1] += seconds * HZ             # a core we may not run on: always busy

    def stat(self) -> str:
        lines = ["cpu  1 2 3 4 5 6 7 8 9 10", "intr 123 4 5"]   # the total and others: unread
        for i, (busy, idle) in enumerate(zip(self.busy, self.idle)):
            b = round(busy)
            user, system, softirq = b // 2, b // 4, b // 8
            steal = b - user - system - softirq
            # user nice system idle iowait irq softirq steal guest guest_nice (guest is
            # inside user: not counted twice); idle and iowait are not busy
            lines.append(f"cpu{i} {user} 0 {system} {round(idle)} 55 0 {softirq} {steal} {user} 0")
        return "\n".join(lines) + "\n"

    def free_cores(self) -> FreeCores:
        return FreeCores(stat=self.stat, own=lambda: self.own, cpus=frozenset(range(self.cores)),
                         loadavg=None, clock=lambda: self.clock)


def test_free_cores_are_the_affinitys_cores_less_other_processes_busy_time():
    """free = cores − (busy ticks of our cores − our own CPU time) / wall time, over the
    interval since the last estimate (at least MIN_INTERVAL_S; shorter: the last stands);
    a core outside the affinity and idle/iowait/guest ticks do not count."""
    m = Machine(cores=2)
    cpu = m.free_cores()
    m.run(1.0, others=1.5, own=0.5)
    assert cpu.free() == pytest.approx(0.5, abs=0.02) and cpu.others == pytest.approx(1.5, abs=0.02)
    m.run(threads.MIN_INTERVAL_S / 2, others=0.0, own=2.0)   # too short to tell
    assert cpu.free() == pytest.approx(0.5, abs=0.02)
    m.run(1.0, others=0.0, own=2.0)       # our own threads on both cores: not competition
    assert cpu.free() == pytest.approx(2.0, abs=0.02)
    m.run(2.0, others=2.0, own=0.0)
    assert cpu.free() == pytest.approx(0.0, abs=0.02)
    assert cpu.cores == 2


def test_without_proc_stat_the_load_average_less_own_use_and_without_either_nothing():
    """Not Linux: others = 1-minute load average − our CPU seconds per second; nothing
    readable: no estimate."""
    clock, own = [0.0], [0.0]

    def no_stat() -> str:
        raise OSError("no /proc/stat")

    cpu = FreeCores(stat=no_stat, own=lambda: own[0], cpus=frozenset({0, 1}),
                    loadavg=lambda: (1.8, 1.0, 0.5), clock=lambda: clock[0])
    clock[0], own[0] = 1.0, 0.3
    assert cpu.free() == pytest.approx(0.5)
    blind = FreeCores(stat=no_stat, own=lambda: 0.0, cpus=frozenset({0, 1}), loadavg=None,
                      clock=lambda: clock[0])
    clock[0] = 5.0
    assert blind.free() is None
