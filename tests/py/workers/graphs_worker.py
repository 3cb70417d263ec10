"""One rank: graphs that vary, dtcore beside torch DDP on the same models and batches.

graphs_worker.py    (2 ranks; prints {case: result} as JSON, a result being what the test checks)

Outputs the loss does not use (dicts, tuples, dataclasses, a Hugging Face ModelOutput), gradients
autograd leaves undefined, static graphs that change, ranks whose graphs differ, and buckets skipped
as unused. Where torch DDP trains, the case runs it on a copy of the same model and compares.
"""

import copy
import dataclasses

import torch
import torch.nn.functional as F
from ddp_semantics_worker import run_cases

import dtcore
from dtcore import DistributedDataParallel as DDP


def grads_match(mine: torch.nn.Module, theirs: torch.nn.Module) -> dict:
    """{name: "none" | "equal" | what differs} over both models' parameters."""
    out = {}
    for (name, a), (_, b) in zip(mine.named_parameters(), theirs.named_parameters(), strict=True):
        if a.grad is None or b.grad is None:
            out[name] = "none" if a.grad is None and b.grad is None else f"None on one side: {a.grad is None}"
        else:
            out[name] = "equal" if torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-6) else "values differ"
    return out


class DictHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Linear(8, 8)
        self.used = torch.nn.Linear(8, 4)
        self.aux = torch.nn.Linear(8, 4)  # an auxiliary head, kept for logging

    def forward(self, x):
        h = torch.relu(self.trunk(x))
        return {"used": self.used(h), "aux": self.aux(h), "step": 3}


class TupleHeads(DictHeads):
    def forward(self, x):
        out = super().forward(x)
        return out["used"], out["aux"]


@dataclasses.dataclass
class Output:
    used: torch.Tensor
    aux: torch.Tensor
    note: str = "kept"


class DataclassHeads(DictHeads):
    def forward(self, x):
        out = super().forward(x)
        return Output(out["used"], out["aux"])


def used_part(out):
    if isinstance(out, dict):
        return out["used"]
    return out[0] if isinstance(out, tuple) else out.used


def unused_outputs(rank: int) -> dict:
    """The loss uses one output; the other head's parameters keep .grad None, as under torch DDP, and
    every other gradient equals torch's. Without find_unused_parameters both raise alike. torch DDP does
    not look inside a dataclass (it raises), so that case is compared with torch on the tuple model of
    the same weights."""
    result = {}
    for kind in (DictHeads, TupleHeads, DataclassHeads):
        torch.manual_seed(0)
        base = kind()
        reference = base if kind is not DataclassHeads else TupleHeads()
        reference.load_state_dict(base.state_dict())
        mine = DDP(copy.deepcopy(base), find_unused_parameters=True)
        theirs = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(reference), find_unused_parameters=True)
        for step in range(3):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * rank + step))
            outputs = [model(x) for model in (mine, theirs)]
            for out in outputs:
                used_part(out).sum().backward()
        kept = {"type": type(outputs[0]).__name__, "extra": outputs[0]["step"] if kind is DictHeads else None}
        result[kind.__name__] = {"grads": grads_match(mine.module, theirs.module), "kept": kept}
        errors = []
        for wrapper in (DDP, torch.nn.parallel.DistributedDataParallel):
            model = wrapper(copy.deepcopy(reference if wrapper is not DDP else base))
            try:
                for _ in range(2):
                    used_part(model(torch.ones(2, 8))).sum().backward()
                errors.append(None)
            except RuntimeError as e:
                errors.append(str(e))
            if wrapper is DDP:
                model._remove_autograd_hooks()  # the next wrapper takes them over cleanly
        result[kind.__name__]["without_find_unused"] = errors
    return result


def hf_model():
    from transformers import GPT2Config, GPT2DoubleHeadsModel

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return GPT2DoubleHeadsModel(config).eval()  # no dropout: both sides compute the same


def hf_batch(rank: int, step: int):
    g = torch.Generator().manual_seed(100 * rank + step)
    ids = torch.randint(0, 64, (2, 2, 8), generator=g)
    return ids, torch.full((2, 2), 7)


def hf_unused_head(rank: int) -> dict:
    """GPT-2 with a multiple-choice head whose output the language-model loss does not use: under
    zero=0 every gradient equals torch DDP's and the head keeps None; under zero=1 and 2, AdamW with
    weight decay leaves the head untouched and trains the rest as torch DDP + AdamW."""
    base = hf_model()
    result = {}
    for zero in (0, 1, 2):
        mine = dtcore.wrap(copy.deepcopy(base), find_unused_parameters=True, zero=zero, bucket_mb=0.01)
        theirs = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), find_unused_parameters=True)
        opts = [
            dtcore.ShardedOptimizer(mine, torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
            if zero
            else torch.optim.AdamW(mine.parameters(), lr=1e-2, weight_decay=0.1),
            torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.1),
        ]
        for step in range(3):
            ids, mc = hf_batch(rank, step)
            for model, opt in zip((mine, theirs), opts):
                opt.zero_grad()
                out = model(input_ids=ids, mc_token_ids=mc, use_cache=False)
                F.cross_entropy(out.logits[..., :-1, :].reshape(-1, 64), ids[..., 1:].reshape(-1)).backward()
                if model is mine:
                    output = type(out).__name__
            if zero == 0:
                result["zero0_grads"] = grads_match(mine.module, theirs.module)
            for opt in opts:
                opt.step()
        head = {n for n, _ in base.named_parameters() if n.startswith("multiple_choice_head")}
        params = {}
        for (name, a), (_, b), (_, c) in zip(
            mine.module.named_parameters(), theirs.module.named_parameters(), base.named_parameters(), strict=True
        ):
            params[name] = {
                "equal_to_torch": torch.allclose(a, b, rtol=1.3e-6, atol=5e-5),
                "changed": not torch.equal(a, c),
            }
        result[f"zero{zero}"] = {"params": params, "head": sorted(head), "output": output}
    return result


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(2, 10, bias=False)
        self.fc2 = torch.nn.Linear(10, 4, bias=False)

    def forward(self, x):
        return F.softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def undefined_grads(rank: int) -> dict:
    """Gradients autograd leaves undefined (torch's UndefinedGrad) stay None, as without a wrapper, in a
    synced backward with find_unused_parameters and in a no_sync one."""
    result = {}
    for how in ("synced", "no_sync"):
        torch.manual_seed(0)
        local = Net()
        model = DDP(copy.deepcopy(local), find_unused_parameters=True)
        x = torch.ones(1, 2)
        if how == "synced":
            torch._C._functions.UndefinedGrad()(model(x).sum()).backward()
        else:
            with model.no_sync():
                torch._C._functions.UndefinedGrad()(model(x).sum()).backward()
        torch._C._functions.UndefinedGrad()(local(x).sum()).backward()
        result[how] = {
            "dtcore": [p.grad is None for p in model.module.parameters()],
            "local": [p.grad is None for p in local.parameters()],
        }
    return result


class ControlFlow(torch.nn.Module):
    """lin2 takes part only for an input of ones (torch's ControlFlowToyModel)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = torch.nn.Linear(10, 10, bias=False)
        self.lin2 = torch.nn.Linear(10, 10, bias=False)

    def forward(self, x):
        h = F.relu(self.lin1(x))
        return self.lin2(h) if torch.equal(x, torch.ones_like(x)) else h


def static_graph_changes(rank: int) -> dict:
    """static_graph=True and a graph that changes: a parameter unused in the first step that gets a
    gradient raises inside the backward, naming it (and torch's logging data records it); one used in the
    first step that gets none is reported by the next forward with torch's words, naming it. After the
    report, training goes on."""
    random, ones = torch.randn(20, 10, generator=torch.Generator().manual_seed(0)), torch.ones(20, 10)
    result = {}
    torch.manual_seed(0)
    model = DDP(ControlFlow(), static_graph=True)
    model(random).sum().backward()  # lin2 unused: recorded
    try:
        model(ones).sum().backward()
        result["now_used"] = None
    except RuntimeError as e:
        result["now_used"] = str(e)
    result["logged"] = model._get_ddp_logging_data().get("error", "")
    try:
        model(random)
        result["next_forward"] = None
    except RuntimeError as e:
        result["next_forward"] = str(e)
    model(random).sum().backward()  # drained: the recorded graph trains again
    result["trains_after"] = model.module.lin1.weight.grad is not None

    torch.manual_seed(0)
    model = DDP(ControlFlow(), static_graph=True)
    model(ones).sum().backward()  # lin2 used: recorded
    model(random).sum().backward()  # lin2 gets nothing: the reduction cannot finish
    try:
        model(ones)
        result["now_unused"] = None
    except RuntimeError as e:
        result["now_unused"] = str(e)
    return result


class PerRank(torch.nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.lin1 = torch.nn.Linear(10, 10, bias=False)
        self.lin2 = torch.nn.Linear(10, 10, bias=False)
        self.rank = rank

    def forward(self, x):
        h = F.relu(self.lin1(x))
        return self.lin2(h) if self.rank == 0 else h


def different_graphs(rank: int) -> dict:
    """Rank 0 uses lin2, rank 1 does not, in every step: with find_unused_parameters the buckets keep their
    first plan (torch's has_rebuilt_buckets 0), with static_graph they are rebuilt (1); both average as
    torch DDP does."""
    result = {}
    for option in ("find_unused_parameters", "static_graph"):
        torch.manual_seed(31415)
        base = PerRank(rank)
        mine = DDP(copy.deepcopy(base), **{option: True})
        theirs = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), **{option: True})
        x = torch.randn(20, 10, generator=torch.Generator().manual_seed(rank))
        for _ in range(4):
            for model in (mine, theirs):
                model(x).sum().backward()
        result[option] = {
            "grads": grads_match(mine.module, theirs.module),
            "rebuilt": [m._get_ddp_logging_data().get("has_rebuilt_buckets", 0) for m in (mine, theirs)],
        }
    return result


class LargeNet(torch.nn.Module):
    """fc2 is used only when forward is told so (torch's test has it never used)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(100, 5000, bias=False)
        self.fc2 = torch.nn.Linear(100, 100, bias=False)

    def forward(self, x, use_fc2=False):
        y = self.fc1(x)
        return y + self.fc2(x).sum() if use_fc2 else y


def skipped_buckets(rank: int) -> dict:
    """skip_all_reduce_unused_params: the bucket of a parameter no rank used is not reduced (torch's
    num_buckets_reduced 1 of 2), and when one rank uses it after all, it is reduced late: the gradients
    still equal torch DDP's without skipping, with no hang."""
    torch.manual_seed(31415)
    base = LargeNet()
    skip = DDP(copy.deepcopy(base), find_unused_parameters=True, bucket_cap_mb=1.5, skip_all_reduce_unused_params=True)
    plain = DDP(copy.deepcopy(base), find_unused_parameters=True, bucket_cap_mb=1.5)
    theirs = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), find_unused_parameters=True)
    reduced, grads = [], []
    for step in range(5):
        x = torch.randn(20, 100, generator=torch.Generator().manual_seed(10 * rank + step))
        use_fc2 = step == 3 and rank == 1  # one rank, once
        for model in (skip, plain, theirs):
            model.zero_grad()
            model(x, use_fc2=use_fc2).sum().backward()
        reduced.append([m._reducer.last_buckets_reduced for m in (skip, plain)])
        grads.append([grads_match(m.module, theirs.module) for m in (skip, plain)])
    for _ in range(2):  # the logging data of the last step is recorded at the next forward
        skip(torch.zeros(20, 100)).sum().backward()
    try:
        DDP(torch.nn.Linear(2, 2), skip_all_reduce_unused_params=True)
        refused = None
    except dtcore.ConfigError as e:
        refused = str(e)
    return {
        "buckets": len(skip.bucket_params),
        "reduced": reduced,
        "grads": grads,
        "logged": skip._get_ddp_logging_data().get("num_buckets_reduced"),
        "refused": refused,
    }


def in_place_outputs(rank: int) -> dict:
    """As torch DDP's default (_set_ddp_sink_clone(True)), an output may be changed in place before the loss."""
    model = DDP(DictHeads(), find_unused_parameters=True)
    out = model(torch.ones(2, 8))
    out["used"].mul_(2)
    out["used"].sum().backward()
    return {"grad": model.module.used.bias.grad.tolist()}


CASES = [
    unused_outputs,
    hf_unused_head,
    undefined_grads,
    static_graph_changes,
    different_graphs,
    skipped_buckets,
    in_place_outputs,
]


if __name__ == "__main__":
    run_cases(CASES)
