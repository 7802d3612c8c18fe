"""The reaper of a local Ray that a vlmspec run started: when the run's process is gone,
however it went (SIGKILL included), no process of that Ray session outlives it.

Ray's own shutdown stops its processes when the driver exits cleanly; when the driver is
killed, its DashboardAgent and RuntimeEnvAgent (children of the raylet) were left running
with parent 1. ``start(session_dir)`` runs this module as a process of its own session
(no terminal signal reaches it) reading a pipe the driver holds: end of file means the
driver is gone (or shut Ray down), and the reaper then stops every process that belongs
to the session (a file open in its folder, or the folder in its command line: the agents
rename themselves ``ray::...``), SIGTERM first, then SIGKILL. Linux only (/proc); elsewhere
nothing is started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_S = 3.0     # between SIGTERM and SIGKILL


def start(session_dir: str) -> subprocess.Popen | None:
    """The reaper of ``session_dir``'s processes, watching this process (None off Linux).
    Keep the returned object: its stdin is the pipe whose end of file starts the reaping."""
    if not os.path.isdir("/proc") or not session_dir:
        return None
    return subprocess.Popen([sys.executable, "-m", "vlmspec_cli.tasks.ray_reaper", session_dir,
                             str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def members(session_dir: str, skip: set[int]) -> list[int]:
    """PIDs of the processes that belong to the session (``skip``: the reaper and the run
    itself, which may still hold a log of the session open when it shuts Ray down)."""
    folder = os.path.realpath(session_dir)
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if folder.encode() in fh.read():
                    out.append(int(name))
                    continue
            for fd in os.listdir(f"/proc/{name}/fd"):
                if os.readlink(f"/proc/{name}/fd/{fd}").startswith(folder + os.sep):
                    out.append(int(name))
                    break
        except OSError:   # gone meanwhile, or not ours to look at
            continue
    return out


def reap(session_dir: str, driver: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = members(session_dir, {os.getpid(), driver})
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if not pids:
            return
        time.sleep(GRACE_S)


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdin.buffer.read()     # returns at end of file: the driver closed it or died
    reap(argv[0], int(argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])
