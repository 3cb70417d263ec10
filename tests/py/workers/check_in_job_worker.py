"""One rank of a training job that runs the resource checker in the middle of it (tests/py/check).

init(), then dtcore.check.run() (collective: every rank), then the job goes on: the checker must
have used the job's context and left it running. argv[2] "0" starts the job without torch.distributed.
Writes rank<r>.json into the directory argv[1] (ranks under one torchrun share a stdout).
"""

import json
import sys
from pathlib import Path

import torch

import dtcore

ctx = dtcore.init(timeout=30, torch_distributed=sys.argv[2] == "1")
report = dtcore.check.run(sizes=[8, 4096], iters=2)  # the job's own timeout; the sweep and the link test
result = {
    "rank": ctx.rank,
    "mode": report.mode,
    "status": report.status,
    "initialized": dtcore.is_initialized(),
    "same_context": dtcore.is_initialized() and dtcore.get_context() is ctx,
}
t = dtcore.all_reduce(torch.ones(2))  # raised "not initialized" before the fix
result["sum"] = t.tolist()
(Path(sys.argv[1]) / f"rank{ctx.rank}.json").write_text(json.dumps(result))
dtcore.shutdown()
