"""One rank: dtcore.wrap under torch.compile, beside torch DDP compiled the same way.

compile_worker.py    (2 ranks; prints {case: result} as JSON, a result being what the test checks)

Every case compiles with backend="aot_eager" (AOTAutograd's graphs without code generation: what
dynamo and the graph split do is the same as with inductor, in a fraction of the time).
See Note [dtcore under torch.compile] in python/dtcore/reducer/compiled.py.
"""

import copy
import time

import torch
import torch._dynamo
import torch.nn.functional as F
from ddp_semantics_worker import run_cases
from torch._dynamo.utils import counters
from zero3_worker import close

import dtcore
from dtcore.train.demo.gpt import GPT, GPTConfig

BACKEND = "aot_eager"
# 4 blocks of width 128: about 3 MB of parameters, so that 1 MiB buckets make several graph pieces.
CONFIG = GPTConfig(vocab_size=64, block_size=32, n_layer=4, n_head=4, n_embd=128)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randint(0, CONFIG.vocab_size, (2, CONFIG.block_size), generator=g)
    return x, torch.roll(x, -1, dims=1)


def gpt() -> torch.nn.Module:
    torch.manual_seed(0)
    return GPT(CONFIG)


def dtcore_breaks() -> list[str]:
    """Graph breaks dynamo counted whose reason names dtcore's code."""
    return [reason[:300] for reason in counters["graph_break"] if "dtcore" in reason]


def compiled_dtcore(form: str, module: torch.nn.Module, **options) -> torch.nn.Module:
    if form == "outer":  # torch.compile(dtcore.wrap(m))
        return torch.compile(dtcore.wrap(module, **options), backend=BACKEND)
    if form == "inner":  # dtcore.wrap(torch.compile(m))
        return dtcore.wrap(torch.compile(module, backend=BACKEND), **options)
    model = dtcore.wrap(module, **options)  # model.compile(): torch's in-place form
    model.compile(backend=BACKEND)
    return model


def bare(model: torch.nn.Module) -> torch.nn.Module:
    """The dtcore (or torch DDP) wrapper under torch.compile's OptimizedModule, if any."""
    return getattr(model, "_orig_mod", model)


def max_diff(a: torch.nn.Module, b: torch.nn.Module, what: str) -> float:
    """The largest difference between the two models' parameters ("param") or gradients ("grad"), by name
    (a compiled module's names carry _orig_mod.)."""
    theirs = {n.replace("_orig_mod.", ""): p for n, p in b.named_parameters()}
    diff = 0.0
    for name, p in a.named_parameters():
        q = theirs[name.replace("_orig_mod.", "")]
        x, y = (p, q) if what == "param" else (p.grad, q.grad)
        diff = max(diff, (x - y).abs().max().item())
    return diff


def first_collective(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """One synced step's backward: when its first bucket's collective started, as a fraction of the time
    from the end of forward to the last gradient ready."""
    loss = model(x, y)
    start = time.time_ns()
    loss.backward()
    comm_start, compute_end, _ = bare(model)._reducer.last_backward_times()
    return (comm_start - start) / (compute_end - start)


def forms(rank: int) -> dict:
    """Each form against torch.compile(torch DDP): gradients and weights over 4 steps (one of them two
    micro-batches with no_sync), graph breaks, graphs compiled after the first step, and overlap: when the
    first bucket's collective starts, here and with dynamo's graph split turned off."""
    out = {}
    for form in ("outer", "inner", "method"):
        torch._dynamo.reset()  # each form compiles its own graphs, counted from here
        counters.clear()
        ddp = torch.compile(torch.nn.parallel.DistributedDataParallel(gpt(), bucket_cap_mb=1), backend=BACKEND)
        mine = compiled_dtcore(form, gpt(), bucket_mb=1)
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (ddp, mine)]
        grad_diff, graphs = 0.0, []
        for step in range(4):
            for model in (ddp, mine):
                if step == 2:  # accumulation: a micro-batch without sync, then a synced one
                    with bare(model).no_sync():
                        model(*batch(10 + step, rank)).backward()
                model(*batch(step, rank)).backward()
            grad_diff = max(grad_diff, max_diff(bare(mine).module, bare(ddp).module, "grad"))
            for opt in opts:
                opt.step()
                opt.zero_grad()
            graphs.append(counters["stats"]["unique_graphs"])
        fractions = []
        for step in range(3):
            fractions.append(first_collective(mine, *batch(step, rank)))
            mine.zero_grad()
        out[form] = {
            "grad_diff": grad_diff,
            "param_diff": max_diff(bare(mine).module, bare(ddp).module, "param"),
            "dtcore_breaks": dtcore_breaks(),
            "graphs": graphs,
            "first_collective": sorted(fractions)[1],
            "buckets": len(bare(mine).bucket_params),
        }
    torch._dynamo.reset()
    with torch._dynamo.config.patch(optimize_ddp=False):  # the control: one graph, gradients at its end
        unsplit = compiled_dtcore("outer", gpt(), bucket_mb=1)
        unsplit(*batch(0, rank)).backward()
        unsplit.zero_grad()
        fractions = [first_collective(unsplit, *batch(step, rank)) for step in range(3)]
    out["unsplit_first_collective"] = sorted(fractions)[1]
    torch._dynamo.reset()
    return out


def explain(rank: int) -> dict:
    """torch._dynamo.explain over the wrapper, for each zero stage."""
    out = {}
    for zero in (0, 1, 2):
        model = dtcore.wrap(gpt(), bucket_mb=1, zero=zero)
        e = torch._dynamo.explain(model)(*batch(0, rank))
        out[zero] = {
            "graphs": e.graph_count,
            "breaks": e.graph_break_count,
            "reasons": [r.reason[:200] for r in e.break_reasons],
        }
        model.zero_grad()
    return out


def sharded(rank: int) -> dict:
    """zero=1 and zero=2 compiled, stepped by ShardedOptimizer, against zero=0 compiled with AdamW."""
    reference = torch.compile(dtcore.wrap(gpt(), bucket_mb=1), backend=BACKEND)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    out = {}
    for zero in (1, 2):
        model = torch.compile(dtcore.wrap(gpt(), bucket_mb=1, zero=zero), backend=BACKEND)
        opt = dtcore.ShardedOptimizer(bare(model), torch.optim.AdamW, lr=1e-3)
        torch._dynamo.reset()
        counters.clear()
        graphs = []
        for step in range(3):
            model(*batch(step, rank)).backward()
            opt.step()
            opt.zero_grad()
            graphs.append(counters["stats"]["unique_graphs"])
        out[zero] = {"graphs": graphs, "dtcore_breaks": dtcore_breaks(), "model": bare(model)}
    for step in range(3):
        reference(*batch(step, rank)).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for zero in (1, 2):
        model = out[zero].pop("model")
        out[zero]["param_diff"] = max_diff(model.module, bare(reference).module, "param")
    return out


class Branches(torch.nn.Module):
    """A trunk and two heads; the loss uses one of them (find_unused_parameters' case)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Linear(256, 1024)
        self.used = torch.nn.Linear(1024, 256)
        self.unused = torch.nn.Linear(1024, 256)

    def forward(self, x):
        return self.used(torch.relu(self.trunk(x))).square().mean()


def find_unused(rank: int) -> dict:
    """find_unused_parameters=True compiled, against torch DDP compiled alike."""
    torch.manual_seed(0)
    module = Branches()
    ddp = torch.compile(
        torch.nn.parallel.DistributedDataParallel(copy.deepcopy(module), find_unused_parameters=True), backend=BACKEND
    )
    mine = torch.compile(dtcore.wrap(copy.deepcopy(module), find_unused_parameters=True), backend=BACKEND)
    counters.clear()
    graphs = []
    for step in range(3):
        x = torch.randn(4, 256, generator=torch.Generator().manual_seed(10 * step + rank))
        for model in (ddp, mine):
            model.zero_grad()
            model(x).backward()
        graphs.append(counters["stats"]["unique_graphs"])
    return {
        "grad_diff": max(
            (a.grad - b.grad).abs().max().item()
            for a, b in zip(bare(mine).module.parameters(), bare(ddp).module.parameters(), strict=True)
            if a.grad is not None
        ),
        "unused_grads": [p.grad is None for p in bare(mine).module.unused.parameters()],
        "graphs": graphs,
        "dtcore_breaks": dtcore_breaks(),
    }


def small_buckets(rank: int) -> dict:
    """bucket_mb below dynamo's first piece (1 MiB), which torch DDP compiled refuses with an AssertionError."""
    eager = dtcore.wrap(gpt(), bucket_mb=0.25)
    mine = torch.compile(dtcore.wrap(gpt(), bucket_mb=0.25), backend=BACKEND)
    for model in (eager, mine):
        model(*batch(0, rank)).backward()
    grad_diff = max_diff(bare(mine).module, eager.module, "grad")
    mine.zero_grad()
    fractions = []
    for step in range(1, 4):
        fractions.append(first_collective(mine, *batch(step, rank)))
        mine.zero_grad()
    return {"grad_diff": grad_diff, "buckets": len(bare(mine).bucket_params), "first_collective": sorted(fractions)[1]}


def auto_buckets(rank: int) -> dict:
    """bucket_mb="auto" compiled: its plan is chosen from the first compiled backward; weights as eager's."""
    eager = dtcore.wrap(gpt(), bucket_mb="auto")
    mine = torch.compile(dtcore.wrap(gpt(), bucket_mb="auto"), backend=BACKEND)
    for model in (eager, mine):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(3):
            model(*batch(step, rank)).backward()
            opt.step()
            opt.zero_grad()
    return {
        "param_diff": max_diff(bare(mine).module, eager.module, "param"),
        "chosen": bare(mine)._reducer.auto_plan_info()["chosen"],
    }


class Quirks(torch.nn.Module):
    """A tied embedding and head, a Linear used twice, a frozen one, BatchNorm buffers. (zero3_worker's
    Quirks, whose BatchNorm runs on a transposed view, fails under torch.compile without any wrapper:
    AOTAutograd's backward views a non-contiguous gradient, torch 2.13.)"""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(40, 32)
        self.mix = torch.nn.Linear(32, 32)
        self.frozen = torch.nn.Linear(32, 32)
        self.frozen.requires_grad_(False)
        self.bn = torch.nn.BatchNorm1d(32)
        self.head = torch.nn.Linear(32, 40, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens).flatten(0, 1)  # (B*T, C)
        h = self.mix(torch.tanh(self.mix(h)))  # used twice
        h = self.frozen(self.bn(h))
        return F.cross_entropy(self.head(h), tokens.flatten())


def quirks(rank: int) -> dict:
    """Quirks compiled with dtcore.wrap's defaults, against torch DDP compiled: gradients and buffers."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    ddp = torch.compile(torch.nn.parallel.DistributedDataParallel(Quirks()), backend=BACKEND)
    torch.manual_seed(0)
    mine = torch.compile(dtcore.wrap(Quirks()), backend=BACKEND)
    worst = 0.0
    for step in range(3):
        tokens = torch.randint(0, 40, (4, 9), generator=torch.Generator().manual_seed(10 * step + rank))
        for model in (ddp, mine):
            model.zero_grad()
            model(tokens).backward()
        for a, b in zip(bare(mine).module.parameters(), bare(ddp).module.parameters(), strict=True):
            if a.requires_grad:
                assert close(a.grad, b.grad), (step, (a.grad - b.grad).abs().max().item())
                worst = max(worst, (a.grad - b.grad).abs().max().item())
    buffers = [torch.equal(a, b) for a, b in zip(bare(mine).module.buffers(), bare(ddp).module.buffers(), strict=True)]
    return {"grad_diff": worst, "buffers_equal": all(buffers), "dtcore_breaks": dtcore_breaks()}


CASES = [forms, explain, sharded, find_unused, small_buckets, auto_buckets, quirks]


if __name__ == "__main__":
    run_cases(CASES)
