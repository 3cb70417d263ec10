"""One rank exercising dtcore.comm.agree (tests/py/comm/test_agree.py): gather, check_same, maximum.

argv[1]: "agree" (every rank has the same lines) or "differ" (rank 1's second line differs).
Prints one JSON line.
"""

import json
import sys

import dtcore
from dtcore.comm import agree

ctx = dtcore.init(timeout=30)
out = {"rank": ctx.rank}
out["gathered"] = agree.gather({"rank": ctx.rank, "text": "x" * (10 * ctx.rank)})  # uneven sizes
out["maximum"] = agree.maximum([ctx.rank, -ctx.rank, 0.5])
lines = ["layer.0 (4, 4)", "layer.1 (4, 4)", "head (4, 2)"]
if sys.argv[1] == "differ" and ctx.rank == 1:
    lines[1] = "layer.1 (4, 8)"
try:
    agree.check_same(lines, what="the test model", item="parameter", fix="build the same model.")
    out["error"] = None
except dtcore.ConfigError as e:
    out["error"] = str(e)
print(json.dumps(out), flush=True)
dtcore.shutdown()
