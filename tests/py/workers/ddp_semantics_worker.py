"""One rank: dtcore.DistributedDataParallel where torch DDP's behaviour is easy to get silently wrong.

ddp_semantics_worker.py    (2 ranks; prints {case: result} as JSON, a result being what the test checks)
"""

import io
import json
import sys
import traceback
import warnings

import torch
import torch.distributed as dist

import dtcore
from dtcore import DistributedDataParallel as DDP


class TwoLayers(torch.nn.Module):
    """`used` always takes part; `spare` only when forward is told to use it."""

    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Linear(4, 2)
        self.spare = torch.nn.Linear(4, 2)

    def forward(self, x, use_spare=False):
        out = self.used(x)
        return out + self.spare(x) if use_spare else out


def batch(rank: int) -> torch.Tensor:
    return torch.full((3, 4), float(rank + 1))


def unused_everywhere(rank: int) -> dict:
    """A parameter no rank uses keeps .grad None, as torch DDP leaves it (so momentum and weight decay
    leave it alone); one that only rank 1 uses gets the average on both."""
    torch.manual_seed(0)
    model = DDP(TwoLayers(), find_unused_parameters=True)
    before = [p.grad is None for p in model.parameters()]
    model(batch(rank)).sum().backward()
    after_unused = {n: p.grad is None for n, p in model.module.named_parameters()}
    model(batch(rank), use_spare=(rank == 1)).sum().backward()
    spare_grad = model.module.spare.weight.grad
    return {
        "none_before": all(before),
        "none_after": after_unused,
        "spare_grad": None if spare_grad is None else spare_grad.sum().item(),
    }


def functional_call(rank: int) -> dict:
    """torch.func.functional_call with other tensors in place of the parameters: the module's own
    parameters take no part on any rank, so they keep .grad None; the tensors passed get theirs."""
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(1, 1), find_unused_parameters=True)
    weight = torch.tensor([[1.0]], requires_grad=True)
    bias = torch.tensor([0.0], requires_grad=True)
    out = torch.func.functional_call(model, {"module.weight": weight, "module.bias": bias}, torch.ones(1, 1))
    out.sum().backward()
    return {
        "module_grads_none": [p.grad is None for p in model.module.parameters()],
        "passed_grads": [weight.grad.item(), bias.grad.item()],
    }


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        return self.lin(x)


def reassigned_buffer(rank: int) -> dict:
    """A buffer replaced by a new tensor (module.buf = module.buf + 1) is still broadcast from rank 0."""
    model = DDP(Counter())
    values = []
    for _ in range(2):
        model.module.count = model.module.count + (rank + 1)  # a new tensor in the buffer's place
        model(torch.ones(1, 2)).sum().backward()
        values.append(model.module.count.item())
    return {"values": values, "is_buffer": "count" in dict(model.module.named_buffers())}


def nothing_to_train(rank: int) -> dict:
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    try:
        DDP(frozen)
    except RuntimeError as e:  # torch raises RuntimeError; dtcore's ConfigError is one
        return {"error": f"{type(e).__name__}: {e}"}
    return {"error": None}


def static_graph(rank: int) -> dict:
    """static_graph=True (or _set_static_graph()) lets the same parameters go unused in every step
    without find_unused_parameters, as torch's does."""
    result = {}
    for how in ("argument", "method"):
        torch.manual_seed(0)
        if how == "argument":
            model = DDP(TwoLayers(), static_graph=True)
        else:
            model = DDP(TwoLayers())
            model._set_static_graph()
        for _ in range(3):
            model(batch(rank)).sum().backward()
        result[how] = {
            "static_graph": model.static_graph,
            "spare_none": model.module.spare.weight.grad is None,
            "used_grad": model.module.used.bias.grad.tolist(),  # the average of 3 * (rank+1) sums
        }
    return result


class Materialized(torch.nn.Module):
    """fc2 differs across ranks (a proxy materialized later): excluded from DDP by name."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(1, 1, bias=False)
        self.fc2 = torch.nn.Linear(1, 1 + rank, bias=False)
        self.fc2.register_buffer("local", torch.full((5 + rank,), float(rank)))

    def forward(self, x):
        return self.fc2(self.fc1(x))


def ignored_parameters(rank: int) -> dict:
    """_set_params_and_buffers_to_ignore_for_model: those parameters are neither compared, broadcast
    nor reduced (their gradient stays this rank's own), those buffers not broadcast."""
    torch.manual_seed(rank)  # different weights on each rank: fc1 must become rank 0's
    module = Materialized(rank)
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        module, ["fc2.weight", "fc2.local"]
    )
    model = DDP(module)
    fc1 = model.module.fc1.weight.detach().clone()
    dtcore.broadcast(fc1, src=0)
    same_fc1 = torch.equal(fc1, model.module.fc1.weight.detach())
    model(torch.full((1, 1), float(rank + 1))).sum().backward()
    local = model.module.fc2.weight.grad.clone()
    shared = model.module.fc1.weight.grad.clone()
    everyone = [torch.empty_like(shared) for _ in range(2)]
    dist.all_gather(everyone, shared)
    return {
        "same_fc1": same_fc1,
        "fc1_grad_same": torch.equal(everyone[0], everyone[1]),
        "fc2_grad_shape": list(local.shape),
        "local_buffer": model.module.fc2.local.tolist()[:1],
        "ignored": sorted(model.parameters_to_ignore),
    }


def unfinished_reduction(rank: int) -> dict:
    """Without find_unused_parameters, an unused parameter is reported by the next forward with
    torch DDP's key phrases: the indices and the names of the parameters that got no gradient."""
    model = DDP(TwoLayers())
    model(batch(rank)).sum().backward()
    try:
        model(batch(rank))
    except RuntimeError as e:
        return {"error": str(e)}
    return {"error": None}


def groups(rank: int) -> dict:
    """A group of every rank and a 1-D device mesh are accepted (and become .process_group); so is a
    group of rank 0 alone there (nothing to average), while rank 1, not in it, is refused by name."""
    from torch.distributed.device_mesh import init_device_mesh

    whole = dist.new_group([0, 1])
    model = DDP(torch.nn.Linear(2, 2), process_group=whole)
    mesh = init_device_mesh("cpu", (2,))
    meshed = DDP(torch.nn.Linear(2, 2), device_mesh=mesh)
    model(torch.ones(1, 2)).sum().backward()
    meshed(torch.ones(1, 2)).sum().backward()
    alone = dist.new_group([0])  # every rank takes part in new_group; rank 1 gets NON_GROUP_MEMBER
    refused, single = None, None
    try:
        by_itself = DDP(torch.nn.Linear(2, 2, bias=False), process_group=alone)
        by_itself.module.weight.data.fill_(1.0)
        by_itself(torch.full((1, 2), float(rank + 1))).sum().backward()
        single = {"group": by_itself.process_group is alone, "grad": by_itself.module.weight.grad.flatten().tolist()}
    except dtcore.ConfigError as e:
        refused = str(e)
    return {
        "single": single,
        "whole": model.process_group is whole,
        "mesh": meshed.process_group is mesh.get_group(0) and meshed.device_mesh is mesh,
        "default": DDP(torch.nn.Linear(2, 2)).process_group is dist.group.WORLD,
        "refused": refused,
    }


def compatibility(rank: int) -> dict:
    """torch.save of the whole model, bucket_cap_mb_list, forward_sync_buffers, and torch 2.13's
    deprecation warning for broadcast_buffers (which, as torch's, also skips the buffers at init)."""
    result = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet = DDP(torch.nn.Linear(2, 2), forward_sync_buffers=False)
        result["quiet"] = [str(w.message) for w in caught]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        local = Counter()
        local.count.fill_(rank)
        kept = DDP(local, broadcast_buffers=False)
        result["warned"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    result["forward_sync_buffers"] = [quiet.forward_sync_buffers, kept.forward_sync_buffers, kept.broadcast_buffers]
    result["rank_local_buffer"] = kept.module.count.item()
    listed = DDP(torch.nn.Linear(2, 2), bucket_cap_mb_list=[1, 2])
    result["bucket_bytes_cap_list"] = [listed.bucket_bytes_cap_list, quiet.bucket_bytes_cap_list]
    try:
        DDP(torch.nn.Linear(2, 2), bucket_cap_mb_list=[1, 2, 3])
        result["uneven_list"] = None
    except dtcore.ConfigError as e:
        result["uneven_list"] = str(e)
    buffer = io.BytesIO()
    torch.save(listed, buffer)
    buffer.seek(0)
    copy = torch.load(buffer, weights_only=False)
    copy(torch.full((1, 2), float(rank + 1))).sum().backward()
    grads = copy.module.weight.grad.clone()
    dtcore.all_reduce(grads, op="max")
    result["copy"] = {
        "process_group": copy.process_group is dist.group.WORLD,
        "averaged": torch.equal(grads, copy.module.weight.grad),
        "grad": copy.module.weight.grad[0].tolist(),
    }
    return result


def rewrapped(rank: int) -> dict:
    """The same module wrapped again while the earlier wrapper is alive (torch's tests do so in a loop):
    each new wrapper takes the parameters over and averages across ranks; the earlier one refuses."""
    torch.manual_seed(0)
    module, earlier, grads, refused = TwoLayers(), None, [], []
    for find_unused in (True, False, True):
        model = DDP(module, find_unused_parameters=find_unused)
        module.zero_grad()
        model(batch(rank), use_spare=True).sum().backward()
        grads.append(module.used.weight.grad.sum().item())
        if earlier is not None:
            try:
                earlier(batch(rank))
                refused.append(None)
            except dtcore.ConfigError as e:
                refused.append(str(e))
        earlier = model
    return {"grads": grads, "refused": refused}


def logging_data(rank: int) -> dict:
    """torch DDP's _get_ddp_logging_data: construction facts, sampled iterations and timings, the comm
    hook's name and the last error."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.manual_seed(0)
    model = DDP(TwoLayers())
    result = {"at_construction": model._get_ddp_logging_data()}
    model._set_ddp_runtime_logging_sample_rate(2)
    result["iterations"] = []
    for _ in range(13):
        model(batch(rank), use_spare=True).sum().backward()
        result["iterations"].append(model._get_ddp_logging_data()["iteration"])
    result["after"] = model._get_ddp_logging_data()
    hooked = DDP(TwoLayers())
    hooked.register_comm_hook(None, default_hooks.allreduce_hook)
    builtin = DDP(TwoLayers())
    builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    result["hooks"] = [
        hooked._get_ddp_logging_data().get("comm_hook"),
        builtin._get_ddp_logging_data().get("comm_hook"),
        str(dist.BuiltinCommHookType.FP16_COMPRESS),
    ]
    broken = DDP(TwoLayers())
    broken(batch(rank)).sum().backward()  # spare gets no gradient: the reduction cannot finish
    try:
        broken(batch(rank))
        result["error"] = None
    except dtcore.ConfigError as e:
        result["error"] = str(e)
    result["error_logged"] = broken._get_ddp_logging_data().get("error")
    return result


def profiled(rank: int) -> dict:
    """Under torch's profiler, each collective is an async event named as c10d names its own
    ("gloo:all_reduce"), one per bucket reduced, and the search for unused parameters is one event
    per forward, as torch DDP records them."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = DDP(TwoLayers(), bucket_cap_mb=1e-6)  # one bucket per parameter: 4 all-reduces a step
    x = batch(rank)
    model(x, use_spare=True).sum().backward()  # the first step also rebuilds the buckets (a broadcast)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            model(x, use_spare=True).sum().backward()
    unused = DDP(TwoLayers(), find_unused_parameters=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof_unused:
        unused(x).sum().backward()
    names = [e.name for e in prof.events()]
    return {
        "all_reduce": names.count("gloo:all_reduce"),
        "async": sorted({e.is_async for e in prof.events() if e.name == "gloo:all_reduce"}),
        "other_collectives": sorted({n for n in names if n.startswith(("gloo:", "nccl:")) and n != "gloo:all_reduce"}),
        "search": [e.name for e in prof_unused.events() if e.name.endswith("search_unused_parameters")],
    }


CASES = [
    unused_everywhere,
    functional_call,
    reassigned_buffer,
    nothing_to_train,
    static_graph,
    ignored_parameters,
    unfinished_reduction,
    groups,
    compatibility,
    rewrapped,
    logging_data,
    profiled,
]


def run_cases(cases) -> None:
    """Runs each case on this rank, one JSON report line: {case name: its result, or what it raised}."""
    ctx = dtcore.init(timeout=60)
    report = {"rank": ctx.rank}
    for case in cases:
        try:
            report[case.__name__] = case(ctx.rank)
        except Exception:
            report[case.__name__] = {"raised": traceback.format_exc()[-1500:]}
        dtcore.barrier()
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    dtcore.shutdown()


def main() -> None:
    run_cases(CASES)


if __name__ == "__main__":
    main()
