"""One rank: gradients after optimizer.zero_grad(set_to_none=True), torch's default, against torch DDP.

lent_views_worker.py    (2 ranks; prints {case: result} as JSON, a result being what the test checks)

See Note [Lent bucket views] (csrc/dtcore/reducer/reducer.h): autograd accumulates straight into
the bucket views, so the tensor autograd writes is the bucket's, step after step, with torch DDP's
values; a parameter no rank uses keeps None.
"""

import copy

import torch
from ddp_semantics_worker import run_cases

import dtcore


class Net(torch.nn.Module):
    """`body` and `head` always take part, `spare` on rank 1 only, `never` on no rank."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 4)
        self.spare = torch.nn.Linear(8, 4)
        self.never = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, use_spare: bool) -> torch.Tensor:
        out = self.head(torch.relu(self.body(x)))
        return out + self.spare(x) if use_spare else out


def batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(100 * step + rank))


def storage(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.untyped_storage().data_ptr()


def in_shared_buffer(t: torch.Tensor) -> bool:
    """Whether t's memory is one of the communicator's shared buffers (Note [Buckets in shared memory])."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/dev/shm/dtcore-" in line and "-buffer-" in line:
                lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
                if lo <= t.data_ptr() < hi:
                    return True
    return False


def set_to_none_steps(rank: int) -> dict:
    """Three steps of zero_grad(set_to_none=True), forward, backward, AdamW step (the third with two
    micro-batches, the first inside no_sync()); per step and parameter: what autograd accumulated
    into (seen by a post-accumulate hook) against the .grad after backward, and the gradients
    against torch DDP's."""
    torch.manual_seed(0)
    base = Net()
    ours = dtcore.wrap(copy.deepcopy(base), find_unused_parameters=True, bucket_mb=1e-4, first_bucket_mb=1e-4)
    ref = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), find_unused_parameters=True)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1) for m in (ours, ref)]
    accumulated_into: dict[str, list[int | None]] = {}
    for name, p in ours.module.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: accumulated_into[name].append(storage(p.grad)))
    use_spare = rank == 1
    steps = []
    for step in range(3):
        accumulated_into.clear()
        accumulated_into.update({name: [] for name, _ in ours.module.named_parameters()})
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        for model in (ours, ref):
            if step == 2:
                with model.no_sync():
                    model(batch(rank, 10 + step), use_spare).sum().backward()
            model(batch(rank, step), use_spare).sum().backward()
        grads = {name: p.grad for name, p in ours.module.named_parameters()}
        expected = {name: p.grad for name, p in ref.module.named_parameters()}
        steps.append(
            {
                "none": sorted(name for name, g in grads.items() if g is None),
                "ddp_none": sorted(name for name, g in expected.items() if g is None),
                "equal": {
                    name: g is not None and torch.allclose(g, expected[name], atol=1e-6) for name, g in grads.items()
                },
                "accumulated_into_grad": {
                    name: [s == storage(grads[name]) for s in seen] for name, seen in accumulated_into.items()
                },
                "storages": {name: storage(g) for name, g in grads.items() if g is not None},
                "shared": sorted({in_shared_buffer(g) for g in grads.values() if g is not None}),
            }
        )
        for opt in opts:
            opt.step()
    return {"steps": steps, "bucket_params": ours.bucket_params}


CASES = [set_to_none_steps]


def main() -> None:
    run_cases(CASES)


if __name__ == "__main__":
    main()
