"""Removes a node's in-memory checkpoints once the launcher that owns them has exited, however it exited.

    python -I reaper.py PID DIRECTORY

Started by the rank that created DIRECTORY (checkpoint/memory.py), in a session of its own so that
the launcher's killing of its ranks (a process group each) spares it, and forking once so that it is
no rank's child (the rank waits for the first process, which exits at once), as a file run by path: it
imports nothing of dtcore (nor torch), so it costs a few MB and milliseconds. It waits for process
PID (the node's launcher, which the ranks are children of) to end, through a pidfd where Linux has
them (5.3 and newer) and by polling otherwise, then removes DIRECTORY and exits.
"""

from __future__ import annotations

import os
import select
import shutil
import sys
import time

_POLL_S = 0.5  # without pidfds: how often the launcher is looked for


def wait_for_exit(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # gone already
    except (AttributeError, OSError):  # no pidfds here: look now and then
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            except PermissionError:
                pass  # alive, under another user
            time.sleep(_POLL_S)
    try:
        select.select([fd], [], [])  # a pidfd reads as ready once its process has exited
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[1].isdigit():
        sys.stderr.write("usage: python -I reaper.py PID DIRECTORY\n")
        return 2
    pid, directory = int(argv[1]), argv[2]
    if os.fork() > 0:
        return 0  # the rank that started it waits for this first process only: the reaper is nobody's child
    wait_for_exit(pid)
    shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
