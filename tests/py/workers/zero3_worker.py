"""One rank: zero=3 (dtcore.wrap(zero=3) + ShardedOptimizer) against torch DDP + torch's AdamW.

zero3_worker.py parity MODEL [OPTION ...]   # 10 AdamW steps with clipping; MODEL: gpt | quirks
    options: accum (2 micro-batches, the first under no_sync), checkpoint (checkpoint_activations),
    noreshard (reshard_after_forward=False), prefetch0, unused (find_unused_parameters, a block some
    ranks skip), meta (built on the meta device, initialised by init=)
zero3_worker.py bf16                           # param_dtype=bf16: fp32 shards, bf16 compute, near fp32 training
zero3_worker.py compile                        # torch.compile(model) and model.compile(): the eager gradients
zero3_worker.py units                          # which units units= gives, and where a tied parameter goes
zero3_worker.py eval                           # forward under no_grad, twice, then training goes on
zero3_worker.py state                          # state_dict whole, load_state_dict shards it
zero3_worker.py refusals                       # what zero=3 cannot do right is refused
zero3_worker.py diverge                        # ranks that run different blocks: an error, not a wrong step
zero3_worker.py unused_error                   # a parameter without gradient, no find_unused_parameters

Prints one JSON line: {"rank", "bad": [...], ...}.
"""

import copy
import json
import sys

import torch
import torch.nn.functional as F

import dtcore
from dtcore.train.demo.gpt import GPT, GPTConfig

VOCAB, WIDTH, CONTEXT = 40, 16, 8


class Block(torch.nn.Module):
    """A layer with a parameter used twice (the `mix` Linear), a frozen one, BatchNorm buffers, and an
    `extra` Linear that `skip` (set per rank) leaves without a gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.mix = torch.nn.Linear(WIDTH, WIDTH)
        self.frozen = torch.nn.Linear(WIDTH, WIDTH)
        self.frozen.weight.requires_grad_(False)
        self.bn = torch.nn.BatchNorm1d(WIDTH)
        self.extra = torch.nn.Linear(WIDTH, WIDTH)
        self.skip = False

    def forward(self, h):  # (B, T, C)
        x = self.mix(torch.tanh(self.mix(self.norm(h))))  # mix used twice
        x = self.bn(x.transpose(1, 2)).transpose(1, 2)
        if not self.skip:
            x = x + self.extra(x)
        return h + self.frozen(x)


class Quirks(torch.nn.Module):
    """Tied embedding and head, three Blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.run = [0, 1, 2]  # the blocks the forward runs

    def forward(self, tokens):  # (B, T) -> (B, T, V)
        h = self.embed(tokens)
        for i in self.run:
            h = self.blocks[i](h)
        return self.head(h)


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt":
        return GPT(GPTConfig())  # the tiny shape, vocabulary 64
    return Quirks()


def vocab_of(model: torch.nn.Module) -> int:
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding):
            return m.num_embeddings
    raise AssertionError("no embedding")


def loss_of(model, tokens, vocab):
    if isinstance(getattr(model, "module", model), GPT):
        return model(tokens[:, :-1], tokens[:, 1:])
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1))


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1.3e-6, atol=5e-5)


# Note [Rounding-noise gradients]
# Some elements' true gradient is zero: a bias right before a normalisation (BatchNorm subtracts it
# again), the key's third of an attention's qkv bias (softmax ignores a shift shared by every key).
# What autograd gives them is rounding noise (~1e-8), and AdamW divides it by its own running size:
# a step of about lr whose sign is that noise's. Any change in the order of a sum (an all-reduce
# against a reduce-scatter, clipping's norm summed by shard or by parameter) changes the noise, so
# no two implementations agree on these elements beyond ~lr per step. They are compared within that
# bound; every other element within the goal's rtol 1.3e-6 / atol 5e-5.
NOISE = 1e-6  # an element whose reference gradient never reached this is rounding noise


def compare(bad: list, ours: dict, theirs: dict, what: str, noise: dict | None = None, bound: float = 0.0) -> None:
    if set(ours) != set(theirs):
        bad.append(f"{what}: keys differ: {sorted(set(ours) ^ set(theirs))}")
    for key in sorted(set(ours) & set(theirs)):
        mask = None if noise is None else noise.get(key.removeprefix("module."))
        if mask is not None and mask.any() and ours[key].shape == theirs[key].shape:
            diff = (ours[key].double() - theirs[key].double()).abs().flatten()
            if diff[mask.flatten()].max() > bound:
                bad.append(f"{what}: {key}'s rounding-noise elements differ by {diff[mask.flatten()].max():.3g}")
            ours, theirs = dict(ours), dict(theirs)
            keep = ~mask.flatten()
            ours[key], theirs[key] = ours[key].flatten()[keep], theirs[key].flatten()[keep]
        if not close(ours[key], theirs[key]):
            diff = (
                (ours[key].double() - theirs[key].double()).abs().max().item()
                if ours[key].shape == theirs[key].shape
                else "shape"
            )
            bad.append(f"{what}: {key} differs ({diff})")


def parity(ctx, kind: str, options: list[str]) -> dict:
    bad: list[str] = []
    base = build(kind)
    vocab = vocab_of(base)
    reference = copy.deepcopy(base)
    unused = "unused" in options
    ddp = torch.nn.parallel.DistributedDataParallel(reference, find_unused_parameters=unused)
    ref_opt = torch.optim.AdamW([p for p in ddp.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    wrap_kw = {"zero": 3, "find_unused_parameters": unused}
    if "noreshard" in options:
        wrap_kw["reshard_after_forward"] = False
    if "prefetch0" in options:
        wrap_kw["prefetch"] = 0
    if "meta" in options:
        state = copy.deepcopy(base.state_dict())
        with torch.device("meta"):
            torch.manual_seed(0)
            base = build(kind)

        def init(module):  # the values of the model built on CPU, as a checkpoint would give them
            prefix = names_of[id(module)]
            for name, t in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
                t.copy_(state[f"{prefix}.{name}" if prefix else name])

        names_of = {id(m): n for n, m in base.named_modules()}
        wrap_kw["init"] = init
    if "checkpoint" in options:
        dtcore.checkpoint_activations(base, policy="all")
    model = dtcore.wrap(base, **wrap_kw)
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
    data = torch.Generator().manual_seed(100 + ctx.rank)
    micro = 2 if "accum" in options else 1
    biggest: dict[
        str, torch.Tensor
    ] = {}  # per element, the largest reference gradient: Note [Rounding-noise gradients]
    for step in range(10):
        # the last block's `extra`: unused on rank 1 in even steps, on every rank in step 4
        skip = unused and ((ctx.rank == 1 and step % 2 == 0) or step == 4)
        for m in (model.module, reference):
            if isinstance(m, Quirks):
                m.blocks[-1].skip = skip
        batches = [torch.randint(0, vocab, (4, CONTEXT + 1), generator=data) for _ in range(micro)]
        for i, tokens in enumerate(batches):
            last = i == micro - 1
            for net in (model, ddp):
                if last:
                    (loss_of(net, tokens, vocab) / micro).backward()
                else:
                    with net.no_sync():
                        (loss_of(net, tokens, vocab) / micro).backward()
        for name, p in reference.named_parameters():
            if p.grad is not None:
                biggest[name] = torch.maximum(biggest.get(name, torch.zeros_like(p)), p.grad.abs())
        torch.nn.utils.clip_grad_norm_([p for p in ddp.parameters() if p.requires_grad], 0.5)
        dtcore.clip_grad_norm_(model, 0.5)
        ref_opt.step()
        ref_opt.zero_grad()
        opt.step()
        opt.zero_grad()
    noise = {name: g < NOISE for name, g in biggest.items()}
    compare(bad, model.state_dict(), ddp.state_dict(), "after 10 steps", noise, bound=2 * 1e-2 * 10)
    return {"bad": bad, "noise_elements": int(sum(m.sum() for m in noise.values()))}


def bf16(ctx) -> dict:
    bad: list[str] = []
    base = build("gpt")
    reference = copy.deepcopy(base)
    ddp = torch.nn.parallel.DistributedDataParallel(reference)
    ref_opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.1)
    model = dtcore.wrap(base, zero=3, param_dtype=torch.bfloat16, comm_dtype=torch.float32)
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
    seen = set()
    block = model.module.blocks[0]
    block.register_forward_pre_hook(lambda m, a: seen.update(p.dtype for p in m.parameters()))
    vocab = vocab_of(base)
    data = torch.Generator().manual_seed(100 + ctx.rank)
    losses = []
    for _ in range(10):
        tokens = torch.randint(0, vocab, (4, CONTEXT + 1), generator=data)
        loss = loss_of(model, tokens, vocab)
        loss.backward()
        loss_of(ddp, tokens, vocab).backward()
        losses.append(loss.item())
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
    if seen != {torch.bfloat16}:
        bad.append(f"gathered parameters in {seen}, not bfloat16")
    shard_dtypes = {g.shard.dtype for u in model.units for g in u.groups}
    if shard_dtypes != {torch.float32}:
        bad.append(f"shards in {shard_dtypes}, not float32")
    ours, theirs = model.state_dict(), ddp.state_dict()
    worst = max((ours[k].double() - theirs[k].double()).abs().max().item() for k in theirs)
    if worst > 2e-2:  # bf16 compute: about 3 significant digits, over 10 steps of lr 1e-3
        bad.append(f"bf16 training strays {worst:.3g} from fp32 training")
    if not losses[-1] < losses[0]:
        bad.append(f"loss did not fall: {losses}")
    return {"bad": bad, "worst": worst}


def compiled(ctx) -> dict:
    """torch.compile of the whole wrapper runs it eagerly (Note [zero=3 and torch.compile]); model.compile()
    compiles each unit's forward. aot_eager: AOTAutograd's graphs, where a traced whole model fails."""
    bad: list[str] = []
    for how in ("torch.compile(model)", "model.compile()"):
        base = build("gpt")
        reference = copy.deepcopy(base)
        model = dtcore.wrap(base, zero=3)
        if how == "model.compile()":
            model.compile(backend="aot_eager")
            run = model
        else:
            run = torch.compile(model, backend="aot_eager")
        vocab = vocab_of(base)
        for step in range(2):
            tokens = torch.randint(0, vocab, (2, CONTEXT + 1), generator=torch.Generator().manual_seed(step))
            loss_of(run, tokens, vocab).backward()
            loss_of(reference, tokens, vocab).backward()
        named = dict(reference.named_parameters())
        for g in (g for u in model.units for g in u.groups if g.requires_grad):
            for cut in g.cuts:
                theirs = named[g.names[cut.param]].grad.flatten()[cut.param_offset : cut.param_offset + cut.numel]
                mine = g.grad[cut.shard_offset : cut.shard_offset + cut.numel]
                if ctx.world_size == 1 and not close(mine, theirs):
                    bad.append(f"{how}: {g.names[cut.param]}'s gradient differs")
    return {"bad": bad}


def units(ctx) -> dict:
    bad: list[str] = []
    cases = [
        (None, ["", "blocks.0", "blocks.1", "blocks.2"]),
        ((Block,), ["", "blocks.0", "blocks.1", "blocks.2"]),
        ("Block", ["", "blocks.0", "blocks.1", "blocks.2"]),
        (["blocks.0", "blocks.2"], ["", "blocks.0", "blocks.2"]),
        (lambda name, m: name == "blocks.1", ["", "blocks.1"]),
        ("blocks.*", ["", "blocks.0", "blocks.1", "blocks.2"]),
    ]
    for given, expected in cases:
        model = dtcore.wrap(build("quirks"), zero=3, units=given)
        names = [u.name for u in model.units]
        if names != expected:
            bad.append(f"units={given!r}: {names}, expected {expected}")
    root = [n for g in model.units[0].groups for n in g.names]
    if root != ["embed.weight"]:  # the tied head is the embedding: once, in the root unit
        bad.append(f"root unit holds {root}")
    frozen = [g for u in model.units for g in u.groups if not g.requires_grad]
    if [n for g in frozen for n in g.names] != [
        "blocks.0.frozen.weight",
        "blocks.1.frozen.weight",
        "blocks.2.frozen.weight",
    ]:
        bad.append(f"frozen groups: {[g.names for g in frozen]}")
    try:
        dtcore.wrap(build("quirks"), zero=3, units=["nothing.here"])
        bad.append("units matching nothing not refused")
    except dtcore.ConfigError as e:
        if "units=" not in str(e):
            bad.append(f"message: {e}")
    return {"bad": bad}


def evaluation(ctx) -> dict:
    bad: list[str] = []
    base = build("quirks")
    reference = copy.deepcopy(base)
    model = dtcore.wrap(base, zero=3)
    tokens = torch.randint(0, VOCAB, (2, CONTEXT), generator=torch.Generator().manual_seed(3))
    model.eval()
    reference.eval()
    with torch.no_grad():
        for _ in range(2):
            if not close(model(tokens), reference(tokens)):
                bad.append("no_grad forward differs from the unwrapped model")
    if any(p.numel() for p in model.module.parameters()):
        bad.append("parameters left gathered after a no_grad forward")
    model.train()
    reference.train()
    longer = torch.cat([tokens, tokens[:, :1]], 1)
    loss = loss_of(model, longer, VOCAB)
    with torch.no_grad():  # an evaluation between a forward and its backward frees everything it gathered
        model(tokens)
    loss.backward()
    loss_of(reference, longer, VOCAB).backward()
    grads = [g for u in model.units for g in u.groups if g.requires_grad]
    named = dict(reference.named_parameters())
    for g in grads:
        for name, cut in ((g.names[c.param], c) for c in g.cuts):
            theirs = named[name].grad.flatten()[cut.param_offset : cut.param_offset + cut.numel]
            mine = g.grad[cut.shard_offset : cut.shard_offset + cut.numel]
            if ctx.world_size == 1 and not close(mine, theirs):
                bad.append(f"{name}: gradient differs after a no_grad forward between forward and backward")
    if any(p.numel() for p in model.module.parameters()):
        bad.append("parameters left gathered after backward")
    return {"bad": bad}


def state(ctx) -> dict:
    bad: list[str] = []
    base = build("quirks")
    expected = copy.deepcopy(base.state_dict())
    model = dtcore.wrap(base, zero=3)
    compare(bad, model.module.state_dict(), expected, "state_dict after wrap")
    torch.manual_seed(5)
    other = build("quirks")
    for p in other.parameters():
        p.data.normal_()
    model.module.load_state_dict(other.state_dict())
    compare(bad, model.module.state_dict(), other.state_dict(), "state_dict after load")
    # a submodule's own state_dict, inside a unit and in the root unit (tied)
    compare(bad, model.module.blocks[0].mix.state_dict(), other.blocks[0].mix.state_dict(), "blocks.0.mix")
    compare(bad, model.module.head.state_dict(), other.head.state_dict(), "head (tied to embed)")
    # the optimizer's state in torch's format: whole tensors shaped as the parameters, and loaded back
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2)
    tokens = torch.randint(0, VOCAB, (2, CONTEXT + 1), generator=torch.Generator().manual_seed(ctx.rank))
    loss_of(model, tokens, VOCAB).backward()
    opt.step()
    saved = opt.state_dict()
    params = [p for p in model.module.parameters() if p.requires_grad]
    shapes = [tuple(saved["state"][i]["exp_avg"].shape) for i in sorted(saved["state"])]
    if shapes != [tuple(model.shape_of(p)) for p in params]:
        bad.append(f"optimizer state shapes {shapes}")
    again = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2)
    again.load_state_dict(saved)
    back = again.state_dict()
    for i, entry in saved["state"].items():
        for key, value in entry.items():
            if not torch.equal(torch.as_tensor(back["state"][i][key]), torch.as_tensor(value)):
                bad.append(f"optimizer state {i}/{key} changed through load_state_dict")
    return {"bad": bad}


def refusals(ctx) -> dict:
    bad: list[str] = []

    def refused(fn, *words):
        try:
            fn()
        except dtcore.ConfigError as e:
            if not all(w in str(e) for w in words):
                bad.append(f"message lacks {words}: {e}")
            return
        bad.append(f"not refused: {words}")

    refused(lambda: dtcore.wrap(build("quirks"), zero=3, bucket_mb=5), "bucket_mb", "zero=3")
    refused(lambda: dtcore.wrap(build("quirks"), zero=2, units=[Block]), "units", "zero=3")
    refused(lambda: dtcore.wrap(build("quirks"), zero=3, prefetch=-1), "prefetch")
    refused(lambda: dtcore.wrap(build("quirks"), zero=4), "zero=4")
    model = dtcore.wrap(build("quirks"), zero=3)
    refused(lambda: copy.deepcopy(model), "copied")
    refused(lambda: model.register_comm_hook(None, lambda s, b: None), "zero=3")
    return {"bad": bad}


def diverge(ctx) -> dict:
    """Rank 0 runs blocks 0 and 1, the others 0 and 2: as many gathers of alike sizes, which only the
    step's check tells apart (Note [Same units on every rank])."""
    base = build("quirks")
    base.run = [0, 1] if ctx.rank == 0 else [0, 2]
    model = dtcore.wrap(base, zero=3)
    tokens = torch.randint(0, VOCAB, (2, CONTEXT + 1), generator=torch.Generator().manual_seed(3))
    try:
        loss_of(model, tokens, VOCAB).backward()
    except dtcore.ConfigError as e:
        ok = "did not gather the same units" in str(e) and "blocks.1" in str(e) if ctx.rank == 0 else True
        return {"bad": [] if ok else [f"message: {e}"], "raised": True}
    return {"bad": ["no error"], "raised": False}


def unused_error(ctx) -> dict:
    """Rank 1 leaves blocks.1.extra without a gradient, without find_unused_parameters: every rank's backward
    raises (before any step), rank 1's naming the parameters; training then goes on."""
    base = build("quirks")
    model = dtcore.wrap(base, zero=3)
    base.blocks[1].skip = ctx.rank == 1
    tokens = torch.randint(0, VOCAB, (2, CONTEXT + 1), generator=torch.Generator().manual_seed(3))
    bad = []
    try:
        loss_of(model, tokens, VOCAB).backward()
        bad.append("no error in backward")
    except dtcore.ConfigError as e:
        words = ("blocks.1.extra.weight", "find_unused_parameters=True") if ctx.rank == 1 else ("no gradient",)
        if not all(w in str(e) for w in words):
            bad.append(f"message: {e}")
    base.blocks[1].skip = False
    loss_of(model, tokens, VOCAB).backward()  # every parameter used again: no error
    return {"bad": bad}


def main() -> None:
    ctx = dtcore.init(backend="gloo")
    mode = sys.argv[1]
    if mode == "parity":
        out = parity(ctx, sys.argv[2], sys.argv[3:])
    else:
        modes = {
            "bf16": bf16,
            "units": units,
            "compile": compiled,
            "eval": evaluation,
            "state": state,
            "refusals": refusals,
            "diverge": diverge,
        }
        out = {**modes, "unused_error": unused_error}[mode](ctx)
    print(json.dumps({"rank": ctx.rank, **out}), flush=True)
    dtcore.shutdown()


if __name__ == "__main__":
    main()
