"""One rank of a 2-rank Gloo job in which rank 0 is SIGKILLed mid-training; the survivor reports JSON.

    peer_kill_worker.py dtcore|torch-first

dtcore: dtcore.init() serves its own store on rank 0. torch-first: the script calls
init_process_group("gloo") first, so the store is c10d's TCPStore, served by rank 0, and dtcore
runs on it. Rank 0 kills itself at step 5; rank 1 reports the error it gets (class, message) as
JSON, lingers 3 s while dtcore's threads still run (as a script that saves or logs before it
exits would), then raises it (its traceback on stderr).
"""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import dtcore

if sys.argv[1] == "torch-first":
    dist.init_process_group("gloo", init_method="env://")
ctx = dtcore.init(timeout=30)
torch.manual_seed(0)
model = dtcore.wrap(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
result = {"rank": ctx.rank, "ok": True}
try:
    for step in range(200):
        if ctx.rank == 0 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        model(torch.randn(8, 64)).square().mean().backward()
        opt.step()
        time.sleep(0.05)
except dtcore.DtcoreError as e:
    sys.stdout.write(json.dumps({"rank": ctx.rank, "ok": False, "type": type(e).__name__, "message": str(e)}) + "\n")
    sys.stdout.flush()
    time.sleep(3)
    raise
sys.stdout.write(json.dumps(result) + "\n")
