"""One rank of a checkpoint scenario (dtcore.save_checkpoint / load_checkpoint).

checkpoint_worker.py save DIR ZERO [bf16]   train 5 steps, save DIR/step_5, write the whole state
                                            (gathered) to DIR/reference.safetensors for comparison
checkpoint_worker.py load DIR ZERO [bf16]   load DIR into a differently initialised model, gather
                                            the whole state, compare with the reference bitwise
checkpoint_worker.py torn DIR TRIAL         save step 1, then step 2 while one rank (chosen by
                                            TRIAL) SIGKILLs itself at a random point of the save
checkpoint_worker.py async DIR              an asynchronous save holds the state of its call,
                                            whatever training does meanwhile; exit completes it

ZERO is 0 (dtcore.wrap + torch AdamW) or 1/2 (ShardedOptimizer). Prints one JSON line.
"""

import json
import os
import random
import signal
import sys
import threading
import time

import torch
from safetensors.torch import load_file, save_file
from zero_worker import TinyLM, batches, loss_of

import dtcore


def tiny_model() -> TinyLM:
    model = TinyLM()
    model.register_buffer("seen", torch.zeros(1000))  # a buffer that ranks may hold differently
    return model


def build(zero: int, bf16: bool, seed: int):
    torch.manual_seed(seed)
    model = tiny_model()
    if bf16:
        model = model.to(torch.bfloat16)
    model = dtcore.wrap(model, zero=zero, bucket_mb=0.01, first_bucket_mb=0.005)  # several buckets
    groups = [
        {"params": [p for n, p in model.module.named_parameters() if p.dim() > 1], "weight_decay": 0.1},
        {"params": [p for n, p in model.module.named_parameters() if p.dim() <= 1], "weight_decay": 0.0},
    ]
    if zero:
        opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, groups, lr=3e-3, betas=(0.9, 0.95))
    else:
        opt = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95))
    return model, opt


def train(model, opt, steps: int, rank: int) -> None:
    for micro in batches(steps, 1, 4 + rank):  # every rank its own data
        opt.zero_grad()
        loss_of(model, micro[0]).backward()
        opt.step()


def whole_state(model, opt) -> dict[str, torch.Tensor]:
    """The model's and the optimizer's state, flat, as a torch optimizer over the whole model holds it."""
    out = {f"model/{k}": v.detach().clone() for k, v in model.module.state_dict().items()}
    for i, entry in opt.state_dict()["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                out[f"optim/{i}/{key}"] = value.detach().clone().reshape(value.shape)
    return out


def differences(reference: dict, mine: dict, skip_master: bool) -> list[str]:
    bad = []
    for key, value in reference.items():
        if skip_master and key.endswith("/dtcore_master"):
            continue
        if key not in mine:
            bad.append(f"{key} missing")
        elif mine[key].dtype != value.dtype or not torch.equal(mine[key], value):
            bad.append(f"{key} differs")
    bad += [f"{k} unexpected" for k in mine if k not in reference]
    return bad


def main() -> None:
    mode, directory = sys.argv[1], sys.argv[2]
    ctx = dtcore.init(timeout=30)
    rank = ctx.rank
    if mode == "save":
        zero, bf16 = int(sys.argv[3]), "bf16" in sys.argv[4:]
        model, opt = build(zero, bf16, seed=1)
        train(model, opt, 5, rank)
        model.module.seen.fill_(rank)  # as BatchNorm's statistics between broadcasts: the saved one is rank 0's
        sched = {"last_epoch": 5, "base_lrs": [3e-3, 3e-3]}
        dtcore.save_checkpoint(
            os.path.join(directory, "step_5"),
            model=model,
            optimizer=opt,
            step=5,
            extra={"scheduler": sched, "data": {"epoch": 0, "position": 20}},
            rank_extra={"rng": torch.get_rng_state(), "rank": rank},
        )
        state = whole_state(model, opt)
        groups = opt.state_dict()["param_groups"]  # a collective under ZeRO: on every rank
        if rank == 0:
            save_file(state, os.path.join(directory, "reference.safetensors"))
            with open(os.path.join(directory, "reference.json"), "w") as f:
                json.dump({"world": ctx.world_size, "groups": groups}, f)
        dtcore.barrier()
        print(json.dumps({"rank": rank, "keys": len(state)}))
    elif mode == "load":
        zero, bf16 = int(sys.argv[3]), "bf16" in sys.argv[4:]
        model, opt = build(zero, bf16, seed=2)  # other values: all of them must come from the checkpoint
        result = dtcore.load_checkpoint(directory, model=model, optimizer=opt)
        reference = load_file(os.path.join(directory, "reference.safetensors"))
        with open(os.path.join(directory, "reference.json")) as f:
            saved = json.load(f)
        bad = differences(reference, whole_state(model, opt), skip_master=zero == 0)
        groups = opt.state_dict()["param_groups"]
        if [g["betas"] for g in groups] != [tuple(g["betas"]) for g in saved["groups"]]:
            bad.append(f"betas {[g['betas'] for g in groups]}")
        if [g["weight_decay"] for g in groups] != [0.1, 0.0]:
            bad.append("weight_decay")
        extra, rank_extra = result["extra"], result["rank_extra"]
        if extra != {"scheduler": {"last_epoch": 5, "base_lrs": [3e-3, 3e-3]}, "data": {"epoch": 0, "position": 20}}:
            bad.append(f"extra {extra}")
        if saved["world"] == ctx.world_size:
            if rank_extra is None or rank_extra["rank"] != rank or rank_extra["rng"].dtype != torch.uint8:
                bad.append(f"rank_extra {rank_extra}")
        elif rank_extra is not None:
            bad.append("rank_extra given back at another world size")
        train(model, opt, 2, rank)  # and it trains on
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            bad.append("not finite after training on")
        print(json.dumps({"rank": rank, "bad": bad, "step": result["step"]}))
    elif mode == "torn":
        trial = int(sys.argv[3])
        model, opt = build(2, False, seed=1)
        train(model, opt, 2, rank)
        took = 0.0  # the first save's time: the second is killed within 1.6 x that
        for step in (1, 2):
            train(model, opt, 1, rank)
            state = whole_state(model, opt)  # gathered: a collective, before the save
            if rank == 0:
                save_file(state, os.path.join(directory, f"reference_{step}.safetensors"))
            dtcore.barrier()
            started = time.monotonic()
            delay = None
            if step == 2 and rank == trial % ctx.world_size:
                delay = random.Random(trial).uniform(0, 1.6 * took)
                threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
            try:
                dtcore.save_checkpoint(
                    os.path.join(directory, f"step_{step}"), model=model, optimizer=opt, step=step, timeout=2
                )
            except dtcore.DtcoreError as e:
                print(json.dumps({"rank": rank, "error": str(e)}), flush=True)
                os._exit(3)  # a peer died mid-save: this survivor stops too
            took = time.monotonic() - started
        print(json.dumps({"rank": rank, "took": took}), flush=True)
        if delay is not None:  # the victim outlived the save: its timer fires still (1.6 x the first save's time)
            time.sleep(max(0.0, started + delay - time.monotonic()) + 1)
        os._exit(0)
    elif mode == "async":
        model, opt = build(2, False, seed=1)
        train(model, opt, 3, rank)
        state = whole_state(model, opt)
        if rank == 0:
            save_file(state, os.path.join(directory, "reference.safetensors"))
        dtcore.save_checkpoint(os.path.join(directory, "step_3"), model=model, optimizer=opt, step=3, async_save=True)
        train(model, opt, 2, rank)  # changes every parameter and moment while the save writes
        print(json.dumps({"rank": rank}), flush=True)
        # no wait(), no shutdown(): the process's exit must complete the save


if __name__ == "__main__":
    main()
