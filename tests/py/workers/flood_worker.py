"""A stranger: opens COUNT TCP connections to 127.0.0.1:PORT (retrying until the port accepts),
says nothing on them, and holds them for SECONDS; touches FLAG (optional) once all are open.
Reports how many it opened as JSON."""

import json
import socket
import sys
import time
from pathlib import Path

port, count, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
held = []
start = time.monotonic()
while len(held) < count and time.monotonic() - start < seconds:
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        held.append(s)
    except OSError:
        s.close()
        time.sleep(0.005)
opened_after = time.monotonic() - start
if len(sys.argv) > 4:
    Path(sys.argv[4]).write_text(str(len(held)))
time.sleep(max(0.0, seconds - (time.monotonic() - start)))
sys.stdout.write(json.dumps({"opened": len(held), "opened_after": opened_after}) + "\n")
