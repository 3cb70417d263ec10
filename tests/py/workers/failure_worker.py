"""One rank of a job in which rank 2 fails after the first barrier.

    failure_worker.py MODE TIMEOUT [BUCKETS]

MODE: die (exits at once), stall (sleeps, alive), stop (SIGSTOPs itself); with a "-backward"
suffix the survivors meet it inside a wrapped model's backward of BUCKETS buckets (one per
layer), instead of in a plain all_reduce. The other ranks report the error they get as JSON:
its class, message and how long after the collective started.
"""

import json
import os
import signal
import sys
import time

import torch

import dtcore

mode, timeout = sys.argv[1], float(sys.argv[2])
buckets = int(sys.argv[3]) if len(sys.argv) > 3 else 1
in_backward = mode.endswith("-backward")
fault = mode.removesuffix("-backward")

ctx = dtcore.init(timeout=timeout)
model = None
if in_backward:
    layers = [torch.nn.Linear(256, 256) for _ in range(buckets)]  # 256 KiB each: a bucket each
    model = dtcore.wrap(torch.nn.Sequential(*layers), bucket_mb=0.25, first_bucket_mb=0.25)
dtcore.barrier()
if ctx.rank == 2:
    if fault == "stall":
        time.sleep(timeout + 8)  # alive (its heartbeat thread beats) but never joins
    elif fault == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)  # the test kills it when done
    os._exit(0)  # die without a word, as a killed process does

start = time.monotonic()
try:
    if in_backward:
        model(torch.ones(4, 256)).sum().backward()
    else:
        dtcore.all_reduce(torch.ones(8))
    result = {"ok": True}
except Exception as e:  # the class is what is tested
    result = {"ok": False, "type": type(e).__name__, "message": str(e)}
result["seconds"] = time.monotonic() - start
result["rank"] = ctx.rank
sys.stdout.write(json.dumps(result) + "\n")
sys.stdout.flush()
