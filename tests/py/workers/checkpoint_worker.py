"""One rank of a checkpoint scenario (dtcore.save_checkpoint / load_checkpoint).

checkpoint_worker.py save DIR ZERO [OPTION ...]    train 5 steps, save DIR/step_5, write the whole
                                            state (gathered) to DIR/reference.safetensors for comparison
checkpoint_worker.py load DIR ZEROS [OPTION ...]   for each stage of ZEROS (e.g. 3,0): load DIR into a
                                            differently initialised model, gather the whole state,
                                            compare with the reference bitwise, train on
checkpoint_worker.py torn DIR TRIAL [ZERO]  save step 1, then step 2 while one rank (chosen by
                                            TRIAL) SIGKILLs itself at a random point of the save
checkpoint_worker.py async DIR [ZERO]       an asynchronous save holds the state of its call,
                                            whatever training does meanwhile; exit completes it

ZERO is 0 (dtcore.wrap + torch AdamW) or 1/2/3 (ShardedOptimizer). Options: bf16 (parameters in
bfloat16); quirks (zero3_worker's Quirks: a tied embedding and head, frozen parameters, BatchNorm
buffers, plus a non-persistent buffer); errors (load: also what a zero=3 model refuses, and
DIR/export.safetensors loaded into a zero=3 model). Prints one JSON line.
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
from zero3_worker import Quirks
from zero3_worker import loss_of as quirks_loss
from zero_worker import TinyLM, batches, loss_of

import dtcore
from dtcore.zero import state as zero_state

QUIRKS_VOCAB = 40


def tiny_model() -> TinyLM:
    model = TinyLM()
    model.register_buffer("seen", torch.zeros(1000))  # a buffer that ranks may hold differently
    return model


def quirks_model() -> Quirks:
    model = Quirks()
    model.register_buffer("scratch", torch.ones(3), persistent=False)  # never saved, as state_dict leaves it out
    return model


def build(zero: int, bf16: bool, seed: int, kind: str = "tiny"):
    torch.manual_seed(seed)
    model = quirks_model() if kind == "quirks" else tiny_model()
    if bf16:
        model = model.to(torch.bfloat16)
    # the groups by name, from the bare model: under zero=3 a parameter's own data is empty once wrapped
    decay = {n for n, p in model.named_parameters() if p.dim() > 1}
    if zero == 3:
        model = dtcore.wrap(model, zero=3)
    else:
        model = dtcore.wrap(model, zero=zero, bucket_mb=0.01, first_bucket_mb=0.005)  # several buckets
    groups = [
        {"params": [p for n, p in model.module.named_parameters() if n in decay], "weight_decay": 0.1},
        {"params": [p for n, p in model.module.named_parameters() if n not in decay], "weight_decay": 0.0},
    ]
    if zero:
        opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, groups, lr=3e-3, betas=(0.9, 0.95))
    else:
        opt = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95))
    return model, opt


def train(model, opt, steps: int, rank: int) -> None:
    if isinstance(model.module, Quirks):
        data = torch.Generator().manual_seed(4 + rank)  # every rank its own data
        for _ in range(steps):
            opt.zero_grad()
            quirks_loss(model, torch.randint(0, QUIRKS_VOCAB, (4, 9), generator=data), QUIRKS_VOCAB).backward()
            opt.step()
        return
    for micro in batches(steps, 1, 4 + rank):  # every rank its own data
        opt.zero_grad()
        loss_of(model, micro[0]).backward()
        opt.step()


def whole_state(model, opt) -> dict[str, torch.Tensor]:
    """The model's and the optimizer's state, flat, as a torch optimizer over the whole model holds it
    (a collective: the model's state_dict gathers under zero=3, the optimizer's under zero=1/2)."""
    out = {f"model/{k}": v.detach().clone() for k, v in model.module.state_dict().items()}
    state = sharded_optimizer_state(model, opt) if model.zero == 3 else opt.state_dict()["state"]
    for i, entry in state.items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                out[f"optim/{i}/{key}"] = value.detach().clone().reshape(value.shape)
    return out


def sharded_optimizer_state(model, opt) -> dict[int, dict[str, torch.Tensor]]:
    """A zero=3 ShardedOptimizer's state in torch's numbering, whole: every rank's pieces (local_state)
    gathered here, shaped by the units' groups. An element no rank holds stays NaN: seen as a difference."""
    shape_of = {id(p): s for u in model.units for g in u.groups for p, s in zip(g.params, g.shapes)}
    shapes = [shape_of[id(p)] for p in opt.numbered_params]
    per_element, scalars, _ = zero_state.local_state(opt)
    mine = [(i, key, lo, v.detach().cpu().clone()) for i, key, lo, v in per_element]
    every = [mine]
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        every = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(every, mine)
    state: dict[int, dict[str, torch.Tensor]] = {}
    for i, key, lo, values in (piece for pieces in every for piece in pieces):
        entry = state.setdefault(i, {})
        if key not in entry:
            entry[key] = torch.full(shapes[i], float("nan"), dtype=values.dtype)
        entry[key].view(-1)[lo : lo + values.numel()].copy_(values)
    for i, entry in scalars.items():
        state.setdefault(i, {}).update(entry)
    return state


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


def load_and_compare(ctx, directory: str, zero: int, bf16: bool, kind: str) -> list[str]:
    rank = ctx.rank
    model, opt = build(zero, bf16, seed=2, kind=kind)  # other values: all of them must come from the checkpoint
    result = dtcore.load_checkpoint(directory, model=model, optimizer=opt)
    reference = load_file(os.path.join(directory, "reference.safetensors"))
    with open(os.path.join(directory, "reference.json")) as f:
        saved = json.load(f)
    bad = differences(reference, whole_state(model, opt), skip_master=zero == 0)
    if result["step"] != 5:
        bad.append(f"step {result['step']}")
    if [tuple(g["betas"]) for g in opt.param_groups] != [tuple(g["betas"]) for g in saved["groups"]]:
        bad.append(f"betas {[g['betas'] for g in opt.param_groups]}")
    if [g["weight_decay"] for g in opt.param_groups] != [0.1, 0.0]:
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
    if not all(torch.isfinite(v).all() for k, v in whole_state(model, opt).items() if v.is_floating_point()):
        bad.append("not finite after training on")
    return bad


def zero3_refusals(directory: str, kind: str) -> list[str]:
    """A zero=3 model: the exported weights file loads, read by ranges; what does not fit is refused,
    naming the key and the fix; so is the bare module without its wrapper."""
    bad: list[str] = []
    reference = load_file(os.path.join(directory, "reference.safetensors"))
    exported = os.path.join(directory, "export.safetensors")
    model, opt = build(3, False, seed=3, kind=kind)
    dtcore.load_checkpoint(exported, model=model)
    mine = {k: v for k, v in whole_state(model, opt).items() if k.startswith("model/")}
    bad += [f"weights file: {b}" for b in differences({k: v for k, v in reference.items() if k in mine}, mine, False)]

    def refused(what, words, **kwargs):
        try:
            dtcore.load_checkpoint(**kwargs)
        except dtcore.CheckpointError as e:
            if not all(w in str(e) for w in words):
                bad.append(f"{what}: message lacks {words}: {e}")
            return
        bad.append(f"{what}: not refused")

    def altered(extra):  # blocks.2.extra replaced by another Linear
        torch.manual_seed(0)
        module = quirks_model()
        module.blocks[2].extra = extra
        return dtcore.wrap(module, zero=3)

    wide = altered(torch.nn.Linear(16, 32))
    refused(
        "wrong shape", ["'blocks.2.extra.weight'", "[16, 16] there and [32, 16]", "Fix:"], path=directory, model=wide
    )
    refused("wrong shape in a weights file", ["'blocks.2.extra.weight'", "Fix:"], path=exported, model=wide)
    no_bias = altered(torch.nn.Linear(16, 16, bias=False))
    refused("missing key", ["blocks.2.extra.bias", "strict=False"], path=directory, model=no_bias)
    refused("bare module", ["zero=3", "Fix: pass model="], path=directory, model=model.module)
    return bad


def main() -> None:
    mode, directory = sys.argv[1], sys.argv[2]
    ctx = dtcore.init(timeout=30)
    rank = ctx.rank
    options = sys.argv[4:]
    bf16, kind = "bf16" in options, "quirks" if "quirks" in options else "tiny"
    if mode == "save":
        zero = int(sys.argv[3])
        model, opt = build(zero, bf16, seed=1, kind=kind)
        train(model, opt, 5, rank)
        if kind == "tiny":
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
        groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        if rank == 0:
            save_file(state, os.path.join(directory, "reference.safetensors"))
            with open(os.path.join(directory, "reference.json"), "w") as f:
                json.dump({"world": ctx.world_size, "groups": groups}, f)
        dtcore.barrier()
        print(json.dumps({"rank": rank, "keys": len(state)}))
    elif mode == "load":
        bad: list[str] = []
        for zero in map(int, sys.argv[3].split(",")):
            bad += [f"zero={zero}: {b}" for b in load_and_compare(ctx, directory, zero, bf16, kind)]
        if "errors" in options:
            bad += zero3_refusals(directory, kind)
        print(json.dumps({"rank": rank, "bad": bad, "step": 5}))
    elif mode == "torn":
        trial, zero = int(sys.argv[3]), int(options[0]) if options else 2
        model, opt = build(zero, False, seed=1)
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
        model, opt = build(int(options[0]) if options else 2, False, seed=1)
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
