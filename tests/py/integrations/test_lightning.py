"""Lightning's Trainer with DtcoreStrategy: the same losses as Lightning's DDPStrategy, step for step, at
zero=0, 2 (gradient accumulation and clipping; manual optimization) and 3, and the same validation loss
after each fit; a resumed fit gives the uninterrupted run's losses,
at 2 ranks and, resharded, at 1; Lightning's own launcher (devices=2) starts the ranks; what the strategy
cannot honour is refused with the fix: hyperparameters a checkpoint would not give back as they are (before
the first step), and hooks that edit checkpoint["state_dict"] of a dtcore checkpoint."""

import argparse
import os
from collections import OrderedDict

import lightning
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos import BoringModel
from lightning.pytorch.demos.boring_classes import BoringDataModule
from lightning.pytorch.plugins.precision import MixedPrecision, Precision

import dtcore
from dtcore.integrations.lightning import DtcoreStrategy

from launch_helpers import (
    clean_env,
    describe,
    free_port,
    leftover_processes,
    max_relative,
    run_ranks,
    slurm_style,
    torchrun_style,
)

FP32 = 1e-6  # relative: what two fp32 sums of the same numbers in another order may differ by


@pytest.mark.multirank
def test_losses_match_ddp_and_a_resumed_fit_matches_the_uninterrupted_one(tmp_path):
    port = free_port()
    # torchrun's variables as its agent sets them (TORCHELASTIC_RUN_ID: Lightning's TorchElasticEnvironment)
    envs = [
        clean_env(**torchrun_style(r, 2, port), GROUP_RANK="0", TORCHELASTIC_RUN_ID="lightning-test") for r in range(2)
    ]
    results, sessions = run_ranks("lightning_worker.py", envs, args=("compare", str(tmp_path)), timeout=150)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert leftover_processes(sessions) == []
    ranks = [r.json() for r in results]
    for rank, got in enumerate(ranks):
        assert got["rank"] == rank and got["launcher"] == "torchrun"
        assert set(got["environments"]) == {"TorchElasticEnvironment"}
        assert len(got["zero0"]) == 20 and max_relative(got["zero0"], got["ddp"]) <= FP32, rank
        assert len(got["zero2_acc"]) == 40 and max_relative(got["zero2_acc"], got["ddp_acc"]) <= FP32, rank
        assert max_relative(got["zero3"], got["ddp"]) <= FP32, rank
        assert max_relative(got["zero2_manual"], got["ddp_manual"]) <= FP32, rank  # manual optimization
        ddp_val, zero0_val, ddp_acc_val, zero2_val, zero3_val = got["validated"]  # trainer.validate after fit
        assert max_relative([zero0_val, zero3_val, zero2_val], [ddp_val, ddp_val, ddp_acc_val]) <= FP32, rank
        assert len(got["full"]) == 10 and max_relative(got["resumed"], got["full"][5:]) <= FP32, rank
        assert got["checkpoint_is_dir"]
        assert max_relative(got["ddp_resumed"], got["ddp_full"][5:]) <= FP32, rank
        ddp_logged, dtcore_logged = got["logged"]
        assert abs(dtcore_logged - ddp_logged) <= FP32 * abs(ddp_logged) and got["gathered"] == [[[0.0, 1.0], 3.0]] * 2
    assert ranks[0]["ddp"] != ranks[1]["ddp"]  # each rank its own shard of the data

    # The 2-rank zero=1 checkpoint at 1 rank and zero=2 (SLURM's variables): the whole batch there is both
    # ranks' batches, so its loss is their average.
    (one,) = run_job_env("lightning_worker.py", [clean_env(**slurm_style(0, 1, free_port()))], "resume", tmp_path)
    assert set(one["environments"]) == {"SLURMEnvironment"} and one["launcher"] == "slurm" and one["saved_after_fit"]
    averaged = [(a + b) / 2 for a, b in zip(ranks[0]["full"][5:], ranks[1]["full"][5:])]
    assert max_relative(one["resumed"], averaged) <= FP32
    # Lightning's precision plugins: as under DDP (bf16-true: ZeRO steps fp32 masters where DDP steps bf16; fp64
    # is stepped in fp64, without a master that would round it)
    for precision, tolerance in (("bf16-mixed", FP32), ("bf16-true", 2e-2), ("64-true", 1e-12)):
        assert max_relative(one[f"zero2 {precision}"], one[f"ddp {precision}"]) <= tolerance, precision


def run_job_env(worker: str, envs: list[dict[str, str]], *args: object) -> list[dict]:
    results, sessions = run_ranks(worker, envs, args=tuple(str(a) for a in args), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert leftover_processes(sessions) == []
    return [r.json() for r in results]


@pytest.mark.multirank
def test_lightnings_own_launcher_starts_the_second_rank():
    # One process with no launcher's variables: Trainer(devices=2) re-runs the script for local rank 1.
    (got,) = run_job_env("lightning_worker.py", [clean_env()], "launcher")
    assert got["environments"] == ["LightningEnvironment", "LightningEnvironment"] and got["launcher"] == "env"
    for rank in (0, 1):
        assert len(got["zero0"][rank]) == 5 and max_relative(got["zero0"][rank], got["ddp"][rank]) <= FP32, rank
    assert got["zero0"][0] != got["zero0"][1]


def test_refusals_name_the_value_and_the_fix():
    with pytest.raises(dtcore.ConfigError, match=r"zero=4\) is not a ZeRO stage. Fix: zero=0"):
        DtcoreStrategy(zero=4)

    class Custom(Precision):
        pass

    with pytest.raises(dtcore.ConfigError, match="precision plugin Custom. Fix: Trainer\\(precision=...\\)"):
        DtcoreStrategy(precision_plugin=Custom())
    scaled = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(dtcore.ConfigError, match="zero=1\\): its GradScaler .* Fix: precision='bf16-mixed'"):
        DtcoreStrategy(zero=1, precision_plugin=scaled)
    DtcoreStrategy(zero=0, precision_plugin=scaled)  # whole gradients: the scaler is right

    from lightning.fabric.plugins import CheckpointIO

    class Remote(CheckpointIO):
        def save_checkpoint(self, *args, **kwargs): ...
        def load_checkpoint(self, *args, **kwargs): ...
        def remove_checkpoint(self, *args, **kwargs): ...

    with pytest.raises(dtcore.ConfigError, match="CheckpointIO plugin Remote would be ignored. Fix:"):
        DtcoreStrategy().checkpoint_io = Remote()

    # zero>=2: the plugin clips by norm over the shards; by value there is nothing to clip
    plugin = DtcoreStrategy(zero=2, precision_plugin=Precision()).precision_plugin
    assert isinstance(plugin, Precision) and type(plugin).__qualname__ == "Precision"
    with pytest.raises(dtcore.ConfigError, match="gradient_clip_algorithm='value' .* Fix: gradient_clip_algorithm"):
        plugin.clip_grad_by_value(None, 1.0)


def test_devices_that_do_not_match_the_launcher_are_refused_before_any_rendezvous(monkeypatch):
    from lightning.fabric.plugins.environments import TorchElasticEnvironment
    from lightning.pytorch.accelerators import CPUAccelerator

    # torchrun --nnodes 2 --nproc-per-node 1, second node, under Trainer(devices=2, num_nodes=1)
    for name, value in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="0", GROUP_RANK="1").items():
        monkeypatch.setenv(name, value)
    cpu = torch.device("cpu")
    strategy = DtcoreStrategy(
        accelerator=CPUAccelerator(), parallel_devices=[cpu, cpu], cluster_environment=TorchElasticEnvironment()
    )
    with pytest.raises(dtcore.ConfigError, match=r"rank 1 of 2, local rank 0 on node 1, but Trainer\(devices=2"):
        strategy.setup_environment()
    assert not dtcore.is_initialized()


@pytest.fixture
def one_rank(fresh_dtcore, tmp_path):
    """trainer(**args): a 1-rank CPU Trainer with DtcoreStrategy, in this process (whose environment, which
    Lightning's launcher sets, is restored afterwards)."""
    saved = dict(os.environ)

    def trainer(strategy=None, **args):
        defaults = dict(max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0)
        return lightning.Trainer(
            strategy=strategy or DtcoreStrategy(),
            accelerator="cpu",
            devices=1,
            default_root_dir=tmp_path,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            **(defaults | args),
        )

    yield trainer
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.filterwarnings("ignore")  # Lightning's own (few workers, torch's pytree deprecation)
def test_a_context_the_script_made_first_is_kept_and_predict_at_zero3_is_refused(one_rank):
    ctx = dtcore.init(timeout=30)  # alone: a store on a free port, where Lightning would pick another
    trainer = one_rank(DtcoreStrategy(zero=1), max_steps=2)
    trainer.fit(BoringModel())
    # zero=3's forward is a collective, and predict gives the ranks different numbers of batches: refused
    sharded = one_rank(DtcoreStrategy(zero=3), max_steps=2)
    sharded.fit(BoringModel())
    with pytest.raises(dtcore.ConfigError, match=r"trainer.predict with DtcoreStrategy\(zero=3\).* Fix:"):
        sharded.predict(sharded.lightning_module)
    assert dtcore.get_context() is ctx and trainer.global_step == 2


def test_the_strategy_names_are_registered():
    for name, zero in (("dtcore", 0), ("dtcore_zero1", 1), ("dtcore_zero2", 2), ("dtcore_zero3", 3)):
        trainer = lightning.Trainer(strategy=name, accelerator="cpu", devices=1, logger=False)
        assert isinstance(trainer.strategy, DtcoreStrategy) and trainer.strategy.zero == zero


class WithHparams(BoringModel):
    """save_hyperparameters() of its arguments, as scripts do; counts its training steps."""

    def __init__(self, args, root=None, options=None):
        super().__init__()
        self.save_hyperparameters()
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return super().training_step(batch, batch_idx)


class PathData(BoringDataModule):
    def __init__(self, root):
        super().__init__()
        self.save_hyperparameters()


@pytest.mark.filterwarnings("ignore")  # Lightning's own (few workers, no validation loop)
def test_hyperparameters_a_checkpoint_cannot_give_back_are_refused_before_the_first_step(one_rank, tmp_path):
    args = argparse.Namespace(lr=0.1, layers=[4, 8])  # what argparse scripts pass to their module
    fix = r"Fix: save_hyperparameters\(ignore=\['root'\]\) to leave it out"
    model = WithHparams(args, root=tmp_path)
    with pytest.raises(dtcore.CheckpointError, match=r"WithHparams.hparams\['root'\] is a pathlib.PosixPath, .*" + fix):
        one_rank().fit(model)  # the default ModelCheckpoint would save at the epoch's end
    assert model.steps == 0
    with pytest.raises(dtcore.CheckpointError, match=r"\['options'\]\['o'\] is a collections.OrderedDict, which"):
        one_rank().fit(WithHparams(args, options={"o": OrderedDict(a=1)}))  # it would come back as a dict
    with pytest.raises(dtcore.CheckpointError, match=r"PathData.hparams\['root'\] is a pathlib.PosixPath"):
        one_rank().fit(WithHparams(args), datamodule=PathData(tmp_path))  # Lightning saves the datamodule's too

    # No checkpointing: not refused; a save asked for all the same gets the same error
    trainer, model = one_rank(enable_checkpointing=False), WithHparams(args, root=tmp_path)
    trainer.fit(model)
    assert model.steps == 2
    with pytest.raises(dtcore.CheckpointError, match=r"WithHparams.hparams\['root'\] is a pathlib.PosixPath"):
        trainer.save_checkpoint(tmp_path / "asked.ckpt")

    # A Namespace comes back as a Namespace (a tuple as a tuple): the module builds again from what was saved
    saver = ModelCheckpoint(dirpath=tmp_path / "saved", filename="last")
    one_rank(callbacks=[saver]).fit(WithHparams(args, options={"sizes": (4, 8)}))
    path = tmp_path / "saved" / "last.ckpt"
    hparams = dtcore.load_checkpoint(path, model=BoringModel())["extra"]["hyper_parameters"]
    assert type(hparams["args"]) is argparse.Namespace and hparams["args"] == args
    rebuilt = WithHparams(**hparams)  # as load_from_checkpoint builds it
    assert rebuilt.hparams.options == {"sizes": (4, 8)}
    one_rank(max_epochs=2).fit(rebuilt, ckpt_path=path)
    assert rebuilt.steps == 2  # the second epoch only


class Noted(BoringModel):
    """Keeps a note of its own in each checkpoint; records what its hooks see; `rename` edits the loaded weights."""

    def __init__(self, rename=False):
        super().__init__()
        self.rename, self.saved_keys, self.loaded = rename, None, None

    def on_save_checkpoint(self, checkpoint):
        self.saved_keys = sorted(checkpoint["state_dict"])
        checkpoint["note"] = {"scale": torch.full((3,), 2.0), "count": 3}

    def on_load_checkpoint(self, checkpoint):
        self.loaded = (checkpoint["note"], sorted(checkpoint["state_dict"]))
        if self.rename:  # as a hook that maps an older model's names would
            checkpoint["state_dict"]["renamed.weight"] = checkpoint["state_dict"].pop("layer.weight")


class DropBias(Callback):
    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        del checkpoint["state_dict"]["layer.bias"]  # as a hook that leaves frozen weights out would


class ZeroBiasOnLoad(BoringModel):
    def on_load_checkpoint(self, checkpoint):
        checkpoint["state_dict"]["layer.bias"] = torch.zeros(2)


@pytest.mark.filterwarnings("ignore")  # Lightning's own (few workers, no validation loop)
def test_hooks_keep_their_own_keys_and_an_edit_of_the_state_dict_is_refused_or_honoured(one_rank, tmp_path):
    keys = ["layer.bias", "layer.weight"]
    for zero in (1, 3):  # zero=3: the hooks see meta tensors (each rank holds shards), under the same keys
        model, folder = Noted(), tmp_path / f"zero{zero}"
        one_rank(DtcoreStrategy(zero=zero), callbacks=[ModelCheckpoint(dirpath=folder, filename="last")]).fit(model)
        assert model.saved_keys == keys and (folder / "last.ckpt" / "manifest.json").is_file()
        resumed = Noted()
        one_rank(DtcoreStrategy(zero=zero), max_epochs=2).fit(resumed, ckpt_path=folder / "last.ckpt")
        note, loaded_keys = resumed.loaded
        assert note["count"] == 3 and torch.equal(note["scale"], torch.full((3,), 2.0)) and loaded_keys == keys
        saver = ModelCheckpoint(dirpath=folder / "dropped")
        with pytest.raises(
            dtcore.CheckpointError,
            match=r"DropBias.on_save_checkpoint changed checkpoint\['state_dict'\] \(removed or renamed: 'layer.bias'\)"
            r".* Fix: leave checkpoint\['state_dict'\] as it is",
        ):
            one_rank(DtcoreStrategy(zero=zero), callbacks=[DropBias(), saver]).fit(BoringModel())
    with pytest.raises(
        dtcore.CheckpointError,
        match=r"Noted.on_load_checkpoint changed checkpoint\['state_dict'\] \(removed or renamed: 'layer.weight'; "
        r"added: 'renamed.weight'\) of the dtcore checkpoint .* Fix:",
    ):
        one_rank(max_epochs=2).fit(Noted(rename=True), ckpt_path=tmp_path / "zero1" / "last.ckpt")

    # A Lightning checkpoint file loads after the hook, as under DDPStrategy: its edit is honoured
    plain = one_rank("auto", callbacks=[ModelCheckpoint(dirpath=tmp_path / "file", filename="last")])
    plain.fit(BoringModel())
    model = ZeroBiasOnLoad()
    one_rank().validate(model, ckpt_path=tmp_path / "file" / "last.ckpt", verbose=False)
    assert torch.equal(model.layer.bias, torch.zeros(2))
    assert torch.equal(model.layer.weight, plain.lightning_module.layer.weight)
