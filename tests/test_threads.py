"""runtime/threads.py: auto thread counts follow the cores other processes leave free.

The estimate's sources (/proc/stat's text, this process's CPU seconds, the load average,
a clock) are FreeCores' arguments: ``Machine`` below fakes them, and the last test reads
the real ones with CPU-bound competitors running. Mutation-checked on the branch that
added them (fix/thread-plan): each fails when a behaviour it names is taken out (auto as
a fixed ceiling, as before; our own CPU time not subtracted; cores outside the affinity
counted; explicit counts following the load; no minimum interval; no load-average
fallback; no floor of 1 thread).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime import threads
from vlmspec_cli.runtime.threads import FreeCores, ThreadPlan
from vlmspec_cli.session import thread_plan

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


def test_auto_drops_to_one_while_others_use_the_cores_and_comes_back_to_the_measured_count():
    """The shipped caption profile: rounds at runtime.threads 1, prefill on auto, here the
    measured 4 (hardware.prefill_threads) on a 4-core machine. Busy: the prefill runs on
    what is free (at least 1), the plan line says so; idle again: back to 4, never above."""
    m = Machine(cores=4)
    plan = replace(thread_plan(load_profile(None, ["runtime.threads=1", "hardware.prefill_threads=4"])),
                   cpu=m.free_cores())
    seen = []
    for others in (0.0, 3.5, 1.0, 0.0):
        m.run(1.0, others=others, own=1.0 if others < 3 else 0.5)
        plan.enter("prefill")
        seen.append((torch.get_num_threads(), plan.count("decode")))
        if others == 3.5:
            assert plan.describe() == ("CPU threads: 1 decoding, 4 prefilling "
                                       "(1 while other processes use 3.5 of 4 cores)")
    assert seen == [(4, 1), (1, 1), (3, 1), (4, 1)]
    assert plan.describe() == "CPU threads: 1 decoding, 4 prefilling"
    # measured 2 on the same idle machine: 2, not the 4 free cores
    capped = replace(plan, prefill=2)
    assert capped.count("prefill") == 2
    # both phases on auto and nothing measured: the process's count, lowered alike
    both = replace(thread_plan(load_profile(None, ["runtime.threads=auto"])), cpu=m.free_cores())
    assert both.auto == {"prefill", "decode"}
    m.run(1.0, others=3.9)
    assert both.count("prefill") == both.count("decode") == 1


def test_an_explicit_count_is_never_changed():
    """runtime.threads / runtime.prefill_threads set (a profile or --set): the count
    stands however busy the cores are, and the plan line says nothing of load."""
    m = Machine(cores=2)
    plan = replace(thread_plan(load_profile(None, ["runtime.threads=3", "runtime.prefill_threads=2",
                                                   "runtime.long_context=100"])),
                   cpu=m.free_cores())
    assert plan.auto == frozenset()
    m.run(1.0, others=2.0)
    for phase, context, want in (("prefill", 0, 2), ("decode", 0, 3), ("decode", 100, 2)):
        plan.enter(phase, context)
        assert torch.get_num_threads() == want
    assert plan.describe() == "CPU threads: 3 decoding (2 from 100 positions), 2 prefilling"
    # one phase set, the other on auto: only the auto one follows the load
    mixed = replace(thread_plan(load_profile(None, ["runtime.threads=auto", "runtime.prefill_threads=2"])),
                    decode=2, cpu=m.free_cores())
    m.run(1.0, others=2.0)
    assert (mixed.count("prefill"), mixed.count("decode")) == (2, 1)


def test_without_proc_stat_the_load_average_less_own_use_and_without_either_the_ceiling():
    """Not Linux: others = 1-minute load average − our CPU seconds per second; nothing
    readable: auto keeps its count (as before auto followed the load)."""
    clock, own = [0.0], [0.0]

    def no_stat() -> str:
        raise OSError("no /proc/stat")

    cpu = FreeCores(stat=no_stat, own=lambda: own[0], cpus=frozenset({0, 1}),
                    loadavg=lambda: (1.8, 1.0, 0.5), clock=lambda: clock[0])
    clock[0], own[0] = 1.0, 0.3
    assert cpu.free() == pytest.approx(0.5)
    plan = ThreadPlan(prefill=2, decode=1, auto=frozenset({"prefill"}), cpu=cpu)
    assert plan.count("prefill") == 1
    blind = FreeCores(stat=no_stat, own=lambda: 0.0, cpus=frozenset({0, 1}), loadavg=None,
                      clock=lambda: clock[0])
    clock[0] = 5.0
    assert blind.free() is None
    assert replace(plan, cpu=blind).count("prefill") == 2


_COMPETITOR = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


def test_under_real_cpu_bound_competitors_auto_runs_on_fewer_threads():
    """Two CPU-bound processes (each stops by itself after 6 s) beside a plan whose auto
    prefill ceiling is every core of the affinity: the count it picks leaves them a core
    at least, so 1 on the 2-core machine of bench/. On n cores they hold min(2, n) of
    them, and other load only lowers the count, so the bound cannot flake on more cores."""
    if threads.busy_ticks(_proc_stat(), threads._affinity()) is None:
        pytest.skip("needs /proc/stat (Linux): elsewhere the load average lags by a minute")
    n = len(threads._affinity())
    procs = [subprocess.Popen([sys.executable, "-c", _COMPETITOR.format(s=6)]) for _ in range(2)]
    try:
        time.sleep(0.5)                    # both started and spinning
        cpu = FreeCores()                  # a fresh interval: only the competitors' time
        time.sleep(1.0)
        plan = ThreadPlan(prefill=n, decode=1, auto=frozenset({"prefill"}), cpu=cpu)
        plan.enter("prefill")
        chosen = torch.get_num_threads()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert cpu.others > min(2, n) - 0.5, cpu.others
    assert chosen <= max(1, n - 1), (chosen, n, cpu.others)
    if n == 2:
        assert chosen == 1


def _proc_stat() -> str:
    try:
        with open("/proc/stat") as f:
            return f.read()
    except OSError:
        return ""
