"""fw says once, at set-up, in one short line with a pointer to the docs (docs/lightning.md), where
it deliberately differs from Lightning and the run relies on it without having chosen, and says
nothing when the run does not or states its choice, as fw's own recipes do."""

from __future__ import annotations

import logging
import re

import forked
import pytest
import torch
from distributed.helpers import REPO, clean_env
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.rank_zero import library_logger
from framework.trainer import lightning_differences as differences


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(differences, "_said", set())


class OwnLoaders(LinearModel):
    def train_dataloader(self):
        return loader(regression_data(16))

    def on_fit_start(self):
        pass


class Plateau(LinearModel):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
                                                   "monitor": "val/loss"}}


class Said(logging.Handler):
    """The 'differs from Lightning' lines fw's logger has emitted while installed."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        if "differs from Lightning" in record.getMessage():
            self.lines.append(record.getMessage())

    def __call__(self) -> list[str]:
        return self.lines


@pytest.fixture
def said():
    handler = Said()
    library_logger().addHandler(handler)
    yield handler
    library_logger().removeHandler(handler)


def test_each_difference_is_said_once_when_the_run_relies_on_it(tmp_path, said):
    data = loader(regression_data(16))
    for _ in range(2):  # once per process
        fw.Trainer(max_epochs=1, **QUIET).fit(OwnLoaders())
    assert len(said()) == 1 and "loaders are asked for once at set-up" in said()[0]
    assert said()[0].endswith(f"; see {differences.DOCS}") and len(said()[0]) <= 170, said()[0]

    trainer = fw.Trainer(max_epochs=1, default_root_dir=str(tmp_path), **{**QUIET, "enable_checkpointing": True})
    trainer.fit(Plateau(), data, data)
    assert "ReduceLROnPlateau steps before" in said()[-1]

    ckpt = str(tmp_path / "x.ckpt")
    trainer.save_checkpoint(ckpt)

    class Loading(Plateau):  # the same optimizer and scheduler as the checkpoint
        def on_load_checkpoint(self, checkpoint):
            pass

    fw.Trainer(max_epochs=2, **QUIET).fit(Loading(), data, data, ckpt_path=ckpt)
    assert "restored" in said()[-1] and len(said()) == 3


def test_the_pointer_is_a_page_of_the_clone_with_that_heading():
    """``DOCS`` opens from a clone: a Markdown file of the repository and one of its headings
    (the anchor as GitHub and the docs site make it: lower case, punctuation dropped, spaces to hyphens)."""
    page, anchor = differences.DOCS.split("#")
    headings = [line.lstrip("#").strip() for line in (REPO / page).read_text().splitlines() if line.startswith("#")]
    assert anchor in [re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings], headings


def test_last_checkpoint_difference_is_said_with_a_monitor_and_save_last(tmp_path, said):
    data = loader(regression_data(16))
    checkpoint = ModelCheckpoint(monitor="val/loss", save_last=True)
    fw.Trainer(max_epochs=1, default_root_dir=str(tmp_path), callbacks=[checkpoint],
               **{**QUIET, "enable_checkpointing": True}).fit(LinearModel(), data, data)
    assert len(said()) == 1 and "last.ckpt is the latest save point" in said()[0]
    assert "ModelCheckpoint(save_last='latest') chooses fw's" in said()[0]


def test_save_last_latest_is_the_same_last_checkpoint_said_nothing_of(tmp_path, said):
    data = loader(regression_data(16))
    saved = {}
    for save_last in (True, "latest"):
        checkpoint = ModelCheckpoint(monitor="val/loss", save_last=save_last, dirpath=str(tmp_path / str(save_last)))
        fw.seed_everything(0)
        fw.Trainer(max_epochs=3, default_root_dir=str(tmp_path), callbacks=[checkpoint],
                   **{**QUIET, "enable_checkpointing": True}).fit(LinearModel(), data, data)
        saved[save_last] = torch.load(checkpoint.last_model_path, weights_only=True)
    assert len(said()) == 1  # True's, not 'latest''s
    assert saved[True]["global_step"] == saved["latest"]["global_step"] == 6
    for name, weight in saved[True]["state_dict"].items():
        assert torch.equal(weight, saved["latest"]["state_dict"][name])


def test_a_save_last_fw_has_no_meaning_for_is_refused():
    from framework.errors import ConfigError

    with pytest.raises(ConfigError, match=r"save_last='newest'\) must be True, False, 'link' or 'latest'"):
        ModelCheckpoint(save_last="newest")


def test_fp16_autocast_on_the_cpu_is_said_and_bf16_is_not(said):
    data = loader(regression_data(16))
    for precision in ("16-mixed", "bf16-mixed"):
        fw.Trainer(max_epochs=1, precision=precision, **QUIET).fit(LinearModel(), data)
    assert len(said()) == 1 and "precision=16-mixed on the CPU is float16 autocast" in said()[0]


def test_nothing_is_said_when_the_run_does_not_rely_on_a_difference(said, tmp_path):
    data = loader(regression_data(16))
    fw.Trainer(max_epochs=1, callbacks=[ModelCheckpoint()], **{**QUIET, "enable_checkpointing": True},
               default_root_dir=str(tmp_path)).fit(LinearModel(), data, data)
    assert said() == []


def test_the_one_order_is_said_for_a_shuffled_loader_in_one_process_unless_its_own_is_kept(said):
    shuffled = loader(regression_data(16), 8, shuffle=True)
    fw.Trainer(max_epochs=1, use_distributed_sampler=False, **QUIET).fit(LinearModel(), shuffled)
    assert said() == []  # the loader's own order, as Lightning's
    fw.Trainer(max_epochs=1, use_distributed_sampler=True, **QUIET).fit(LinearModel(), shuffled)
    assert said() == []  # fw's one order, chosen
    fw.Trainer(max_epochs=1, **QUIET).fit(LinearModel(), shuffled)
    assert len(said()) == 1 and "a shuffled training loader reads one order for any number of ranks" in said()[0]
    assert "Trainer(use_distributed_sampler=False) keeps the loader's (Lightning's), =True chooses fw's" in said()[0]


def test_the_one_order_is_the_same_whether_chosen_or_not():
    """``use_distributed_sampler=True`` only states the default's choice: the same batches."""
    def batches(**given):
        seen = []

        class Recording(LinearModel):
            def training_step(self, batch, batch_idx):
                seen.append(batch[0].clone())
                return super().training_step(batch, batch_idx)

        fw.seed_everything(3)
        fw.Trainer(max_epochs=2, **QUIET, **given).fit(Recording(), loader(regression_data(32), 8, shuffle=True))
        return torch.cat(seen)

    assert torch.equal(batches(), batches(use_distributed_sampler=True))
    assert not torch.equal(batches(), batches(use_distributed_sampler=False))


#: What shortens each recipe to a few steps; a GPU recipe runs on the CPU at a toy size.
SHORT = ["trainer.max_steps=3", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2",
         "trainer.enable_progress_bar=false", "logger=false"]
GPT = ["data.max_bytes=100000", "trainer.val_check_interval=2", "data.batch_size=4"]
TOY_GPU = ["trainer.accelerator=cpu", "trainer.compile=false", "trainer.devices=1"]
RECIPES = {
    "digits.yaml": [], "regression.yaml": [], "bench/cnn.yaml": ["data.num_samples=64"],
    "bench/digits_mlp.yaml": [], "bench/gpt.yaml": ["data.num_samples=32"],
    "bench/gpt_gpu.yaml": [*TOY_GPU, "module.vocab=64", "module.context=16", "module.dim=32", "module.layers=1",
                           "module.heads=2", "data.size=16", "data.vocab=64", "data.num_samples=32"],
    "gpt/cpu.yaml": GPT, "gpt/gpu.yaml": [*GPT, *TOY_GPU, "module.context=32", "data.context=32", "module.width=32",
                                          "module.layers=1", "module.heads=2"],
    "gpt/ddp.yaml": GPT, "gpt/fsdp.yaml": GPT, "gpt/model_parallel.yaml": GPT,
}


def test_every_recipe_is_listed_here():
    assert sorted(RECIPES) == sorted(str(p.relative_to(REPO / "conf")) for p in (REPO / "conf").glob("**/*.yaml"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_fws_own_recipes_state_their_choices_so_no_difference_is_said(recipe, tmp_path):
    nprocs = 2 if re.search(r"\bdevices: 2\b", (REPO / "conf" / recipe).read_text()) else 1
    fit = forked.fw_command("fit", f"conf/{recipe}", *SHORT, *RECIPES[recipe], f"trainer.default_root_dir={tmp_path}",
                            f"data.cache_dir={tmp_path}" if recipe.startswith("gpt/") else "seed=0",
                            cwd=REPO, env=clean_env(), timeout=200, nprocs=nprocs)
    assert fit.returncode == 0, fit.stderr
    assert "differs from Lightning" not in fit.stdout + fit.stderr, fit.stderr


def test_fws_lines_go_to_stderr_as_it_is_now_not_as_it_was_at_the_first_line(capfd):
    """A first line logged inside redirect_stderr (a notebook cell's capture, a test's) does not
    take the later lines with it."""
    import contextlib
    import io

    from framework.rank_zero import rank_zero_info

    with contextlib.redirect_stderr(io.StringIO()) as captured:
        rank_zero_info("fw: inside the redirect")
    rank_zero_info("fw: after it")
    assert "inside the redirect" in captured.getvalue() and "after it" not in captured.getvalue()
    assert "fw: after it" in capfd.readouterr().err


def test_a_level_set_before_fws_first_line_is_kept(capfd, monkeypatch):
    """``logging.getLogger("framework").setLevel(logging.WARNING)`` before fw's first line
    silences its notes (fw's set-up of its logger keeps a level a program chose)."""
    from framework.rank_zero import rank_zero_info

    log = logging.getLogger("framework")
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.delattr(log, "_fw_configured", raising=False)
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        rank_zero_info("fw: a note")
        assert "a note" not in capfd.readouterr().err
        assert log.level == logging.WARNING
    finally:
        log.setLevel(level)


@pytest.mark.procs
@pytest.mark.timeout(240)
def test_a_run_refused_at_set_up_prints_its_error_and_no_difference(tmp_path):
    """Issue 47: a 2-rank ``fw test`` of a checkpoint that does not exist printed 'differs from
    Lightning: evaluation shards are not padded' before its error; the same run that goes ahead
    says it once."""
    common = ["conf/digits.yaml", "trainer.devices=2", "trainer.strategy=ddp_gloo", "trainer.limit_test_batches=2",
              "trainer.enable_progress_bar=false", f"trainer.default_root_dir={tmp_path}"]
    refused = forked.fw_command("test", *common, f"ckpt_path={tmp_path / 'none.ckpt'}", cwd=REPO, env=clean_env(),
                                timeout=200, nprocs=2)
    assert refused.returncode == 1 and "fw: error: checkpoint" in refused.stderr, refused.stderr
    assert "differs from Lightning" not in refused.stdout + refused.stderr, refused.stderr
    ran = forked.fw_command("test", *common, cwd=REPO, env=clean_env(), timeout=200, nprocs=2)
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr.count("fw: differs from Lightning: evaluation shards are not padded") == 1, ran.stderr
