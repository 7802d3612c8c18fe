"""How a command stops: Ctrl-C (KeyboardInterrupt, exit 130) and SIGTERM (``Terminated``,
exit 143) end it with one line saying what was finished and recorded, also when the stop
lands in a finalizer. Knows click only through ``fail``."""

from __future__ import annotations

import contextlib
import os
import sys

from vlmspec_cli.cli.common import fail


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a scheduler's stop), raised where Ctrl-C raises KeyboardInterrupt:
    the same clean stop (whole records, one line saying what was kept), exit 143."""


def _terminate(signum, frame) -> None:
    raise Terminated()


def stop_on_sigterm() -> None:
    """SIGTERM stops a command as Ctrl-C does, not silently mid-write (the process's entry
    point installs it; its default would end the process with no word of what was saved).
    A stop raised while Python runs a finalizer (``__del__``, a weakref callback) is
    swallowed there ("Exception ignored in ..."): once in six tries at start-up the run
    then went on to exit 0. The unraisable hook delivers such a stop again, as a signal,
    to the code that runs next."""
    import signal

    signal.signal(signal.SIGTERM, _terminate)
    sys.unraisablehook = _stops_delivered_again(sys.unraisablehook)


def _stops_delivered_again(hook):
    import signal
    import threading

    def unraisable(info) -> None:
        if isinstance(info.exc_value, KeyboardInterrupt):
            stop = signal.SIGTERM if isinstance(info.exc_value, Terminated) else signal.SIGINT
            # sent from another thread a moment later: raised here, in the hook, it would be
            # swallowed again; the main thread's handler raises it once the finalizer is done
            threading.Timer(0.01, os.kill, (os.getpid(), stop)).start()
            return
        hook(info)

    return unraisable


def stop_code(exc: BaseException) -> int:
    """The exit code of a stop: 143 (128 + SIGTERM) for ``Terminated``, 130 for Ctrl-C."""
    return 143 if isinstance(exc, Terminated) else 130


def stop_word(exc: BaseException) -> str:
    return "terminated" if isinstance(exc, Terminated) else "interrupted"


@contextlib.contextmanager
def exit_130_on_interrupt(sink, emit):
    """Ctrl-C during a batch: one line saying how much was finished and recorded, exit 130
    (SIGTERM: 143).
    Yields ``emit`` counting the finished inputs."""
    finished = 0

    def counted(record: dict) -> None:
        nonlocal finished
        before = None if sink is None else sink.written
        try:
            emit(record)
        except KeyboardInterrupt:
            if sink is not None and sink.written > before:   # its record was kept whole
                finished += 1
            raise
        finished += 1

    try:
        yield counted
    except KeyboardInterrupt as exc:
        if sink is not None:
            # every finished input's record goes to the sink: an interrupt landing between
            # a record's write and the count above (a few bytecodes; seen 1 run in ~10 of
            # test_sigint_subprocess...) must not report fewer inputs than records
            finished = max(finished, sink.written)
        saved = ("" if sink is None else
                 f"; {sink.written} record(s) written to {sink.path} by this run" + (
                     "" if sink.stream else ", a rerun with the same --out resumes"))
        fail(f"{stop_word(exc)}: {finished} input(s) finished{saved}", stop_code(exc))
