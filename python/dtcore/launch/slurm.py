"""SLURM: the sbatch script `python -m dtcore.launch --slurm` writes, and `--from-slurm`, which the
script's srun line runs on every node.

The script asks SLURM for N nodes with one task each and G GPUs per node, and srun starts one
`python -m dtcore.launch --from-slurm` per node. --from-slurm reads the job step the way
dtcore.init() reads SLURM (csrc/dtcore/bootstrap/launcher.cpp, through _C.read_world): this node's
index from SLURM_PROCID/SLURM_NODEID, the number of nodes from SLURM_NNODES, the master host as
the first host of SLURM_JOB_NODELIST (e.g. gpu01 of gpu[01-04]) and the port from MASTER_PORT or
derived from SLURM_JOB_ID. Each node's launcher then starts its G ranks through torch's agent, with
the roll call, the node logs and the root cause of a failure, exactly as on any other cluster.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time

from .. import _C
from ..exit_codes import EXIT_PREEMPTED

# Seconds before the time limit that SLURM signals the job (sbatch --signal=USR1@<s>): enough for a checkpoint
# of a large model to reach a shared file system (dtcore.train's preemption save takes well under a second
# to leave the state in host memory; the write is what takes time).
PREEMPT_NOTICE_S = 120
SUBMIT_TIMEOUT_S = 60.0  # sbatch answers in a second; a controller that does not answer is named, not waited for


def from_slurm(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Fills --nnodes, --node-rank, --master-addr and --master-port from the SLURM step this runs in."""
    try:
        spec = _C.read_world(dict(os.environ), {})
    except _C.ConfigError as e:
        p.error(f"--from-slurm: {e}")
    if spec.launcher != "slurm":
        p.error(
            f"--from-slurm reads a SLURM job step, but this process was started by '{spec.launcher}' "
            "(SLURM_PROCID is not set). Fix: run it under srun, as the script `--slurm` writes does."
        )
    if spec.local_world_size != 1:
        p.error(
            f"--from-slurm needs one task per node (it starts the ranks itself), but this step has "
            f"{spec.local_world_size} on node {spec.node_rank} ({spec.sources.get('local_world_size', '')}). "
            "Fix: srun --ntasks-per-node=1."
        )
    a.nnodes, a.node_rank = spec.num_nodes, spec.node_rank
    a.master_addr, a.master_port = spec.master_addr, spec.master_port


def script(a: argparse.Namespace, program: list[str], name: str, python: str) -> str:
    """The sbatch script's text for this command line."""
    gpus = a.nproc_per_node
    log_dir = a.log_dir
    options = [
        ("job-name", name),
        ("nodes", str(a.nnodes)),
        ("ntasks-per-node", "1"),
    ]
    if gpus:
        options.append(("gpus-per-node", str(gpus)))
    options.append(("output", os.path.join(log_dir, f"{name}_%j.out")))
    given = set()
    for extra in a.sbatch:
        key, sep, value = extra.partition("=")
        options.append((key.lstrip("-"), value) if sep else (extra.lstrip("-"), ""))
        given.add(options[-1][0])
    # Before the time limit SLURM sends SIGUSR1 to the job step: each node's launcher passes it to its ranks,
    # dtcore.train saves a checkpoint and the job step ends with EXIT_PREEMPTED, on which the script requeues
    # the job; the requeued job (SLURM_RESTART_COUNT > 0) resumes from that checkpoint by itself.
    if "signal" not in given:
        options.append(("signal", f"USR1@{PREEMPT_NOTICE_S}"))
    if "requeue" not in given and "no-requeue" not in given:
        options.append(("requeue", ""))
        if "open-mode" not in given:  # a requeued job appends to its output, where the first run's failure is
            options.append(("open-mode", "append"))
    launch = [python, "-m", "dtcore.launch", "--from-slurm"]
    if gpus:
        launch += ["--nproc-per-node", str(gpus)]
    launch += ["--timeout", f"{a.timeout:g}", "--log-dir", log_dir, "--name", name]
    if a.max_restarts:
        launch += ["--max-restarts", str(a.max_restarts)]
    if not a.preflight:
        launch.append("--no-preflight")
    lines = [
        "#!/bin/bash",
        f"# {name}: {a.nnodes} node(s) x {gpus or 'all'} GPU(s), written by python -m dtcore.launch --slurm on "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}.",
        "# Submit: sbatch THIS_FILE (the --output directory must exist then). Guide: dtcore's docs/launch.md.",
        *(f"#SBATCH --{key}={value}" if value else f"#SBATCH --{key}" for key, value in options),
        "set -euo pipefail",
        f"mkdir -p {shlex.quote(log_dir)}",
        "",
        "# One task per node: each runs dtcore's launcher, which starts this node's ranks through torch's elastic",
        "# agent. --from-slurm reads SLURM as dtcore.init() does: node index (SLURM_PROCID, SLURM_NODEID), nodes",
        "# (SLURM_NNODES), master = first host of SLURM_JOB_NODELIST, port = MASTER_PORT if set, else derived from",
        "# SLURM_JOB_ID (15000 + id % 15000). A failed rank stops every node, and each prints the root cause.",
        "status=0",
        "srun --ntasks-per-node=1 \\",
        f"  {shlex.join(launch)} \\",
        f"  {shlex.join(program)} || status=$?",
        f'if [ "$status" -eq {EXIT_PREEMPTED} ]; then  # every rank saved a checkpoint after SIGUSR1',
        '  echo "preempted before the time limit: requeueing job $SLURM_JOB_ID, which resumes from its checkpoint"',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)


def write(a: argparse.Namespace, program: list[str], name: str, python: str) -> int:
    """--slurm: writes the script (and submits it with --submit); returns the exit status."""
    path = a.script or f"{name}.sbatch"
    text = script(a, program, name, python)
    os.makedirs(a.log_dir, exist_ok=True)  # SLURM opens --output before the script's mkdir runs
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o755)
    print(f"dtcore.launch: wrote {path} ({a.nnodes} node(s) x {a.nproc_per_node or 'all'} GPU(s)):\n{text}")
    if not a.submit:
        print(f"dtcore.launch: submit it with: sbatch {shlex.quote(path)}")
        return 0
    if shutil.which("sbatch") is None:
        print(
            f"dtcore.launch: --submit: sbatch is not on PATH here. Fix: run `sbatch {shlex.quote(path)}` on a "
            "SLURM login node.",
            file=sys.stderr,
        )
        return 1
    try:
        return subprocess.run(["sbatch", path], check=False, timeout=SUBMIT_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        print(
            f"dtcore.launch: --submit: sbatch {path} did not answer within {SUBMIT_TIMEOUT_S:g} s (is the SLURM "
            f"controller reachable? `sinfo` tells). Fix: once it is, submit the script with `sbatch "
            f"{shlex.quote(path)}`, and check `squeue --me` first that the slow try did not submit it already.",
            file=sys.stderr,
        )
        return 1
