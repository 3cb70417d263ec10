"""One rank: ZeRO-1/2 (dtcore.wrap(zero=...) + ShardedOptimizer) against unsharded training.

zero_worker.py parity ZERO [clip] [bf16] [accum]   # 50 AdamW steps next to zero=0 + torch AdamW
zero_worker.py state ZERO                           # state_dict gathered, loaded from a plain optimizer
zero_worker.py unused ZERO                          # find_unused_parameters=True, unused on some or all ranks
zero_worker.py skipped ZERO                         # unused on every rank: skipped as torch DDP + AdamW skips it
zero_worker.py refusals                             # what cannot be right is refused

The reference is the same model wrapped with zero=0 in the same process, stepped by torch's own
AdamW over whole parameters (with bf16: an fp32 master copy, stepped by torch's AdamW, cast back).
Prints one JSON line: {"rank", "bad": [...], ...}.
"""

import contextlib
import copy
import json
import sys

import torch
import torch.nn.functional as F

import dtcore

VOCAB, WIDTH, CONTEXT = 50, 24, 8


class TinyLM(torch.nn.Module):
    """Embeddings, two residual MLP blocks with LayerNorm, an untied head: many shapes and dtypes of use."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.LayerNorm(WIDTH),
                torch.nn.Linear(WIDTH, 3 * WIDTH),
                torch.nn.GELU(),
                torch.nn.Linear(3 * WIDTH, WIDTH),
            )
            for _ in range(2)
        )
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):  # (B, T) -> (B, T, VOCAB)
        h = self.embed(tokens)  # (B, T, C)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def loss_of(model, tokens):
    logits = model(tokens[:, :-1])  # (B, T-1, V)
    return F.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))


def batches(steps: int, micro: int, batch: int):
    data = torch.Generator().manual_seed(7)
    return [[torch.randint(0, VOCAB, (batch, CONTEXT), generator=data) for _ in range(micro)] for _ in range(steps)]


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a.double(), b.double(), rtol=1.3e-6, atol=5e-5)


def same_as_rank0(tensors) -> bool:
    mine = torch.cat([t.detach().double().flatten() for t in tensors])
    theirs = mine.clone()
    dtcore.broadcast(theirs, src=0)
    return torch.equal(mine, theirs)


class MasterAdamW:
    """The reference for bf16 parameters: torch's AdamW on an fp32 copy, cast back after each step."""

    def __init__(self, groups, **kw) -> None:
        self.pairs = []  # (parameter, its fp32 master)
        master_groups = []
        for group in groups:
            masters = [p.detach().float().clone() for p in group["params"]]
            self.pairs += list(zip(group["params"], masters))
            master_groups.append({**group, "params": masters})
        self.opt = torch.optim.AdamW(master_groups, **kw)

    def step(self) -> None:
        for p, m in self.pairs:
            m.grad = p.grad.float()
        self.opt.step()
        with torch.no_grad():
            for p, m in self.pairs:
                p.copy_(m)

    def zero_grad(self) -> None:
        for p, _ in self.pairs:
            p.grad = None


def parity(ctx, zero: int, options: set) -> dict:
    n, r = ctx.world_size, ctx.rank
    dtype = torch.bfloat16 if "bf16" in options else torch.float32
    torch.manual_seed(0)
    base = TinyLM().to(dtype)
    caps = {"bucket_mb": 0.004, "first_bucket_mb": 0.001}  # several buckets, parameters cut across shards
    model = dtcore.wrap(base, zero=zero, **caps)
    reference = dtcore.wrap(copy.deepcopy(base), zero=0, **caps)
    kw = {"lr": 3e-3, "weight_decay": 0.1, "betas": (0.9, 0.95)}
    decay = [p for name, p in base.named_parameters() if p.dim() >= 2]
    no_decay = [p for name, p in base.named_parameters() if p.dim() < 2]
    opt = dtcore.ShardedOptimizer(
        model, torch.optim.AdamW, [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], **kw
    )
    ref_decay = [p for p in reference.module.parameters() if p.dim() >= 2]
    ref_no_decay = [p for p in reference.module.parameters() if p.dim() < 2]
    ref_groups = [{"params": ref_decay}, {"params": ref_no_decay, "weight_decay": 0.0}]
    ref_opt = MasterAdamW(ref_groups, **kw) if dtype != torch.float32 else torch.optim.AdamW(ref_groups, **kw)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))  # warmup through param_groups
    ref_sched = torch.optim.lr_scheduler.LambdaLR(
        ref_opt if dtype == torch.float32 else ref_opt.opt, lambda s: min(1.0, (s + 1) / 10)
    )
    micro = 2 if "accum" in options else 1
    bad, norms = [], []
    per_rank = 4
    for step, micros in enumerate(batches(50, micro, per_rank * n)):
        for k, tokens in enumerate(micros):
            mine = tokens[r * per_rank : (r + 1) * per_rank]
            last = k == len(micros) - 1
            with contextlib.nullcontext() if last else model.no_sync():
                (loss_of(model, mine) / micro).backward()
            with contextlib.nullcontext() if last else reference.no_sync():
                (loss_of(reference, mine) / micro).backward()
        if zero == 2 and any(p.grad is not None for p in base.parameters()):
            bad.append(f"step {step}: zero=2 left a whole .grad")
        if "clip" in options:
            got = dtcore.clip_grad_norm_(model, 0.5)
            want = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
            norms.append(float(want))
            if not close(got, want):
                bad.append(f"step {step}: clip norm {float(got)} against {float(want)}")
        opt.step()
        ref_opt.step()
        sched.step()
        ref_sched.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        if step % 10 == 9 or step == 49:
            for (name, p), q in zip(base.named_parameters(), reference.module.parameters()):
                if not close(p, q):
                    bad.append(f"step {step}: {name} max diff {(p.double() - q.double()).abs().max().item():.3g}")
    if not same_as_rank0(base.parameters()):
        bad.append("parameters differ across ranks")
    clipped = sum(1 for x in norms if x > 0.5)
    return {"bad": bad[:10], "clipped_steps": clipped, "lr": opt.param_groups[0]["lr"]}


def state(ctx, zero: int) -> dict:
    """state_dict() equals a plain AdamW's on the same run; a plain AdamW's state loads and trains on alike."""
    n, r = ctx.world_size, ctx.rank
    torch.manual_seed(0)
    base = TinyLM()
    caps = {"bucket_mb": 0.004, "first_bucket_mb": 0.001}
    model = dtcore.wrap(base, zero=zero, **caps)
    reference = dtcore.wrap(copy.deepcopy(base), zero=0, **caps)
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    bad = []

    def train(steps, seed):
        data = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            tokens = torch.randint(0, VOCAB, (4 * n, CONTEXT), generator=data)[r * 4 : (r + 1) * 4]
            for m, o in ((model, opt), (reference, ref_opt)):
                loss_of(m, tokens).backward()
                o.step()
                o.zero_grad()

    train(5, 1)
    got, want = opt.state_dict(), ref_opt.state_dict()
    if got["param_groups"] != want["param_groups"]:
        bad.append(f"param_groups {got['param_groups']} != {want['param_groups']}")
    if sorted(got["state"]) != sorted(want["state"]):
        bad.append(f"state indices {sorted(got['state'])} != {sorted(want['state'])}")
    for i, entry in want["state"].items():
        for key, value in entry.items():
            if not close(got["state"][i][key], value):
                bad.append(f"state {i} {key} differs")
    # A fresh sharded optimizer takes a plain one's state (another layout: the whole model) and trains on alike.
    fresh = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-3)
    fresh.load_state_dict(want)
    if fresh.param_groups[0]["lr"] != 1e-2:
        bad.append("hyperparameters not loaded")
    opt = fresh
    train(5, 2)
    for (name, p), q in zip(base.named_parameters(), reference.module.parameters()):
        if not close(p, q):
            bad.append(f"after loading: {name} max diff {(p - q).abs().max().item():.3g}")
    return {"bad": bad[:10]}


def refusals(ctx) -> dict:
    errors = {}

    def record(key, fn):
        try:
            fn()
            errors[key] = None
        except dtcore.ConfigError as e:
            errors[key] = str(e)

    plain = dtcore.wrap(TinyLM())
    record("zero0", lambda: dtcore.ShardedOptimizer(plain, torch.optim.AdamW, lr=1e-3))
    sharded = dtcore.wrap(TinyLM(), zero=2)
    record("adafactor", lambda: dtcore.ShardedOptimizer(sharded, torch.optim.Adafactor, lr=1e-3))
    record("unwrapped", lambda: dtcore.ShardedOptimizer(sharded.module, torch.optim.AdamW, lr=1e-3))
    record("stage4", lambda: dtcore.wrap(TinyLM(), zero=4))
    tokens = torch.randint(0, VOCAB, (2, CONTEXT))
    plain_opt = torch.optim.AdamW(sharded.parameters(), lr=1e-3)
    for _ in range(2):  # the second backward is reduce-scattered
        loss_of(sharded, tokens).backward()
    record("plain_optimizer", plain_opt.step)
    return {"errors": errors}


class Branchy(torch.nn.Module):
    """A middle layer that a step may skip: on one rank, on the other, or on both."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)

    def forward(self, x, use_b: bool):
        h = self.a(x)
        return self.c(self.b(h) if use_b else h).sum()


def unused(ctx, zero: int) -> dict:
    """find_unused_parameters=True with ZeRO: parameters unused on some ranks, or on all, in some steps.

    ZeRO steps a parameter unused on every rank with a zero gradient, as the unsharded model does
    when its gradients are zeroed in place (zero_grad(set_to_none=False), torch DDP's behaviour
    too); with set_to_none=True the unsharded model's .grad stays None and the optimizer skips it."""
    torch.manual_seed(0)
    base = Branchy()
    reference = dtcore.wrap(copy.deepcopy(base), find_unused_parameters=True)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    model = dtcore.wrap(copy.deepcopy(base), zero=zero, find_unused_parameters=True)
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2)
    data = torch.Generator().manual_seed(ctx.rank)
    bad = []
    for step in range(6):
        x = torch.randn(4, 8, generator=data)
        use_b = step % 2 == 0 if ctx.rank == 0 else step % 3 == 0  # step 1 and 5: b unused on every rank
        for m, o in ((reference, ref_opt), (model, opt)):
            o.zero_grad(set_to_none=False)
            m(x, use_b).backward()
            o.step()
        for (name, p), q in zip(model.module.named_parameters(), reference.module.parameters()):
            if not close(p, q):
                bad.append(f"step {step} {name}: {(p - q).abs().max().item():.3g}")
    return {"bad": bad}


class Skippy(Branchy):
    """Branchy with a layer no forward uses: its .grad stays None under torch DDP, its state absent."""

    def __init__(self) -> None:
        super().__init__()
        self.d = torch.nn.Linear(8, 8)


# Per step, per rank: does micro-batch 0 (inside no_sync) and micro-batch 1 (synced) use layer b?
SKIP_PLAN = [
    ((True, True), (True, True)),  # used: stepped
    ((False, False), (False, False)),  # no rank: skipped (torch's .grad is None)
    ((True, False), (False, False)),  # rank 0 inside no_sync only: stepped with its gradient
    ((False, False), (False, False)),
    ((False, False), (False, True)),  # rank 1 only
    ((False, False), (False, False)),
]


def skipped(ctx, zero: int) -> dict:
    """Parameters no rank gave a gradient are skipped, as torch DDP(find_unused_parameters=True) + AdamW
    (zero_grad() leaving None) skips them: values each step, and the state (b's step count, d's absence)."""
    torch.manual_seed(0)
    base = Skippy()
    reference = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), find_unused_parameters=True)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    model = dtcore.wrap(copy.deepcopy(base), zero=zero, find_unused_parameters=True)
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
    data = torch.Generator().manual_seed(ctx.rank)
    bad = []
    for step, uses in enumerate(SKIP_PLAN):
        xs = [torch.randn(4, 8, generator=data) for _ in range(2)]
        for m, o in ((reference, ref_opt), (model, opt)):
            with m.no_sync():
                m(xs[0], uses[ctx.rank][0]).backward()
            m(xs[1], uses[ctx.rank][1]).backward()
            o.step()
            o.zero_grad()
        for (name, p), q in zip(model.module.named_parameters(), reference.module.parameters(), strict=True):
            if not close(p, q):
                bad.append(f"step {step} {name}: {(p - q).abs().max().item():.3g}")
    ours, theirs = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    if sorted(ours) != sorted(theirs):
        bad.append(f"state for parameters {sorted(ours)}, torch's for {sorted(theirs)}")
    for i in set(ours) & set(theirs):
        if float(ours[i]["step"]) != float(theirs[i]["step"]):
            bad.append(f"parameter {i}: step {float(ours[i]['step'])}, torch's {float(theirs[i]['step'])}")
        for key in ("exp_avg", "exp_avg_sq"):
            if not close(ours[i][key], theirs[i][key]):
                bad.append(f"parameter {i} {key}")
    return {"bad": bad}


def frozen(ctx, zero: int) -> dict:
    """Fine-tuning: the embedding and the head's bias frozen, ShardedOptimizer built as documented over
    model.parameters() (frozen ones included, as a torch optimizer takes them): trains as torch DDP + AdamW,
    the frozen ones untouched and without state."""
    torch.manual_seed(0)
    base = TinyLM()
    base.embed.requires_grad_(False)
    base.head.bias.requires_grad_(False)
    reference = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base))
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    model = dtcore.wrap(copy.deepcopy(base), zero=zero, bucket_mb=0.004, first_bucket_mb=0.001)
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
    bad = []
    for step, (tokens,) in enumerate(batches(5, 1, 4 * ctx.world_size)):
        mine = tokens[ctx.rank * 4 : (ctx.rank + 1) * 4]
        for m, o in ((reference, ref_opt), (model, opt)):
            loss_of(m, mine).backward()
            o.step()
            o.zero_grad()
        for (name, p), q in zip(model.module.named_parameters(), reference.module.parameters(), strict=True):
            if not close(p, q):
                bad.append(f"step {step} {name}: {(p - q).abs().max().item():.3g}")
    for name, p in [("embed.weight", model.module.embed.weight), ("head.bias", model.module.head.bias)]:
        if not torch.equal(p, dict(base.named_parameters())[name]):
            bad.append(f"frozen {name} changed")
    ours, theirs = opt.state_dict(), ref_opt.state_dict()
    if sorted(ours["state"]) != sorted(theirs["state"]):
        bad.append(f"state for parameters {sorted(ours['state'])}, torch's for {sorted(theirs['state'])}")
    if [g["params"] for g in ours["param_groups"]] != [g["params"] for g in theirs["param_groups"]]:
        bad.append("param_groups differ from torch's")
    late = dtcore.wrap(copy.deepcopy(base), zero=zero)  # the embedding frozen at wrap, unfrozen after it
    late.module.embed.requires_grad_(True)
    try:
        dtcore.ShardedOptimizer(late, torch.optim.AdamW, lr=1e-2)
        unfrozen = None
    except dtcore.ConfigError as e:
        unfrozen = str(e)
    return {"bad": bad, "unfrozen": unfrozen}


def main() -> None:
    mode = sys.argv[1]
    ctx = dtcore.init(timeout=60)
    if mode == "parity":
        report = parity(ctx, int(sys.argv[2]), set(sys.argv[3:]))
    elif mode == "state":
        report = state(ctx, int(sys.argv[2]))
    elif mode == "unused":
        report = unused(ctx, int(sys.argv[2]))
    elif mode == "skipped":
        report = skipped(ctx, int(sys.argv[2]))
    elif mode == "frozen":
        report = frozen(ctx, int(sys.argv[2]))
    else:
        report = refusals(ctx)
    report["rank"] = ctx.rank
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    dtcore.shutdown()


if __name__ == "__main__":
    main()
