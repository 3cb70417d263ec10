"""One process, many environments: init() under each case in turn, one JSON line per case.

argv[1]: init()'s timeout in seconds; argv[2]: a JSON object {case id: {variable: value}}. Each
case's variables are set on top of this process's environment and taken away again after it, so
that cases that fail before any waiting share one start of Python and torch.
"""

import json
import os
import sys
import time

import dtcore

timeout = float(sys.argv[1])
cases = json.loads(sys.argv[2])
base = dict(os.environ)
for case, env in cases.items():
    os.environ.update(env)
    start = time.monotonic()
    try:
        ctx = dtcore.init(timeout=timeout)
        result = {"ok": True, "rank": ctx.rank, "world_size": ctx.world_size}
        dtcore.shutdown()
    except dtcore.DtcoreError as e:
        result = {"ok": False, "type": type(e).__name__, "message": str(e)}
    result.update(case=case, seconds=time.monotonic() - start)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os.environ.clear()
    os.environ.update(base)
