"""The three sides of a ``fw bench`` training run, each training the same workload for the same
steps and reading the same clock at the same places: the hand-written PyTorch loop (DDP or
DataParallel and a DistributedSampler, as a user writes them), fw, and PyTorch Lightning when it
is installed and can run in this job.

In an MPI job the default process group is Gloo (the comm suite's), and the gradient all-reduce
of the hand-written loop and of fw runs over the job's ``fw_mpi`` group (``process_group=``):
what fw's mpi strategy trains over. Lightning does not run there (no MPI backend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from framework.bench.context import Job, launched_by
from framework.bench.workload import Clock, Precision

if TYPE_CHECKING:
    from framework.strategies import Strategy


def run_raw(job: Job, module, data, steps: int, clock: Clock, precision: Precision, ddp_kwargs: dict, dp: bool,
            units: tuple[str, ...] = ()) -> None:
    """The hand-written loop: DDP (or DataParallel, or FSDP2's ``fully_shard`` on the ``units``
    classes and the root) and a DistributedSampler as a user writes them."""
    device = job.device
    module = module.to(device)
    loader = data.train_dataloader()
    sampler: DistributedSampler | None = None
    model: torch.nn.Module
    if units:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if precision == "bf16-mixed" else MixedPrecisionPolicy()
        for block in [m for m in module.modules() if type(m).__name__ in units]:
            fully_shard(block, mp_policy=policy)
        model = fully_shard(module, mp_policy=policy)
    elif job.world > 1:
        group = job.mpi_group if job.kind == "mpi" else None
        ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(module, device_ids=ids, process_group=group, **ddp_kwargs)
        clock.attach(model)
    elif dp:
        model = torch.nn.DataParallel(module)
    else:
        model = module
    if job.world > 1:
        sampler = DistributedSampler(loader.dataset, job.world, job.rank, shuffle=isinstance(loader.sampler, RandomSampler))
        loader = DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler, drop_last=loader.drop_last)
    optimizer = module.configure_optimizers()
    optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16-mixed" else None
    model.train()
    done, epoch = 0, 0
    while done < steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        clock.mark_epoch_start()
        for x, y in loader:
            if done >= steps:
                break
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            clock.mark_batch_start()
            if autocast is not None:
                with autocast:
                    loss = module.criterion(model(x), y)
            else:
                loss = module.criterion(model(x), y)
            clock.mark_backward_start()
            loss.backward()
            clock.mark_backward_end()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            clock.mark_batch_end()
            done += 1
        epoch += 1


def fw_strategy(job: Job, ddp_kwargs: dict, dp: bool, units: tuple[str, ...] = ()) -> str | dict[str, Any] | Strategy:
    """The Trainer's ``strategy`` in this job. Under MPI: DDP on the job's Gloo default group
    with its gradients all-reduced over the ``fw_mpi`` group, as the raw loop's."""
    if units:
        return {"name": "fsdp", "auto_wrap_policy": list(units)}
    if job.kind == "mpi":
        from framework.strategies import DDPStrategy

        return DDPStrategy(backend="gloo", process_group=job.mpi_group, **ddp_kwargs)
    if job.world > 1:
        return {"name": "ddp_nccl" if job.kind == "nccl" else "ddp_gloo", **ddp_kwargs}
    return "dp" if dp else "single"


def run_fw(job: Job, module, data, steps: int, clock: Clock, precision: Precision, ddp_kwargs: dict, dp: bool,
           units: tuple[str, ...] = ()) -> None:
    import framework as fw

    cuda = job.device.type == "cuda"
    trainer = fw.Trainer(
        accelerator="cuda" if cuda else "cpu", devices=(torch.cuda.device_count() if dp else job.local_world),
        num_nodes=max(1, job.world // max(1, job.local_world)),
        strategy=fw_strategy(job, ddp_kwargs, dp, units), max_steps=steps, max_epochs=-1, precision=precision,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock],
    )  # fmt: skip
    trainer.fit(module, datamodule=data)


def lightning_missing(job: Job, dp: bool = False) -> str | None:
    """Why Lightning cannot run in this job (None: it can). The reasons that need no import come
    first: a job that will not run Lightning does not import it (a few CPU-seconds in each rank)."""
    if dp:
        return "Lightning 2.x has no DataParallel strategy"
    if job.kind == "mpi":
        return "Lightning has no MPI backend without a torch built with MPI: not run under mpiexec"
    if job.world > 1 and launched_by() == "slurm":
        return "not run under srun (its SLURM environment would start its own rendezvous)"
    try:
        import pytorch_lightning  # noqa: F401
    except ImportError:
        return "pytorch_lightning is not installed"
    return None


def run_lightning(job: Job, module, data, steps: int, clock: Clock, precision: Precision, ddp_kwargs: dict, dp: bool) -> None:
    import pytorch_lightning as pl

    class Workload(pl.LightningModule):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.inner.criterion(self(x), y)

        def configure_optimizers(self):
            return self.inner.configure_optimizers()

    class Clock(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            if job.world > 1:
                clock.attach(trainer.strategy.model)

        def on_train_epoch_start(self, trainer, pl_module):
            clock.mark_epoch_start()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            clock.mark_batch_start()

        def on_before_backward(self, trainer, pl_module, loss):
            clock.mark_backward_start()

        def on_after_backward(self, trainer, pl_module):
            clock.mark_backward_end()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            clock.mark_batch_end()

    trainer = pl.Trainer(
        accelerator="gpu" if job.device.type == "cuda" else "cpu",
        devices=torch.cuda.device_count() if dp else max(1, job.local_world), num_nodes=max(1, job.world // max(1, job.local_world)),
        strategy=_lightning_strategy(job, ddp_kwargs, dp), max_steps=steps, max_epochs=-1, precision=precision,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Clock()], default_root_dir="/tmp/fw-bench-lightning",
    )  # fmt: skip
    trainer.fit(Workload(module), train_dataloaders=data.train_dataloader())


def _lightning_strategy(job: Job, ddp_kwargs: dict, dp: bool) -> Any:
    """Lightning's strategy for the job: its DDP across processes, ``dp`` on one, else ``auto``."""
    if job.world > 1:
        from pytorch_lightning.strategies import DDPStrategy

        return DDPStrategy(process_group_backend="nccl" if job.kind == "nccl" else "gloo", **ddp_kwargs)
    return "dp" if dp else "auto"


SIDES = {"raw": run_raw, "fw": run_fw, "lightning": run_lightning}
