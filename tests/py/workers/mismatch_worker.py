"""One rank of a job whose ranks call different collectives (tests/py/comm/test_mismatch.py).

argv[1] is the case: rank 1 differs from rank 0 in "size", "dtype", "op" or "collective" at the
job's first collective after init(). Prints one JSON line: the error (class and message) or the
result, and whether a later collective still works (it must fail too: the job is broken).

With argv[2] == "heartbeat" (and DTCORE_CHECK_COLLECTIVES=0: no check before each call), the
mismatched call runs, and the ranks go on issuing small all-reduces until one raises: "later" is
that error, "after" the seconds from the mismatched call to it.
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
if sys.argv[2:] == ["heartbeat"]:
    out["later"] = "no error within 30 s"
    while time.monotonic() < started + 30:
        try:
            dtcore.all_reduce(torch.ones(4))
        except dtcore.CommError as e:
            out["later"] = str(e)
            break
        time.sleep(0.02)
    out["after"] = time.monotonic() - started
    print(json.dumps(out), flush=True)
    dtcore.shutdown(barrier=False)
    sys.exit(0)
try:
    dtcore.barrier()
    out["later"] = "ok"
except dtcore.CommError as e:
    out["later"] = str(e)
print(json.dumps(out), flush=True)
dtcore.shutdown(barrier=False)
