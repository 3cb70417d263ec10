"""The node's log: everything this process and the workers it starts write, also written to a file.

The launcher's file descriptors 1 and 2 are replaced by pipes before any worker starts, so the
workers (which inherit them) and the agent write into the same two pipes; one thread per pipe
copies what arrives to the terminal's original stream and to the log file. Nothing is buffered
in between: a line reaches the file when it reaches the terminal.
"""

from __future__ import annotations

import os
import sys
import threading


class NodeLog:
    """Tees fds 1 and 2 of this process (and its future children) into `path` until close()."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path
        self._file = open(path, "ab", buffering=0)
        self._lock = threading.Lock()  # stdout and stderr chunks go to the file whole, never interleaved
        self._saved: list[int] = []
        self._threads: list[threading.Thread] = []
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in (1, 2):
            saved = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            self._saved.append(saved)
            thread = threading.Thread(target=self._pump, args=(read_end, saved), daemon=True, name=f"tee-{fd}")
            thread.start()
            self._threads.append(thread)

    def _pump(self, read_end: int, terminal: int) -> None:
        while chunk := os.read(read_end, 1 << 16):
            with self._lock:
                if not self._file.closed:  # after close(), a straggling child's output reaches the terminal only
                    self._file.write(chunk)
            try:
                os.write(terminal, chunk)
            except OSError:
                pass  # the terminal went away (e.g. ssh closed): the file still gets everything
        os.close(read_end)

    def close(self) -> None:
        """Restores fds 1 and 2 and waits (5 s at most) for what is in flight to reach the file."""
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self._saved):
            os.dup2(saved, fd)  # closes this process's write end; EOF once no child holds it
        for thread in self._threads:
            thread.join(5.0)
        with self._lock:
            self._file.close()
        if all(not t.is_alive() for t in self._threads):
            for saved in self._saved:
                os.close(saved)  # else a child still writes: its thread keeps the terminal until the process ends
