"""The training loop's arithmetic: accumulation, clipping, schedulers, limits and stops."""

from __future__ import annotations

import pytest
import torch
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw


def _params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_accumulating_k_batches_equals_one_k_times_larger_batch():
    data = regression_data(48)
    accumulated, big = LinearModel(), LinearModel()
    fw.Trainer(max_epochs=2, accumulate_grad_batches=3, **QUIET).fit(accumulated, loader(data, 4))
    trainer = fw.Trainer(max_epochs=2, **QUIET)
    trainer.fit(big, loader(data, 12))
    assert trainer.global_step == 8
    torch.testing.assert_close(_params(accumulated), _params(big), atol=1e-6, rtol=0)
    # and it really moved: not a vacuous comparison
    assert not torch.allclose(_params(big), _params(LinearModel()))


def test_accumulation_counts_optimizer_steps_and_flushes_the_last_partial_group():
    trainer = fw.Trainer(max_epochs=1, accumulate_grad_batches=3, **QUIET)
    trainer.fit(LinearModel(), loader(regression_data(40), 8))  # 5 batches -> steps after 3 and 5
    assert trainer.global_step == 2


class GradNormProbe(LinearModel):
    def __init__(self):
        super().__init__(lr=10.0)
        self.norms = []

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * 1000.0  # huge gradients

    def on_before_optimizer_step(self, optimizer):
        pass


@pytest.mark.parametrize(("algorithm", "bound"), [("norm", 0.5), ("value", 0.01)])
def test_gradient_clipping_bounds_the_gradients(algorithm, bound):
    seen = []

    class Probe(fw.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            pass

        def on_before_optimizer_step(self, trainer, module, optimizer):
            seen.append(module)

    model = GradNormProbe()
    observed = []
    original_step = torch.optim.SGD.step

    def spy(self, *args, **kwargs):  # gradients as the optimizer sees them, after clipping
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if algorithm == "norm":
            observed.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())
        else:
            observed.append(max(g.abs().max().item() for g in grads))
        return original_step(self, *args, **kwargs)

    torch.optim.SGD.step = spy
    try:
        fw.Trainer(max_epochs=1, gradient_clip_val=bound, gradient_clip_algorithm=algorithm, **QUIET).fit(
            model, loader(regression_data(32), 8))
    finally:
        torch.optim.SGD.step = original_step
    assert len(observed) == 4
    assert max(observed) <= bound * (1 + 1e-5)
    assert max(observed) >= bound * 0.99  # clipping was active (gradients are far larger)


@pytest.mark.parametrize(("interval", "frequency", "expected_lr"), [
    ("step", 1, 0.1 * 0.5 ** 8),    # 2 epochs x 4 steps
    ("step", 4, 0.1 * 0.5 ** 2),
    ("epoch", 1, 0.1 * 0.5 ** 2),
    ("epoch", 2, 0.1 * 0.5 ** 1),
])
def test_schedulers_step_at_their_interval(interval, frequency, expected_lr):
    model = LinearModel(scheduler={"interval": interval, "frequency": frequency})
    trainer = fw.Trainer(max_epochs=2, **QUIET)
    trainer.fit(model, loader(regression_data(32), 8))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(expected_lr)


def test_max_steps_limit_batches_and_min_epochs():
    trainer = fw.Trainer(max_steps=5, limit_train_batches=2, **QUIET)
    trainer.fit(LinearModel(), loader(regression_data(64), 8))
    assert trainer.global_step == 5 and trainer.current_epoch == 3  # 2 + 2 + 1 steps; the cut epoch ends

    trainer = fw.Trainer(max_epochs=3, limit_train_batches=0.5, **QUIET)
    trainer.fit(LinearModel(), loader(regression_data(64), 8))
    assert trainer.global_step == 12

    class StopNow(fw.Callback):
        def on_train_epoch_end(self, trainer, module):
            trainer.should_stop = True

    trainer = fw.Trainer(max_epochs=10, min_epochs=3, callbacks=[StopNow()], **QUIET)
    trainer.fit(LinearModel(), loader(regression_data(16), 8))
    assert trainer.current_epoch == 3


def test_validation_interval_and_check_every_n_epochs():
    counts = []

    class CountVal(fw.Callback):
        def on_validation_end(self, trainer, module):
            counts.append((trainer.current_epoch, trainer.global_step))

    data = regression_data(64)
    fw.Trainer(max_epochs=2, val_check_interval=3, num_sanity_val_steps=0, callbacks=[CountVal()], **QUIET).fit(
        LinearModel(), loader(data, 8), loader(data, 16))
    # Lightning's rule: after every 3rd batch of the epoch (8 batches: after the 3rd and 6th), not
    # also at the epoch's end (checked beside Lightning in tests/lightning/test_hook_overrides.py)
    assert counts == [(0, 3), (0, 6), (1, 11), (1, 14)]
    counts.clear()
    fw.Trainer(max_epochs=4, check_val_every_n_epoch=2, num_sanity_val_steps=0, callbacks=[CountVal()], **QUIET).fit(
        LinearModel(), loader(data, 8), loader(data, 16))
    assert counts == [(1, 16), (3, 32)]


def test_validate_test_and_predict_return_results():
    data = regression_data(20)
    model = LinearModel()
    trainer = fw.Trainer(**QUIET)
    results = trainer.validate(model, loader(data, 8))
    expected = torch.nn.functional.mse_loss(model(data.tensors[0]), data.tensors[1]).item()
    assert results[0]["val/loss"] == pytest.approx(expected, rel=1e-5)
    predictions = trainer.predict(model, loader(data, 8))
    assert [len(p) for p in predictions] == [8, 8, 4]


def test_bf16_mixed_precision_trains_on_cpu():
    model = LinearModel()
    trainer = fw.Trainer(max_epochs=2, precision="bf16-mixed", **QUIET)
    trainer.fit(model, loader(regression_data(32), 8))
    assert trainer.precision == "bf16-mixed" and trainer.precision_plugin.autocast_dtype == torch.bfloat16
    assert torch.isfinite(_params(model)).all()


class Stream(torch.utils.data.IterableDataset):
    """5 batches of 8 with no length: the loop cannot know which batch is the last."""

    def __iter__(self):
        data = regression_data(40)
        for i in range(0, 40, 8):
            yield data.tensors[0][i:i + 8], data.tensors[1][i:i + 8]


def test_a_loader_without_length_flushes_its_last_partial_accumulation():
    grads_at_step = []

    class Probe(fw.Callback):
        def on_before_optimizer_step(self, trainer, module, optimizer):
            grads_at_step.append(module.net.weight.grad.clone())

    trainer = fw.Trainer(max_epochs=2, accumulate_grad_batches=3, callbacks=[Probe()], **QUIET)
    model = LinearModel()
    trainer.fit(model, torch.utils.data.DataLoader(Stream(), batch_size=None))
    assert trainer.global_step == 4  # after batches 3 and 5 of each epoch
    # the same model trained on the same data with a length gives the same parameters
    reference = LinearModel()
    fw.Trainer(max_epochs=2, accumulate_grad_batches=3, **QUIET).fit(reference, loader(regression_data(40), 8))
    torch.testing.assert_close(_params(model), _params(reference), atol=1e-6, rtol=0)


def test_check_val_every_n_epoch_none_validates_by_batches_only():
    counts = []

    class CountVal(fw.Callback):
        def on_validation_end(self, trainer, module):
            counts.append(trainer.global_step)

    data = regression_data(64)
    fw.Trainer(max_epochs=2, val_check_interval=3, check_val_every_n_epoch=None, num_sanity_val_steps=0,
               callbacks=[CountVal()], **QUIET).fit(LinearModel(), loader(data, 8), loader(data, 16))
    assert counts == [3, 6, 9, 12, 15]  # every 3rd batch of the fit, as Lightning counts (across epochs)


def test_max_time_stops_the_run():
    trainer = fw.Trainer(max_epochs=1000, max_time=1e-6, **QUIET)
    trainer.fit(LinearModel(), loader(regression_data(64), 8))
    assert trainer.global_step == 1 and trainer.current_epoch == 1


def test_save_checkpoint_after_validate_only(tmp_path):
    trainer = fw.Trainer(**QUIET)
    trainer.validate(LinearModel(), loader(regression_data(16), 8))
    trainer.save_checkpoint(tmp_path / "v.ckpt")
    from framework.checkpointing.file import load_checkpoint

    assert load_checkpoint(tmp_path / "v.ckpt")["global_step"] == 0


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"strategy": "single", "devices": 2}, "strategy=single uses one device"),
    ({"check_val_every_n_epoch": 0}, "check_val_every_n_epoch=0"),
    ({"val_check_interval": 2.5}, "val_check_interval=2.5"),
    ({"strategy": {"name": "single", "timeout": 5}}, "'single' has no option 'timeout'"),
    ({"strategy": {"name": "ddp_gloo", "timout": 5}}, "did you mean 'timeout'"),
    ({"callbacks": [{"monitor": "x"}]}, r"callbacks\[0\]: dict is not an fw Callback"),
    ({"max_time": "soon"}, "trainer.max_time"),
    ({"limit_train_batches": 1.5}, "fraction and must be <= 1.0"),
    ({"gradient_clip_algorithm": "l2"}, "use norm or value"),
])
def test_trainer_arguments_are_checked_at_construction(kwargs, pattern):
    from framework.errors import ConfigError

    with pytest.raises(ConfigError, match=pattern):
        fw.Trainer(accelerator="cpu", **kwargs)
