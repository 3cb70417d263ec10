"""Rank 0 whose process runs out of file descriptors once its rendezvous store serves.

    nofile_worker.py FLAG TIMEOUT

A thread waits until this process's own client is connected to its store at MASTER_PORT (so
rank 0 has written its secret file and needs no new descriptor to finish its handshake), lowers
this process's open-file limit to the descriptors it holds, so that the store's next accept()
fails with EMFILE, and writes FLAG (the other rank may start); the main thread runs
init_worker.py TIMEOUT.
"""

import contextlib
import os
import resource
import runpy
import sys
import threading
import time
from pathlib import Path

flag, timeout = Path(sys.argv[1]), sys.argv[2]
port = int(os.environ["MASTER_PORT"])


def connected_to_store() -> bool:
    """True when one of this process's sockets is an established TCP connection to the store's port."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                mine.add(link[8:-1])
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port, state, inode = int(fields[2].split(":")[1], 16), fields[3], fields[9]
        if remote_port == port and state == "01" and inode in mine:
            return True
    return False


def starve() -> None:
    end = time.monotonic() + 60
    while not connected_to_store() and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(0.5)  # its handshake, which needs no new descriptor either way
    lowest_free = os.dup(0)
    os.close(lowest_free)
    flag.write_text("")  # before the limit: writing it takes a descriptor
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


threading.Thread(target=starve, daemon=True).start()
worker = str(Path(__file__).with_name("init_worker.py"))
sys.argv = [worker, timeout]
runpy.run_path(worker, run_name="__main__")
