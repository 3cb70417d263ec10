"""One rank on a GPU: dtcore with NCCL, end to end (init, collectives, the reducer, ZeRO, activation offload).

nccl_worker.py    (1 or 2 ranks; prints {case: result} as JSON, a result being what the test checks)

Each rank feeds its own data; the references are a plain model's gradients averaged with
torch.distributed's NCCL group (which dtcore.init() set up on the same store), so they share no
code with dtcore's reducer.
"""

import copy

import torch
import torch.distributed as dist
from ddp_semantics_worker import run_cases

import dtcore
from dtcore.train.demo.gpt import GPT, GPTConfig


def _device() -> torch.device:
    return dtcore.get_context().device  # the rank's GPU, set by init()


def setup(rank: int) -> dict:
    ctx = dtcore.get_context()
    return {
        "backend": ctx.backend,
        "device": str(ctx.device),
        "nccl": dtcore._C.nccl_version(),
        "torch_backend": dist.get_backend(),
        "world": ctx.world_size,
    }


def collectives(rank: int) -> dict:
    n = dtcore.get_context().world_size
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        t = torch.full((1000,), float(rank + 1), device=_device(), dtype=dtype)
        dtcore.all_reduce(t, op="avg")
        out[f"avg {dtype}"] = t.float().unique().tolist() == [(n + 1) / 2]
    t = torch.arange(5, device=_device(), dtype=torch.int64) * (rank + 1)
    dtcore.all_reduce(t, op="max")
    out["max int64"] = t.tolist() == [i * n for i in range(5)]
    t = torch.full((3,), float(rank), device=_device())
    dtcore.broadcast(t, src=n - 1)
    out["broadcast"] = t.tolist() == [float(n - 1)] * 3
    g = dtcore.all_gather(torch.tensor([rank, 10 * rank], device=_device()))
    out["all_gather"] = g.tolist() == [[q, 10 * q] for q in range(n)]
    rs = dtcore.reduce_scatter(torch.arange(2.0 * n, device=_device()).reshape(n, 2) * (rank + 1))
    out["reduce_scatter"] = rs.tolist() == [[2.0 * rank * n * (n + 1) / 2, (2.0 * rank + 1) * n * (n + 1) / 2]]
    work = dtcore.all_reduce(torch.ones(1 << 20, device=_device()), async_op=True)
    work.wait(30.0)
    out["async"] = work.is_completed()
    return out


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=96, n_layer=2, n_head=2, n_embd=64, block_size=32)).to(_device())


def _batch(rank: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(1000 * rank + step)
    x = torch.randint(0, 96, (4, 32), generator=g)
    return x.to(_device()), torch.roll(x, -1, 1).to(_device())


def _averaged_grads(model: torch.nn.Module) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in model.parameters()]
    for g in grads:
        dist.all_reduce(g)
        g /= dist.get_world_size()
    return grads


def reducer(rank: int) -> dict:
    """dtcore.wrap's averaged gradients against a plain model's, averaged by torch.distributed."""
    plain = _gpt()
    model = dtcore.wrap(copy.deepcopy(plain), bucket_mb=0.05)  # several buckets, overlapped with backward
    return {
        "max_error": _max_error(plain, model, model, rank),
        "grads_on_gpu": all(p.grad.is_cuda for p in model.parameters()),
    }


def _max_error(plain: torch.nn.Module, model: torch.nn.Module, run: torch.nn.Module, rank: int) -> float:
    """Over 3 steps, the largest difference between `model`'s gradients (trained through `run`, itself or
    its compiled form) and the plain model's averaged by torch.distributed."""
    errors = []
    for step in range(3):
        x, y = _batch(rank, step)
        plain.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        plain(x, y).backward()
        run(x, y).backward()
        want = _averaged_grads(plain)
        errors.append(max((p.grad - w).abs().max().item() for p, w in zip(model.parameters(), want)))
    return max(errors)


def auto_buckets(rank: int) -> dict:
    """bucket_mb="auto" on a GPU: the timeline from CUDA events (Note [Buckets that size themselves]), and the
    same model compiled (Note [dtcore under torch.compile]), against the plain model's averaged gradients."""
    out = {}
    for compiled in (False, True):
        plain = _gpt()
        model = dtcore.wrap(copy.deepcopy(plain), bucket_mb="auto")
        run = torch.compile(model, backend="aot_eager") if compiled else model  # the split, without codegen time
        error = _max_error(plain, model, run, rank)
        out["compiled" if compiled else "eager"] = {"max_error": error, **model._reducer.auto_plan_info()}
    return out


def zero(rank: int) -> dict:
    """ZeRO-1, -2 and -3 with AdamW against torch AdamW on the plain model's averaged gradients, 5 steps;
    and the bytes each stage holds after its steps (the reference's included, the same for each)."""
    out = {"param_bytes": sum(p.numel() * p.element_size() for p in _gpt().parameters())}
    for stage in (1, 2, 3):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        plain = _gpt()
        sizes = {} if stage == 3 else {"bucket_mb": 0.05}  # zero=3 reduces by unit (each GPT block)
        model = dtcore.wrap(copy.deepcopy(plain), zero=stage, **sizes)
        opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
        ref = torch.optim.AdamW(plain.parameters(), lr=1e-3, weight_decay=0.1)
        for step in range(5):
            x, y = _batch(rank, step)
            opt.zero_grad()
            ref.zero_grad()
            model(x, y).backward()
            opt.step()
            plain(x, y).backward()
            for p, g in zip(plain.parameters(), _averaged_grads(plain)):
                p.grad = g
            ref.step()
        ours = model.module.state_dict()  # zero=3: gathered whole
        out[f"zero={stage} max_error"] = max((ours[k] - v).abs().max().item() for k, v in plain.state_dict().items())
        torch.cuda.synchronize()
        out[f"zero={stage} held_bytes"] = torch.cuda.memory_allocated() - before
        del model, opt, plain, ref
    return out


def offload(rank: int) -> dict:
    """Activation checkpointing with the kept inputs offloaded to pinned host memory: the same
    gradients as without, and the inputs went to the host and came back."""
    plain = _gpt()
    model = copy.deepcopy(plain)
    summary = dtcore.checkpoint_activations(model, "all", offload=True)
    x, y = _batch(rank)
    plain(x, y).backward()
    model(x, y).backward()
    torch.cuda.synchronize()
    error = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), plain.parameters()))
    offloader = dtcore.activation.api.offloader_for(_device())
    return {
        "summary": summary.offload,
        "max_error": error,
        "packed": offloader.packed,
        "prefetched": offloader.prefetched,
    }


CASES = [setup, collectives, reducer, auto_buckets, zero, offload]

if __name__ == "__main__":
    run_cases(CASES)
