"""The real `accelerate launch` CLI: a launch that starts one process although asked for more is
said, by init() on the process it did start."""

import sys

import pytest

from launch_helpers import WORKERS, clean_env, describe, leftover_processes, run_processes

pytestmark = pytest.mark.multirank


def _accelerate_launch(args: list[str], hf_home) -> tuple[dict, str]:
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.accelerate_cli",
        "launch",
        *args,
        str(WORKERS / "init_worker.py"),
        "20",
    ]
    results, sessions = run_processes([cmd], [clean_env(HF_HOME=str(hf_home))], timeout=90)
    assert not leftover_processes(sessions)
    assert results[0].returncode == 0, describe(results)
    return results[0].json(), results[0].stderr


def test_cpu_with_num_processes_starts_one_process_and_init_says_so(tmp_path):
    report, stderr = _accelerate_launch(["--cpu", "--num_processes=2"], tmp_path)
    assert report["rank"] == 0  # one process, rank 0 of 1: what accelerate started
    assert "[W]" in stderr and "accelerate started this process alone" in stderr, stderr
    assert "MASTER_ADDR=127.0.0.1 and MASTER_PORT=29500 are set" in stderr, stderr
    assert "Fix: start N processes with `accelerate launch --multi_gpu --num_processes=N`" in stderr, stderr


def test_a_config_asking_for_more_is_named_and_one_asked_process_is_not_warned_about(tmp_path):
    (tmp_path / "accelerate").mkdir()
    config = tmp_path / "accelerate" / "default_config.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 3\n")
    _, stderr = _accelerate_launch(["--cpu"], tmp_path)
    assert f"its config file {config} asks for num_processes: 3" in stderr, stderr
    assert "--num_processes=3" in stderr, stderr
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: 1\n")
    _, stderr = _accelerate_launch(["--cpu"], tmp_path)
    assert "accelerate started this process alone" not in stderr, stderr
