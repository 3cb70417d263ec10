"""One rank of a job in which rank 2 dies or stalls after the first barrier.

    failure_worker.py die|stall TIMEOUT

Ranks other than 2 then all-reduce and report the CommError they get as JSON.
"""

import json
import os
import sys
import time

import torch

import dtcore

mode, timeout = sys.argv[1], float(sys.argv[2])
ctx = dtcore.init(timeout=30)
dtcore.barrier()
if ctx.rank == 2:
    if mode == "stall":
        time.sleep(timeout + 8)  # alive (its heartbeat thread beats) but never joins the allreduce
    os._exit(0)  # die without a word, as a killed process does

start = time.monotonic()
try:
    dtcore.all_reduce(torch.ones(8), timeout=timeout)
    result = {"ok": True}
except dtcore.CommError as e:
    result = {"ok": False, "message": str(e)}
result["seconds"] = time.monotonic() - start
result["rank"] = ctx.rank
sys.stdout.write(json.dumps(result) + "\n")
sys.stdout.flush()
