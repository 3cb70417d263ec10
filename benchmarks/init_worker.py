"""One rank of bench_init.py: start a world with dtcore or torch.distributed and report timings.

Reads BENCH_INIT_T0 (the parent's time.time() just before it started this process), so that
"from process start" includes interpreter start-up and imports, as a user experiences it.
"""

import json
import os
import sys
import time

t0 = float(os.environ["BENCH_INIT_T0"])
mode = sys.argv[1]

import torch.distributed as dist  # noqa: E402

if mode.startswith("dtcore"):
    import dtcore

    imported = time.time()
    try:
        start = time.perf_counter()
        dtcore.init(timeout=float(sys.argv[2]) if len(sys.argv) > 2 else 60.0, torch_distributed=(mode == "dtcore"))
        result = {"ok": True, "init_s": time.perf_counter() - start}
    except dtcore.RendezvousError as e:
        result = {"ok": False, "error": str(e).splitlines()[0]}
elif mode == "torch":
    imported = time.time()
    start = time.perf_counter()
    dist.init_process_group("gloo", init_method="env://")
    result = {"ok": True, "init_s": time.perf_counter() - start}
else:
    raise SystemExit(f"unknown mode {mode}")

result["from_start_s"] = time.time() - t0
result["import_s"] = imported - t0
# Untimed: stay until every rank is up. torch's init_process_group can return on rank 0 while
# another rank is still connecting Gloo through rank 0's store; leaving then breaks that rank.
if result["ok"]:
    if mode == "torch":
        dist.barrier()
    else:
        dtcore.barrier()
sys.stdout.write(json.dumps(result) + "\n")
sys.stdout.flush()
os._exit(0)  # teardown is not what is measured
