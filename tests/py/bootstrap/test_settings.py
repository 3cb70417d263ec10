"""Settings and knobs: read once in C++ (init() argument > DTCORE_* > default), each with its
source; docs/knobs.md lists exactly the registry; init() and the checker read the same values."""

import re

import pytest

import dtcore
from dtcore import _C

from launch_helpers import ROOT, clean_env

DOC = ROOT / "docs" / "knobs.md"


def test_docs_table_matches_the_registry():
    rows = []
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `(DTCORE_\w+)` \|\s*`?([^|`]*?)`?\s*\| (.*) \|$", line)
        if m:
            rows.append((m.group(1), m.group(2).strip(), m.group(3).strip()))
    assert rows == [tuple(k) for k in _C.knobs()]


def test_each_setting_knows_its_source():
    s = _C.read_settings({}, {})
    assert (s.timeout_s, s.backend, s.log_level, s.log_ranks, s.log_dir) == (300.0, "auto", "info", "0", "")
    assert s.memory_dir == "/dev/shm" and _C.read_settings({}, {"DTCORE_MEMORY_DIR": "/mnt/t"}).memory_dir == "/mnt/t"
    assert set(s.sources.values()) == {"default"}
    s = _C.read_settings(
        {"timeout": 7, "backend": "auto", "log_dir": None},
        {"DTCORE_TIMEOUT": "9", "DTCORE_BACKEND": "GLOO", "DTCORE_LOG_RANKS": "0, 3"},
    )
    assert (s.timeout_s, s.sources["timeout_s"]) == (7.0, "init(timeout=)")  # the argument beats the variable
    assert (s.backend, s.sources["backend"]) == ("gloo", "DTCORE_BACKEND")  # "auto" defers; one spelling
    assert s.log_ranks == "0,3" and s.console_level(3) == "info" and s.console_level(1) == "warn"


def test_every_bad_value_is_listed_with_its_source_and_fix():
    with pytest.raises(dtcore.ConfigError) as e:
        _C.read_settings(
            {"timeout": -1}, {"DTCORE_LOG_RANKS": "-1", "DTCORE_BACKEND": "yes", "DTCORE_HEARTBEAT_INTERVAL": "0"}
        )
    text = str(e.value)
    assert "init(timeout=-1) is not a positive number of seconds" in text
    assert "DTCORE_LOG_RANKS='-1' is not a list of ranks" in text
    assert "DTCORE_BACKEND='yes' is not a backend" in text
    assert "DTCORE_HEARTBEAT_INTERVAL='0'" in text
    assert text.count("Fix:") == 4
    with pytest.raises(dtcore.ConfigError, match=r"init\(timeout='300'\) must be a number of seconds"):
        _C.read_settings({"timeout": "300"}, {})
    with pytest.raises(dtcore.ConfigError, match=r"init\(backend=True\) must be a string"):
        _C.read_settings({"backend": True}, {})


def _backend_in_checker(**env):
    report = dtcore.check.run(env=clean_env(**env), distributed=False)
    return report.backend, report


def test_backend_is_chosen_once_for_init_and_the_checker(fresh_dtcore, monkeypatch):
    # Upper case means the same to both (it used to mean nccl to init() and auto to the checker).
    monkeypatch.setenv("DTCORE_BACKEND", "GLOO")
    assert dtcore.init(timeout=20).backend == "gloo"
    dtcore.shutdown()
    assert _backend_in_checker(DTCORE_BACKEND="GLOO")[0] == "gloo"
    # A bad value fails both, with the same words.
    monkeypatch.setenv("DTCORE_BACKEND", "foo")
    with pytest.raises(dtcore.ConfigError) as e:
        dtcore.init(timeout=20)
    _, report = _backend_in_checker(DTCORE_BACKEND="foo")
    item = report.item("launch.backend")
    assert item.status == "FAIL" and item.title == "DTCORE_BACKEND"
    assert item.message in str(e.value) and item.fix in str(e.value)


def test_nccl_without_a_gpu_is_named_in_words_init_and_checker_agree(fresh_dtcore, monkeypatch):
    if _C.has_nccl and dtcore.bootstrap.join._cuda_devices() > 0:
        pytest.skip("this machine can run NCCL")
    monkeypatch.setenv("DTCORE_BACKEND", "NCCL")  # upper case: nccl to both (the checker used to read "auto")
    with pytest.raises(dtcore.ConfigError, match="no usable CUDA device") as e:
        dtcore.init(timeout=20)
    _, report = _backend_in_checker(DTCORE_BACKEND="NCCL")
    backend = report.item("launch.backend")
    assert backend.status == "FAIL" and backend.message in str(e.value)
    for item in report.items:  # every item has a name a user recognizes
        assert "derived" not in item.title and "default" not in item.title, item
    assert report.item("gpu.driver").status == "FAIL"


def test_what_ranks_must_agree_on_is_one_vocabulary():
    from dtcore.bootstrap import fingerprint

    spec = _C.read_world(
        {
            "RANK": "0",
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
            "TORCHELASTIC_RUN_ID": "r7",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2",
        }
    )
    keys = {f.key for f in fingerprint.FACTS}
    for backend in ("gloo", "nccl"):
        refused = fingerprint.for_rendezvous(backend, spec, purpose="init")
        assert set(refused) - {"purpose", "backend", "world_size", "job"} <= keys  # the checker's words, too
        assert refused["job"] == "TORCHELASTIC_RUN_ID=r7" and refused["world_size"] == "2"
    assert "torch_nccl" in fingerprint.for_rendezvous("nccl", spec, purpose="init")
    assert "torch_nccl" not in fingerprint.for_rendezvous("gloo", spec, purpose="init")
    assert set(fingerprint.for_rendezvous("gloo", spec, purpose="dtcore.check", versions=False)) == {
        "purpose",
        "backend",
        "world_size",
        "job",
    }
    assert keys <= set(fingerprint.local_facts()) | {"driver", "cuda_driver"}  # each fact is looked up


def test_init_warns_of_an_unknown_dtcore_variable_naming_the_closest(fresh_dtcore, monkeypatch, log_messages):
    messages = log_messages()
    monkeypatch.setenv("DTCORE_TIMEOUTS", "60")  # a typo: ignored, as before, but no longer in silence
    dtcore.init(timeout=20)
    warned = [m for m in messages if "DTCORE_TIMEOUTS" in m]
    assert len(warned) == 1 and "Did you mean DTCORE_TIMEOUT?" in warned[0], messages
