"""A rank started by python -m dtcore.launch: `launch_worker.py MODE [RANK]`.

allreduce: dtcore.init(), an all-reduce, then one JSON line with the world as dtcore read it.
usr1: every rank waits for SIGUSR1, then says so and exits 0 (as a trainer that saves and stops).
raise | kill | exit | oom: rank RANK fails that way (an uncaught exception, SIGKILL, sys.exit(3) after a
line on stderr, torch's OutOfMemoryError); the other ranks wait, to be stopped by the launcher.
"""

import json
import os
import signal
import sys
import time


def fail_deep(rank: int) -> None:
    raise ValueError(f"boom on rank {rank}")


def main() -> None:
    mode = sys.argv[1]
    rank = int(os.environ["RANK"])
    print(f"worker rank {rank} of {os.environ['WORLD_SIZE']} says hello", flush=True)
    if mode == "allreduce":
        import torch

        import dtcore

        ctx = dtcore.init(timeout=60)
        t = torch.tensor([float(ctx.rank + 1)])
        dtcore.all_reduce(t)
        fields = ("rank", "world_size", "local_rank", "node_rank", "num_nodes", "master_addr", "master_port")
        print(json.dumps(dict({f: getattr(ctx, f) for f in fields}, launcher=ctx.launcher, sum=t.item())), flush=True)
        dtcore.shutdown()
        return
    if mode == "usr1":

        def stop(signum, frame):
            print(f"rank {rank} got {signal.Signals(signum).name}: saving, then exiting", flush=True)
            sys.exit(0)

        signal.signal(signal.SIGUSR1, stop)
        print(f"rank {rank} waits for SIGUSR1", flush=True)
        time.sleep(60)
        sys.exit(1)
    if rank == int(sys.argv[2]):
        if mode == "raise":
            fail_deep(rank)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "exit":
            print("giving up: no data shard for this rank", file=sys.stderr, flush=True)
            sys.exit(3)
        if mode == "oom":
            import torch

            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")
    time.sleep(60)  # the launcher stops this rank when another fails


if __name__ == "__main__":
    main()
