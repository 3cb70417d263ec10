"""One rank of a job whose ranks call different collectives (tests/py/comm/test_mismatch.py).

argv[1] is the case: rank 1 differs from rank 0 in "size", "dtype", "op" or "collective" at the
job's first collective after init(). Prints one JSON line: the error (class and message) or the
result, and whether a later collective still works (it must fail too: the job is broken).
"""

import json
import sys
import time

import torch

import dtcore

ctx = dtcore.init(timeout=10)
case = sys.argv[1]
t = torch.ones(1000)
if ctx.rank == 1 and case == "size":
    t = torch.ones(500)
if ctx.rank == 1 and case == "dtype":
    t = torch.ones(1000, dtype=torch.int32)  # same size in bytes: Gloo would reduce it as floats
out = {"rank": ctx.rank}
started = time.monotonic()
try:
    if ctx.rank == 1 and case == "op":
        dtcore.all_reduce(t, op="max")
    elif ctx.rank == 1 and case == "collective":
        dtcore.broadcast(t, src=0)
    else:
        dtcore.all_reduce(t)
    out["result"] = t[:2].tolist()
except dtcore.CommError as e:
    out["error"] = str(e)
out["seconds"] = time.monotonic() - started
try:
    dtcore.barrier()
    out["later"] = "ok"
except dtcore.CommError as e:
    out["later"] = str(e)
print(json.dumps(out), flush=True)
dtcore.shutdown(barrier=False)
