"""One rank: init, say so in DIR/ready<rank>, wait for DIR/go, then all-reduce to prove the job survived.

Lets a test attack the rendezvous store of a live job between init and the end of the job.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

import dtcore

folder = Path(sys.argv[1])
ctx = dtcore.init(timeout=60)
(folder / f"ready{ctx.rank}").write_text(json.dumps({"pid": os.getpid(), "port": ctx.master_port}))
deadline = time.monotonic() + 120
while not (folder / "go").exists():
    if time.monotonic() > deadline:
        sys.exit(4)
    time.sleep(0.05)
t = torch.ones(3)
dtcore.all_reduce(t)
sys.stdout.write(json.dumps({"rank": ctx.rank, "sum": t.tolist()}) + "\n")
sys.stdout.flush()
dtcore.shutdown()
