"""The resource checker: each probe under simulated conditions, the JSON schema, exit codes,
init(preflight=True), and the distributed mode with 2 and 4 real ranks on loopback."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import socket
import subprocess
import sys

import pytest

import dtcore
import dtcore.check
from dtcore.check import Options, Report

from launch_helpers import (
    WORKERS,
    clean_env,
    describe,
    free_port,
    leftover_processes,
    run_processes,
    run_ranks,
    slurm_style,
    torchrun_style,
)

ITEM_KEYS = {"id", "group", "title", "status", "value", "message", "fix"}
TOP_KEYS = {
    "schema",
    "mode",
    "status",
    "counts",
    "host",
    "elapsed_s",
    "world",
    "backend",
    "facts",
    "gpus",
    "items",
    "ranks",
    "nodes",
    "bandwidth",
}


def check(**env: str) -> Report:
    return dtcore.check.run(env=clean_env(**env), distributed=False)


def cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dtcore.check", *args],
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_schema(doc: dict) -> None:
    assert set(doc) == TOP_KEYS
    assert doc["schema"] == "dtcore.check/1"
    assert doc["status"] in ("PASS", "WARN", "FAIL")
    assert doc["counts"] == {s: sum(i["status"] == s for i in doc["items"]) for s in ("PASS", "WARN", "FAIL")}
    ids = [i["id"] for i in doc["items"]]
    assert len(ids) == len(set(ids)), "item ids are unique"
    for item in doc["items"]:
        assert set(item) == ITEM_KEYS
        assert item["group"] == item["id"].split(".")[0]
        assert item["status"] in ("PASS", "WARN", "FAIL")
        if item["status"] != "PASS":
            assert item["message"] and item["fix"], item


def test_clean_single_node_passes_with_every_group_and_the_json_schema():
    out = cli("--json")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert_schema(doc)
    assert doc["mode"] == "local" and doc["status"] != "FAIL"
    assert {i["group"] for i in doc["items"]} == {"version", "gpu", "launch", "network", "host", "env"}
    assert Report.from_dict(doc).to_dict() == doc  # the document round-trips


def test_the_command_does_not_import_torchs_python_on_a_cpu_build():
    # Note [The checker without torch's Python]: torch's libraries are loaded, its modules are not.
    import torch

    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dtcore.check", "--json"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    imported = {line.rpartition("|")[2].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "dtcore.check" in imported
    if torch.version.cuda is None:
        assert not {m for m in imported if m == "torch" or m.startswith("torch.")}
    facts = json.loads(out.stdout)["facts"]  # read from torch's files, the same as torch says
    assert (facts["torch"], facts["torch_cuda"]) == (torch.__version__, torch.version.cuda or "")
    assert facts["torch_cxx11_abi"] == torch._C._GLIBCXX_USE_CXX11_ABI


def test_table_is_grouped_with_status_value_and_fix():
    report = check(GLOO_SOCKET_IFNAME="nonexistent0")
    text = report.format(width=100)
    assert text.splitlines()[0] == "versions"
    line = next(x for x in text.splitlines() if "GLOO_SOCKET_IFNAME" in x)
    assert line.split()[:3] == ["FAIL", "GLOO_SOCKET_IFNAME", "nonexistent0"]
    assert "fix: set GLOO_SOCKET_IFNAME to interfaces that exist" in " ".join(text.split())
    assert text.splitlines()[-1].startswith("dtcore.check: FAIL - ")


def test_no_gpu_is_reported_not_failed():
    item = check().item("gpu.driver")
    assert item.status == "PASS" and "no GPU" in item.message
    failing = check(DTCORE_BACKEND="nccl").item("gpu.driver")
    assert failing.status == "FAIL" and "DTCORE_BACKEND=gloo" in failing.fix


def test_cuda_visible_devices_without_a_driver_warns():
    item = check(CUDA_VISIBLE_DEVICES="3").item("gpu.visible")
    assert item.status == "WARN" and "no NVIDIA driver" in item.message


def test_port_held_by_another_socket_fails_naming_the_process():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        item = check(MASTER_PORT=str(port)).item("network.port")
    assert item.status == "FAIL", item
    assert f"pid {os.getpid()}" in item.message and str(port) in item.value
    assert "MASTER_PORT" in item.fix and "is free now" in item.fix


def test_missing_interface_name_fails():
    report = check(NCCL_SOCKET_IFNAME="=nonexistent0", GLOO_SOCKET_IFNAME="lo")
    assert report.item("network.nccl_socket_ifname").status == "FAIL"
    assert report.item("network.gloo_socket_ifname").status == "PASS"


def test_torchrun_environment_with_contradictions():
    env = dict(torchrun_style(0, 3, free_port()), TORCHELASTIC_RUN_ID="x", LOCAL_WORLD_SIZE="2", GROUP_WORLD_SIZE="2")
    report = check(**env)
    item = report.item("launch.world_size")
    assert item.status == "FAIL" and "2 x" in item.message and "--nproc_per_node" in item.fix
    assert report.item("launch.launcher").value == "torchrun"


def test_slurm_allocation_smaller_than_the_torchrun_job():
    env = dict(
        torchrun_style(0, 4, free_port()),
        TORCHELASTIC_RUN_ID="x",
        LOCAL_WORLD_SIZE="2",
        GROUP_WORLD_SIZE="2",
        SLURM_JOB_ID="99",
        SLURM_JOB_NUM_NODES="1",
    )
    item = check(**env).item("launch.slurm_nodes")
    assert item.status == "FAIL" and "sbatch -N 2" in item.fix


@pytest.mark.parametrize(
    "variable,value,expected",
    [
        ("SLURM_PROCID", "", "SLURM_PROCID='' is set but empty (launcher: slurm)"),
        ("MASTER_PORT", "", "MASTER_PORT='' is set but empty (launcher: slurm)"),
        ("SLURM_JOB_ID", "-1", "SLURM_JOB_ID='-1' is not a SLURM job id"),
    ],
)
def test_a_launcher_variable_that_is_present_must_be_valid(variable, value, expected):
    """The checker reads the environment as init() does: SLURM_PROCID='' is SLURM, and wrong."""
    report = check(**dict(slurm_style(0, 2, free_port()), **{variable: value}))
    item = report.item("launch.env")
    assert item.status == "FAIL", item
    assert expected in item.message, item
    assert variable in item.fix, item
    assert "launch.launcher" not in {i.id for i in report.items}  # not judged as a single process


def test_more_slurm_nodes_than_the_node_list_names():
    """init()'s validation, item by item: SLURM_NNODES=3 where the node list names one host."""
    nodes = check(**dict(slurm_style(0, 2, free_port()), SLURM_NNODES="3")).item("launch.num_nodes")
    assert nodes.status == "FAIL", nodes
    assert "SLURM_NNODES=3" in nodes.message and "SLURM_JOB_NODELIST='localhost'" in nodes.message, nodes
    assert "srun -N 1" in nodes.fix, nodes


def test_accelerate_config_for_gpus_on_a_machine_without(tmp_path):
    config = tmp_path / "default_config.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 8\nnum_machines: 1\n"
    )
    report = dtcore.check.run(
        env=clean_env(HF_HOME=str(tmp_path.parent)), accelerate_config=str(config), distributed=False
    )
    item = report.item("launch.accelerate")  # runs on Gloo through torchrun; a plain Accelerator() needs cpu=True
    assert item.status == "WARN" and "MULTI_GPU on a machine without a usable GPU" in item.message
    assert "Accelerator(cpu=True)" in item.fix
    assert cli("--accelerate-config", str(tmp_path / "missing.yaml")).returncode == 2


def test_stand_in_shm_path_that_is_missing():
    report = dtcore.check.run(env=clean_env(), shm_path="/nonexistent/shm", distributed=False)
    assert report.item("host.shm").status == "WARN"  # CPU job: NCCL does not need it here


def test_environment_traps():
    report = check(USE_LIBUV="0", NCCL_IB_DISABLE="1", TORCHELASTIC_USE_AGENT_STORE="True")
    assert report.item("env.use_libuv").status == "WARN"
    assert report.item("env.nccl_ib_disable").status == "WARN"
    # Outside torchrun dtcore ignores it (init() serves its own store): a warning, as init() agrees.
    assert report.item("env.agent_store").status == "WARN"


def test_an_unknown_dtcore_variable_is_named_with_the_closest_setting():
    assert check().item("env.dtcore_unknown").status == "PASS"
    item = check(DTCORE_TIMEOUTS="60").item("env.dtcore_unknown")
    assert (item.status, item.value) == ("WARN", "DTCORE_TIMEOUTS")
    assert "Did you mean DTCORE_TIMEOUT?" in item.message, item.message


def test_disk_of_the_checkpoint_and_log_directories(tmp_path):
    report = dtcore.check.run(
        env=clean_env(),
        checkpoint_dir=str(tmp_path / "ckpt"),
        log_dir=str(tmp_path),
        min_free_disk_gb=1e9,
        distributed=False,
    )
    assert report.item("host.disk.checkpoint").status == "WARN"  # under the (absurd) threshold
    assert str(tmp_path) in report.item("host.disk.log").value


def test_exit_codes_and_help():
    assert cli(env=clean_env(GLOO_SOCKET_IFNAME="nonexistent0")).returncode == 1
    assert cli("--sizes", "0B:1MiB").returncode == 2
    assert cli("--no-such-option").returncode == 2
    out = cli("--help")
    assert out.returncode == 0
    for option in (
        "--json",
        "--checkpoint-dir",
        "--log-dir",
        "--min-free-gb",
        "--shm-path",
        "--accelerate-config",
        "--distributed",
        "--local",
        "--backend",
        "--timeout",
        "--no-bandwidth",
        "--sizes",
        "--factor",
        "--iters",
        "Exit status",
    ):
        assert option in out.stdout, option


def test_run_takes_the_options_fields_and_names_a_misspelt_one():
    assert list(inspect.signature(dtcore.check.run).parameters) == [f.name for f in dataclasses.fields(Options)]
    with pytest.raises(dtcore.ConfigError, match=r"'min_free_gb' \(did you mean 'min_free_disk_gb'\?\)"):
        dtcore.check.run(min_free_gb=5)


def test_the_checker_judges_the_timeout_knob_as_init_does_and_waits_on_its_own():
    for value, words in (("abc", "is not a positive number of seconds"), ("1e10", "longer than dtcore can wait")):
        report = check(DTCORE_TIMEOUT=value)  # the checker's own wait (timeout=) does not hide the knob
        item = report.item("launch.timeout")
        assert item.status == "FAIL" and item.title == "DTCORE_TIMEOUT" and words in item.message, item
    assert "launch.timeout" not in {i.id for i in dtcore.check.run(env=clean_env(), distributed=False, timeout=5).items}
    with pytest.raises(dtcore.ConfigError, match=r"run\(timeout=-1\)"):
        dtcore.check.run(timeout=-1)


def test_config_errors_are_value_errors_too():
    with pytest.raises(ValueError, match="'12XB' is not a size"):
        dtcore.check.parse_size("12XB")  # as before: callers catching ValueError keep working
    assert issubclass(dtcore.ConfigError, ValueError) and issubclass(dtcore.ConfigError, dtcore.DtcoreError)


def test_sizes_parse_as_everywhere_in_dtcore():
    assert dtcore.check.parse_size is dtcore.units.parse_bytes  # one parser
    assert dtcore.check.parse_size("64MiB") == 64 << 20 and dtcore.check.parse_size("8") == 8
    assert dtcore.check.parse_size("1MB") == 10**6  # SI, as everywhere
    assert dtcore.check.size_range(8, 64) == [8, 16, 32, 64]
    assert dtcore.check.DEFAULT_SIZES[0] == 8 and dtcore.check.DEFAULT_SIZES[-1] == 64 << 20
    with pytest.raises(dtcore.ConfigError, match="'12XB' is not a size"):
        dtcore.check.parse_size("12XB")
    out = cli("--sizes", "8B:64M")  # a bare M: powers of 1000 or 1024? refused, not guessed
    assert out.returncode == 2 and "ambiguous" in out.stderr


def test_a_dtcore_built_for_another_torch_is_a_fail_with_the_rebuild_command(tmp_path):
    # sitecustomize runs before `-m dtcore.check`: the process now runs "another" torch.
    (tmp_path / "sitecustomize.py").write_text("import torch\ntorch.__version__ = '9.9.9+fake'\n")
    env = clean_env(PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    out = cli("--json", env=env)
    assert out.returncode == 1, out.stderr
    item = next(i for i in json.loads(out.stdout)["items"] if i["id"] == "version.dtcore")
    assert item["status"] == "FAIL" and "9.9.9+fake" in item["message"]
    assert "pip install --no-build-isolation" in item["fix"]
    # Anything else that imports dtcore is still refused at import.
    code = subprocess.run([sys.executable, "-c", "import dtcore"], env=env, capture_output=True, text=True, timeout=60)
    assert code.returncode != 0 and "ImportError" in code.stderr


def test_init_preflight_raises_the_failures_with_their_fixes(fresh_dtcore, monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nonexistent0")
    with pytest.raises(dtcore.ConfigError, match=r"(?s)preflight.*GLOO_SOCKET_IFNAME.*Fix: set GLOO_SOCKET_IFNAME"):
        dtcore.init(preflight=True, timeout=20)
    assert not dtcore.is_initialized()
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    ctx = dtcore.init(preflight=True, timeout=20)
    assert ctx.world_size == 1


@pytest.mark.multirank
def test_distributed_mode_under_torchrun_reports_bandwidth():
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "dtcore.check",
        "--json",
        "--sizes",
        "8B:1MiB",
        "--factor",
        "8",
        "--timeout",
        "30",
    ]
    results, sessions = run_processes([cmd], [clean_env()], timeout=120)
    r = results[0]
    assert r.returncode == 0, describe(results)
    doc = json.loads(r.stdout)  # only rank 0 prints
    assert_schema(doc)
    assert doc["mode"] == "distributed" and [x["rank"] for x in doc["ranks"]] == [0, 1]
    assert doc["world"]["world_size"] == 2 and len(doc["nodes"]) == 1
    bw = doc["bandwidth"]
    assert [x["bytes"] for x in bw["results"]] == [8, 64, 512, 4096, 32768, 262144]
    for x in bw["results"]:
        assert x["busbw_gbps"] == pytest.approx(x["algbw_gbps"] * 2 * (2 - 1) / 2)
        assert x["algbw_gbps"] == pytest.approx(x["bytes"] / (x["time_us"] * 1e-6) / 1e9)
    assert [(x["src"], x["dst"], x["kind"]) for x in bw["links"]] == [(0, 1, "intra-node")]
    ids = {i["id"]: i["status"] for i in doc["items"]}
    assert ids["consistency.torch"] == "PASS" and ids["bandwidth.allreduce"] == "PASS"
    assert leftover_processes(sessions) == []


@pytest.mark.multirank
def test_distributed_mode_with_four_ranks_names_a_version_mismatch():
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 4, port)) for rank in range(4)]
    envs[1]["CHECK_FAKE_TORCH"] = "2.12.0+cpu"
    results, sessions = run_ranks(
        "check_worker.py", envs, ("--json", "--sizes", "8B:4KiB", "--factor", "16", "--timeout", "30"), timeout=120
    )
    assert [r.returncode for r in results] == [1, 1, 1, 1], describe(results)  # every rank exits with the verdict
    doc = json.loads(results[0].stdout)
    assert all(r.stdout == "" for r in results[1:]), "only rank 0 prints"
    items = {i["id"]: i for i in doc["items"]}
    torch_item = items["consistency.torch"]
    assert torch_item["status"] == "FAIL"
    assert "rank(s) 1 (" in torch_item["message"] and "'2.12.0+cpu'" in torch_item["message"]
    assert "other 3 rank(s)" in torch_item["message"] and "pip install torch==" in torch_item["fix"]
    assert items["consistency.built_torch"]["status"] == "FAIL"
    assert items["consistency.dtcore"]["status"] == "PASS"
    assert items["version.dtcore"]["status"] == "PASS"  # each rank's own build matches its own torch
    assert [x["rank"] for x in doc["ranks"]] == [0, 1, 2, 3]
    assert doc["bandwidth"]["world_size"] == 4
    assert sorted((x["src"], x["dst"]) for x in doc["bandwidth"]["links"]) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert leftover_processes(sessions) == []


@pytest.mark.multirank
def test_distributed_mode_names_the_rank_that_never_joins():
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 3, port)) for rank in range(2)]  # rank 2 never comes
    results, sessions = run_ranks("check_worker.py", envs, ("--json", "--timeout", "5"), timeout=60)
    assert [r.returncode for r in results] == [1, 1], describe(results)
    doc = json.loads(results[0].stdout)
    join = next(i for i in doc["items"] if i["id"] == "distributed.join")
    assert join["status"] == "FAIL" and "missing rank 2" in join["message"], join
    assert "rank 1 (" in results[1].stderr and "missing rank 2" in results[1].stderr  # rank 1 says so too
    assert leftover_processes(sessions) == []


@pytest.mark.multirank
def test_a_rank_whose_rank_zero_never_comes_still_reports():
    port = free_port()
    envs = [clean_env(**torchrun_style(1, 2, port))]  # only rank 1: nobody serves the store
    results, sessions = run_ranks("check_worker.py", envs, ("--timeout", "3"), timeout=60)
    assert results[0].returncode == 1, describe(results)
    assert "FAIL  joining the job" in results[0].stderr and "rank 1 (" in results[0].stderr, describe(results)
    assert leftover_processes(sessions) == []


@pytest.mark.multirank
@pytest.mark.parametrize("torch_distributed", ["1", "0"])
def test_the_checker_inside_a_running_job_leaves_its_context_alone(tmp_path, torch_distributed):
    # With torch_distributed=False the job has no torch default group: the sweep runs, the link test is skipped.
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(WORKERS / "check_in_job_worker.py"),
        str(tmp_path),
        torch_distributed,
    ]
    results, sessions = run_processes([cmd], [clean_env()], timeout=120)
    assert results[0].returncode == 0, describe(results)
    lines = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [j["rank"] for j in lines] == [0, 1], describe(results)
    for j in lines:
        assert j["mode"] == "distributed" and j["status"] != "FAIL", j
        assert j["initialized"] and j["same_context"], j
        assert j["sum"] == [2.0, 2.0], j
    assert leftover_processes(sessions) == []


def test_the_checker_in_a_running_job_refuses_another_backend_or_timeout_instead_of_ignoring_it(fresh_dtcore):
    ctx = dtcore.init(timeout=20)
    report = dtcore.check.run(distributed=True, backend="nccl", bandwidth=False)
    item = report.item("distributed.join")
    assert item.status == "FAIL" and "uses 'gloo'" in item.message and "backend='auto'" in item.fix
    item = dtcore.check.run(distributed=True, timeout=5, bandwidth=False).item("distributed.join")
    assert item.status == "FAIL" and "wait 20 s" in item.message and "timeout=None" in item.fix
    assert dtcore.check.run(distributed=True, timeout=20, bandwidth=False).item("distributed.join").status == "PASS"
    assert dtcore.get_context() is ctx  # still running
    assert dtcore.check.run(distributed=True, bandwidth=False).item("distributed.join").status == "PASS"
    assert dtcore.get_context() is ctx


def test_agent_store_variable_outside_torchrun_init_and_checker_agree(fresh_dtcore, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "1")
    assert dtcore.init(timeout=20).world_size == 1  # init() serves its own store and runs
    dtcore.shutdown()
    out = cli("--json", env=clean_env(TORCHELASTIC_USE_AGENT_STORE="1"))
    item = next(i for i in json.loads(out.stdout)["items"] if i["id"] == "env.agent_store")
    assert out.returncode == 0 and item["status"] == "WARN" and "dtcore ignores it" in item["message"], out.stdout


def test_preflight_judges_init_arguments_not_made_up_variables(fresh_dtcore, tmp_path):
    # init()'s own arguments reach the probes as arguments (no DTCORE_* variable is made up for them).
    with pytest.raises(dtcore.ConfigError, match=r"(?s)init\(preflight=True\).*disk: log directory.*/proc/dtcore"):
        dtcore.init(preflight=True, timeout=20, log_dir="/proc/dtcore-logs")
    report = dtcore.check.run(
        env=clean_env(), distributed=False, overrides={"rank": 0, "world_size": 1, "local_rank": 3}
    )
    item = report.item("launch.local_rank")
    assert item.status == "FAIL" and item.title == "init(local_rank=)" and "init(local_rank=)=3" in item.message
    # The log directory is the settings' (DTCORE_LOG_DIR or init(log_dir=)), judged by one reader.
    report = dtcore.check.run(env=clean_env(DTCORE_LOG_DIR=str(tmp_path)), distributed=False)
    assert str(tmp_path) in report.item("host.disk.log").value
    report = dtcore.check.run(env=clean_env(), log_dir=str(tmp_path), distributed=False)
    assert str(tmp_path) in report.item("host.disk.log").value


def test_link_rounds_measure_each_ring_pair_alone():
    from dtcore.check._distributed import ring_rounds

    assert ring_rounds(2) == [[(0, 1)]]
    assert ring_rounds(4) == [[(0, 1), (2, 3)], [(1, 2), (3, 0)]]
    assert ring_rounds(5) == [[(0, 1), (2, 3)], [(1, 2), (3, 4)], [(4, 0)]]
    for n in range(2, 10):
        rounds = ring_rounds(n)
        for pairs in rounds:
            ranks = [r for pair in pairs for r in pair]
            assert len(ranks) == len(set(ranks)), (n, pairs)  # no rank in two pairs of a round
        covered = {frozenset(p) for pairs in rounds for p in pairs}
        assert covered == {frozenset((r, (r + 1) % n)) for r in range(n)}


def test_preflight_ignores_what_init_does_not_use(fresh_dtcore, monkeypatch, tmp_path):
    # A stale accelerate config of another machine, and torchrun's default port taken by someone.
    (tmp_path / "accelerate").mkdir()
    (tmp_path / "accelerate" / "default_config.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 8\n")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", 29500))
            s.listen()
        except OSError:
            pass  # taken already, which is the case under test too
        assert dtcore.init(preflight=True, timeout=20).world_size == 1
    report = check()
    assert report.item("network.port").status in ("PASS", "WARN")  # a warning for the next launch, at most
