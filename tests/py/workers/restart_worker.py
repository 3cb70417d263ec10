"""dtcore.Trainer on the tiny GPT, with a failure injected when a rank draws the batch of a given step.

    restart_worker.py RUN_DIR MODE RANK STEPS [ATTEMPTS]

MODE is what rank RANK does when it draws the batch of a step of STEPS, in the launcher's attempts
listed by ATTEMPTS (restart counts, comma-separated; default 0, the first start only): STEPS is one
step for all of them, or one per attempt (comma-separated, in the order of ATTEMPTS):
    none     nothing (the reference run)
    kill     SIGKILL itself (a fault: the kernel's OOM killer, a lost node)
    killnode SIGKILL its launcher, then every rank of its launcher, itself last (a whole node lost)
    stop     SIGSTOP itself (a hang: the others' collective times out)
    raise    raise ValueError (a bug when it repeats at the same step)
Checkpoints every step (synchronously, so that a kill never races a save); with WORKER_MEMORY_EVERY=N, in
memory every N steps instead (checkpoint.memory_every) and on disk only at the end; WORKER_ZERO=K trains
at zero=K. The losses are in RUN_DIR's metrics files.
"""

import os
import signal
import sys

import dtcore
from dtcore.train import TrainConfig
from dtcore.train.demo import data
from dtcore.train.demo.gpt import GPT, GPTConfig

STEPS = 8


class Failing:
    """The trainer's data (a TokenData), failing as the command line says when the batch of `step` is drawn."""

    def __init__(self, batches: data.TokenData, mode: str, step: int) -> None:
        self.batches, self.mode, self.step = batches, mode, step

    def __iter__(self):
        for batch in self.batches:
            drawn = self.batches.epoch * self.batches.batches_per_epoch + self.batches.taken  # one batch a step
            if drawn == self.step:
                if self.mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif self.mode == "killnode":
                    kill_node()
                elif self.mode == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                elif self.mode == "raise":
                    raise ValueError(f"injected at step {self.step}")
            yield batch

    def state_dict(self) -> dict:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.batches.load_state_dict(state)


def kill_node() -> None:
    """The launcher first (else it would start its ranks again), then its ranks (each in a session of its own)."""
    launcher = os.getppid()
    ranks = []
    for stat in os.listdir("/proc"):
        try:
            with open(f"/proc/{stat}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == launcher:
                    ranks.append(int(stat))
        except (OSError, ValueError, IndexError):
            continue
    os.kill(launcher, signal.SIGKILL)
    for pid in sorted(ranks, key=lambda pid: pid == os.getpid()):
        os.kill(pid, signal.SIGKILL)


def main() -> None:
    run_dir, mode, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    attempts = [int(a) for a in (sys.argv[5] if len(sys.argv) > 5 else "0").split(",")]
    steps = [int(s) for s in sys.argv[4].split(",")]
    steps = steps * len(attempts) if len(steps) == 1 else steps
    ctx = dtcore.init(seed=0)
    config = TrainConfig()
    config.training.num_iterations = STEPS
    config.training.device_batch_size = 4
    config.training.eval_every = 0
    config.checkpoint.memory_every = int(os.environ.get("WORKER_MEMORY_EVERY", "0"))
    config.parallel.zero = int(os.environ.get("WORKER_ZERO", "0"))
    config.checkpoint.every = 0 if config.checkpoint.memory_every else 1
    config.checkpoint.async_save = False
    config.logging.run_dir = run_dir
    config.logging.progress = False
    config.logging.plot = False
    _, train, _ = data.build(config.data, 32, 4, ctx.rank, ctx.world_size, seed=0)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if ctx.rank == rank and restart in attempts and mode != "none":
        train = Failing(train, mode, steps[attempts.index(restart)])
    model = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32))
    dtcore.Trainer(model, None, train, config).fit()
    dtcore.shutdown()


if __name__ == "__main__":
    main()
