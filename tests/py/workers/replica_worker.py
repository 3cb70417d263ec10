"""One rank of a job of two nodes whose in-memory checkpoints have replicas (Note [Replicas]).

replica_worker.py DIR ZERO CASE

Each rank trains TinyLM (dtcore.wrap, zero=ZERO: 0 with torch's AdamW, 2 with ShardedOptimizer) for 4 steps,
copying its state after each into DIR/node<k> (its node's directory) and, through the ring, into the next
node's. Then, as after a restart, fresh MemoryCheckpoints find the newest step and every rank loads it into a
model trained otherwise. CASE:
  intact   nothing lost: every node already holds every rank's file of step 4 (2 nodes), nothing is sent
  lost     node 1's directory is removed first (its launcher died): node 1 gets every file from node 0
  peerdies rank 2 SIGKILLs itself as step 3 begins: the others' exchange of step 3 fails, named, and they exit
  torn     rank 0's copy of step 3 loses its marker as it is sent (as if its slot changed under the transfer):
           rank 2 does not keep it and says so, and rank 0's confirm() raises; the others confirm step 3
Prints one JSON line: {"rank", "step", "bad": [...], "files": the node's files of the slot loaded, ...}.
"""

import hashlib
import json
import os
import shutil
import signal
import sys

import torch
from zero_worker import TinyLM, batches, loss_of

import dtcore
from dtcore.checkpoint import load_checkpoint
from dtcore.checkpoint import memory as mem


def build(zero: int, seed: int):
    torch.manual_seed(seed)
    model = dtcore.wrap(TinyLM(), zero=zero, bucket_mb=0.004, first_bucket_mb=0.001)
    if zero:
        opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, model.parameters(), lr=3e-3)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return model, opt


def state(model, opt) -> dict[str, torch.Tensor]:
    out = {f"model/{k}": v.clone() for k, v in model.state_dict().items()}
    for i, s in opt.state_dict()["state"].items():
        out |= {f"optim/{i}/{k}": v.clone() for k, v in s.items() if torch.is_tensor(v)}
    return out


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main() -> None:
    root, zero, case = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ctx = dtcore.init()
    rank, world = ctx.rank, ctx.world_size
    nodes = [r // ctx.local_world_size for r in range(world)]  # (as the launchers number them)
    directory = os.path.join(root, f"node{ctx.node_rank}")
    for slot in (0, 1):
        os.makedirs(os.path.join(directory, f"slot{slot}"), exist_ok=True)

    model, opt = build(zero, seed=0)
    copies = mem.MemoryCheckpoints(directory, rank, world, every=1, nodes=nodes, timeout=60)
    data = batches(5, 1, 4 * world)
    for step in range(1, 5):
        if case in ("peerdies", "torn") and step == 3:
            if case == "peerdies" and rank == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            if case == "torn" and rank == 0:

                def torn(slot, step, own, send=copies.replicas.send):
                    own.clear()
                    send(slot, step, own)

                copies.replicas.send = torn
            copies.save(step, model=model, optimizer=opt, rank_extra={"rank": rank, "step": step})
            copies.confirm()  # rank 0 exchanges with rank 2: CommError
            kept = sorted(copies.replicas.recorded())  # the steps of the replica this rank keeps
            print(json.dumps({"rank": rank, "confirmed": step, "kept": kept}), flush=True)
            return
        loss_of(model, data[step - 1][0][rank * 4 : (rank + 1) * 4]).backward()
        opt.step()
        opt.zero_grad()
        copies.save(step, model=model, optimizer=opt, rank_extra={"rank": rank, "step": step})
    expected = state(model, opt)
    copies.confirm()
    dtcore.barrier()
    replica = mem.slots.slot_file(directory, 0, copies.replicas.keeps)
    own = mem.slots.slot_file(os.path.join(root, f"node{nodes[copies.replicas.keeps]}"), 0, copies.replicas.keeps)
    replica_is_a_copy = digest(replica) == digest(own)
    dtcore.barrier()
    if case == "lost" and ctx.local_rank == 0 and ctx.node_rank == 1:
        shutil.rmtree(directory)
    dtcore.barrier()
    for slot in (0, 1):
        os.makedirs(os.path.join(directory, f"slot{slot}"), exist_ok=True)

    before = {e.path: e.stat().st_mtime_ns for s in (0, 1) for e in os.scandir(os.path.join(directory, f"slot{s}"))}
    restarted = mem.MemoryCheckpoints(directory, rank, world, every=1, nodes=nodes, timeout=60)
    found = restarted.newest()
    after = {e.path: e.stat().st_mtime_ns for s in (0, 1) for e in os.scandir(os.path.join(directory, f"slot{s}"))}
    written = sorted(os.path.basename(p) for p in after if before.get(p) != after[p] and "manifest" not in p)
    bad = []
    if found is None:
        bad.append("no step found")
    else:
        step, checkpoint = found
        fresh, fresh_opt = build(zero, seed=1)
        loaded = load_checkpoint(checkpoint, model=fresh, optimizer=fresh_opt)
        got = state(fresh, fresh_opt)
        bad += [k for k in expected if not torch.equal(expected[k], got[k])]
        if loaded["rank_extra"] != {"rank": rank, "step": 4}:
            bad.append(f"rank_extra {loaded['rank_extra']}")
    print(
        json.dumps(
            {
                "rank": rank,
                "step": found and found[0],
                "bad": bad,
                "files": sorted(os.listdir(found[1])) if found else [],
                "recorded": sorted(restarted.recorded()),
                "replica_is_a_copy": replica_is_a_copy,
                "written": written,  # the files of this node that the restart wrote (sent here)
            }
        ),
        flush=True,
    )
    dtcore.shutdown()


if __name__ == "__main__":
    main()
