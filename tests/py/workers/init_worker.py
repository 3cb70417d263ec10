"""One rank: init() expected to fail; reports the error class, message and time taken as JSON."""

import json
import sys
import time

import dtcore

timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
started_wall = time.time()
start = time.monotonic()
try:
    ctx = dtcore.init(timeout=timeout)
    result = {"ok": True, "rank": ctx.rank}
except dtcore.DtcoreError as e:
    result = {"ok": False, "type": type(e).__name__, "message": str(e)}
result["seconds"] = time.monotonic() - start
result["started_wall"] = started_wall
sys.stdout.write(json.dumps(result) + "\n")  # one write: atomic on a pipe shared by ranks
sys.stdout.flush()
sys.exit(0 if result["ok"] else 3)
