"""One rank: bucket_mb="auto" (Note [Buckets that size themselves] in csrc/dtcore/reducer/bucket_plan.h).

auto_buckets_worker.py CHECKPOINT_DIR    (2 ranks; prints {case: result} as JSON)

The auto plan against torch DDP and against the default caps, with ZeRO, after find_unused_parameters,
kept by a checkpoint and adopted by the resumed job, and the options it refuses.
"""

import os
import sys

import torch
from ddp_semantics_worker import run_cases

import dtcore
from dtcore.train.demo.gpt import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=64, block_size=32, n_layer=4, n_head=4, n_embd=128)


def gpt() -> torch.nn.Module:
    torch.manual_seed(0)
    return GPT(CONFIG)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randint(0, CONFIG.vocab_size, (2, CONFIG.block_size), generator=g)
    return x, torch.roll(x, -1, dims=1)


def train(model, opt, steps, rank, first=0) -> None:
    for step in range(first, first + steps):
        model(*batch(step, rank)).backward()
        opt.step()
        opt.zero_grad()


def param_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))


def against_ddp(rank: int) -> dict:
    ddp = torch.nn.parallel.DistributedDataParallel(gpt())
    mine = dtcore.wrap(gpt(), bucket_mb="auto")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (ddp, mine)]
    for model, opt in zip((ddp, mine), opts, strict=True):
        train(model, opt, 3, rank)
    return {
        "param_diff": param_diff(ddp.module, mine.module),
        "info": mine._reducer.auto_plan_info(),
        "buckets": mine.bucket_params,
        "params": sum(1 for p in mine.module.parameters() if p.requires_grad),
        "bucket_cap": mine.bucket_bytes_cap,
    }


def sharded(rank: int) -> dict:
    reference = dtcore.wrap(gpt(), bucket_mb="auto")
    train(reference, torch.optim.AdamW(reference.parameters(), lr=1e-3), 3, rank)
    out = {}
    for zero in (1, 2):
        model = dtcore.wrap(gpt(), bucket_mb="auto", zero=zero)
        train(model, dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-3), 3, rank)
        out[zero] = {
            "param_diff": param_diff(reference.module, model.module),
            "chosen": model._reducer.auto_plan_info()["chosen"],
        }
    return out


def find_unused(rank: int) -> dict:
    model = dtcore.wrap(gpt(), bucket_mb="auto", find_unused_parameters=True)
    train(model, torch.optim.AdamW(model.parameters(), lr=1e-3), 2, rank)
    static = dtcore.wrap(gpt(), bucket_mb="auto")
    static._set_static_graph()
    train(static, torch.optim.AdamW(static.parameters(), lr=1e-3), 2, rank)
    return {"dynamic": model._reducer.auto_plan_info()["chosen"], "static": static._reducer.auto_plan_info()["chosen"]}


def checkpoint(rank: int) -> dict:
    """A job saves after 2 steps; a new one loads, adopts the saved plan (no measurement) and goes on as the
    first does."""
    directory = os.path.join(sys.argv[1], "auto")
    first = dtcore.wrap(gpt(), bucket_mb="auto", zero=1)
    first_opt = dtcore.ShardedOptimizer(first, torch.optim.AdamW, lr=1e-3)
    train(first, first_opt, 2, rank)
    dtcore.save_checkpoint(directory, model=first, optimizer=first_opt, step=2, async_save=False)
    resumed = dtcore.wrap(gpt(), bucket_mb="auto", zero=1)
    resumed_opt = dtcore.ShardedOptimizer(resumed, torch.optim.AdamW, lr=1e-3)
    dtcore.load_checkpoint(directory, model=resumed, optimizer=resumed_opt)
    adopted = resumed.bucket_params
    train(first, first_opt, 2, rank, first=2)
    train(resumed, resumed_opt, 2, rank, first=2)
    again = os.path.join(sys.argv[1], "again")
    dtcore.save_checkpoint(again, model=resumed, optimizer=resumed_opt, step=4, async_save=False)
    fresh = dtcore.wrap(gpt(), bucket_mb="auto")
    fresh_adopted = fresh.adopt_bucket_plan(resumed.bucket_plan_state())
    elsewhere = dtcore.wrap(gpt(), bucket_mb="auto")
    state = dict(first.bucket_plan_state(), world_size=3)
    return {
        "saved": first.bucket_params,
        "adopted": adopted,
        "measured_again": resumed._reducer.auto_plan_info()["chosen"],
        "param_diff": param_diff(first.module, resumed.module),
        "kept_on_resave": resumed.bucket_plan_state() is not None,
        "fresh_adopted": fresh_adopted,
        "other_world_adopted": elsewhere.adopt_bucket_plan(state),
    }


def refusals(rank: int) -> dict:
    out = {}
    for name, options in {
        "first_bucket": {"bucket_mb": "auto", "first_bucket_mb": 2},
        "word": {"bucket_mb": "fast"},
    }.items():
        try:
            dtcore.wrap(gpt(), **options)
            out[name] = "accepted"
        except dtcore.ConfigError as e:
            out[name] = str(e)
    try:
        dtcore.wrap(gpt(), bucket_mb="auto" if rank == 0 else 25)
        out["ranks_differ"] = "accepted"
    except dtcore.ConfigError as e:
        out["ranks_differ"] = str(e)
    return out


def deterministic(rank: int) -> dict:
    """The default is "auto"; deterministic algorithms keep the default caps, and every rank must ask alike."""
    default = dtcore.wrap(gpt())
    train(default, torch.optim.SGD(default.parameters(), lr=1e-3), 1, rank)
    out = {"default_chosen": default._reducer.auto_plan_info()["chosen"]}
    torch.use_deterministic_algorithms(True)
    try:
        fixed, sized = dtcore.wrap(gpt()), dtcore.wrap(gpt(), bucket_mb=25)
        for model in (fixed, sized):
            train(model, torch.optim.SGD(model.parameters(), lr=1e-3), 2, rank)
        out["fixed_chosen"] = fixed._reducer.auto_plan_info()["chosen"]
        out["same_buckets_as_25"] = fixed.bucket_params == sized.bucket_params
        out["param_diff"] = param_diff(fixed.module, sized.module)
        torch.use_deterministic_algorithms(rank == 1)
        try:
            dtcore.wrap(gpt())
            out["ranks_differ"] = "accepted"
        except dtcore.ConfigError as e:
            out["ranks_differ"] = str(e)
    finally:
        torch.use_deterministic_algorithms(False)
    return out


CASES = [against_ddp, sharded, find_unused, checkpoint, refusals, deterministic]


if __name__ == "__main__":
    run_cases(CASES)
