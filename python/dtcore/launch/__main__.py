"""python -m dtcore.launch: preflight, then the ranks through torch's elastic agent, with a log per
node and the root cause of a failure. Exit status: 0 when every rank succeeded, 1 when the job
failed (or a preflight check did), 2 for bad usage, 128+N when the launcher was stopped by signal N.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import time
from collections.abc import Sequence

from .run import DEFAULT_LOG_DIR, DEFAULT_TIMEOUT

DEFAULT_PORT = 29500  # torch's, for multi-node jobs whose nodes must agree on one in advance


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dtcore.launch",
        usage="python -m dtcore.launch [OPTIONS] (-m MODULE | SCRIPT) [ARGS...]",
        description="Checks this node, then starts the ranks of a training job through torch's elastic agent "
        "(as torchrun does), on one node or several. Each node's output is also written to "
        "LOG_DIR/<name>_<timestamp>_node<k>.log; when the job fails, the first failing rank's host and Python "
        "traceback are printed, with the diagnosis of known failures and the fix.",
        epilog="Examples: `python -m dtcore.launch -m dtcore.train --preset tiny` (one node, all its GPUs, or 1 "
        "process on CPU); `python -m dtcore.launch --nnodes 2 --master-addr node0 -m dtcore.train` on node 0, which "
        "prints the command for node 1; `python -m dtcore.launch --slurm --nnodes 2 --nproc-per-node 8 -m "
        "dtcore.train` writes an sbatch script. Exit status: 0 success, 1 the job or a check failed, 2 bad usage. "
        "Guide: docs/launch.md; failures: docs/troubleshooting.md.",
    )
    p.add_argument(
        "--nproc-per-node",
        type=int,
        metavar="N",
        help="ranks on each node (default: the GPUs visible here, or 1 without GPUs)",
    )
    p.add_argument(
        "--nnodes",
        type=_nodes,
        default=1,
        metavar="N",
        help="number of nodes (default: 1); torchrun's elastic MIN:MAX is refused: a job runs on exactly N nodes",
    )
    p.add_argument("--node-rank", type=int, default=0, metavar="K", help="this node's index, 0 .. N-1 (default: 0)")
    p.add_argument(
        "--master-addr",
        metavar="HOST",
        help="node 0's host name or address, reachable from every node (required on nodes other than 0; "
        "default on node 0: this host's name; on one node: 127.0.0.1)",
    )
    p.add_argument(
        "--master-port",
        type=int,
        metavar="PORT",
        help=f"node 0's rendezvous port, the same on every node (default: a free port on one node, "
        f"{DEFAULT_PORT} on several)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=f"seconds to wait for every node to join before naming the missing ones (default: {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="restart every rank up to N times after a failure (torchrun's flag); dtcore.train and dtcore.Trainer "
        "then resume from their newest checkpoint by themselves, and a failure that repeats exactly (the same "
        "exception at the same place in the same step: a bug) ends the job at once. On several nodes every node "
        "restarts its ranks together, and the N restarts are the job's, not each node's; a node lost with its "
        "ranks comes back by running its command again (within --timeout: the other nodes wait for it, naming "
        "it); node 0, which serves the rendezvous store, cannot be lost. Default 0, as torchrun: a failure ends "
        "the job with its root cause, since a program that does not save checkpoints would start over on each "
        "restart (docs/launch.md)",
    )
    p.add_argument("--log-dir", default=DEFAULT_LOG_DIR, metavar="DIR", help="where the node logs go (default: ./logs)")
    p.add_argument("--name", help="the job's name in log and script names (default: the module or script name)")
    p.add_argument(
        "--no-preflight",
        dest="preflight",
        action="store_false",
        help="skip the preflight checks (python -m dtcore.check's probes of this node), e.g. to rehearse several "
        "nodes on one host over loopback",
    )
    slurm = p.add_argument_group("SLURM (docs/launch.md)")
    slurm.add_argument(
        "--slurm",
        action="store_true",
        help="instead of launching, write an sbatch script for --nnodes nodes with --nproc-per-node GPUs each",
    )
    slurm.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="OPTION",
        help="an extra #SBATCH option for the script, e.g. --sbatch partition=gpu --sbatch time=04:00:00 (repeatable)",
    )
    slurm.add_argument("--script", metavar="FILE", help="where to write the sbatch script (default: <name>.sbatch)")
    slurm.add_argument("--submit", action="store_true", help="also submit it with sbatch (when sbatch exists)")
    slurm.add_argument(
        "--from-slurm",
        action="store_true",
        help="take --nnodes, --node-rank, --master-addr and --master-port from the SLURM job step this runs in "
        "(one task per node), as dtcore.init() reads SLURM; the script --slurm writes runs it under srun",
    )
    p.add_argument("-m", dest="module", action="store_true", help="PROGRAM is a module, run as python -m does")
    p.add_argument("program", metavar="MODULE | SCRIPT", help="what every rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="its arguments, passed through")
    return p


def _python() -> str:
    """How to name this interpreter in a printed command: `python3` when that is what PATH finds."""
    name = os.path.basename(sys.executable)
    found = shutil.which(name)
    return name if found and os.path.realpath(found) == os.path.realpath(sys.executable) else sys.executable


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _nodes(text: str) -> int:
    """--nnodes: N, or torchrun's MIN:MAX when MIN == MAX; an elastic range is refused, saying why."""
    low, sep, high = text.partition(":")
    try:
        low_n, high_n = int(low), int(high if sep else low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of nodes (N, e.g. 2)") from None
    if low_n != high_n:
        raise argparse.ArgumentTypeError(
            f"'{text}': an elastic range of nodes (torchrun's MIN:MAX) is not supported: dtcore.launch runs a job on "
            f"exactly N nodes, and a restart starts the ranks of the same nodes (continuing on fewer would change the "
            f"world size under every rank's feet). Fix: --nnodes {high_n}"
        )
    return low_n


def _validate(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.nnodes < 1:
        p.error(f"--nnodes {a.nnodes}: need at least 1 node")
    if not 0 <= a.node_rank < a.nnodes:
        p.error(f"--node-rank {a.node_rank}: need 0 .. {a.nnodes - 1} for --nnodes {a.nnodes}")
    if a.nproc_per_node is not None and a.nproc_per_node < 1:
        p.error(f"--nproc-per-node {a.nproc_per_node}: need at least 1 process per node")
    if a.master_port is not None and not 1 <= a.master_port <= 65535:
        p.error(f"--master-port {a.master_port}: need a TCP port, 1 .. 65535")
    if not a.timeout > 0:
        p.error(f"--timeout {a.timeout}: need a positive number of seconds")
    if a.max_restarts < 0:
        p.error(f"--max-restarts {a.max_restarts}: need 0 (no restart) or more")
    if a.node_rank > 0 and not a.master_addr and not a.slurm:
        p.error(f"--node-rank {a.node_rank} needs --master-addr: node 0's host, as node 0 printed it")
    if a.slurm and a.from_slurm:
        p.error("--slurm writes the script that runs --from-slurm: use one or the other")
    if a.submit and not a.slurm:
        p.error("--submit goes with --slurm (it submits the script --slurm writes)")


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    if a.from_slurm:
        from .slurm import from_slurm

        from_slurm(p, a)
    _validate(p, a)
    program = (["-m"] if a.module else []) + [a.program, *a.args]
    name = a.name or (a.program if a.module else os.path.splitext(os.path.basename(a.program))[0])
    if a.slurm:
        from .slurm import write

        return write(a, program, name, _python())

    nproc = a.nproc_per_node or _gpu_count() or 1
    master_addr = a.master_addr or ("127.0.0.1" if a.nnodes == 1 else socket.getfqdn())
    master_port = a.master_port or (_free_port() if a.nnodes == 1 else DEFAULT_PORT)
    stamp = time.strftime("%Y%m%d_%H%M%S")
    log_path = os.path.join(a.log_dir, f"{name}_{stamp}_node{a.node_rank}.log")

    from .tee import NodeLog

    log = NodeLog(log_path)
    try:
        from .run import Job

        job = Job(a, program, nproc, master_addr, master_port, log_path, _python())
        return job.run()
    except KeyboardInterrupt:  # Ctrl-C before the ranks started (once they run, the agent stops them: 130 too)
        print("dtcore.launch: interrupted before the ranks started", file=sys.stderr, flush=True)
        return 130
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
