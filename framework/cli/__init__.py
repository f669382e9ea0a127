"""``fw``: run a recipe. ``fw fit conf/x.yaml key=value ...``; also validate, test, predict, env, bench,
checkpoint export, lighthouse.

Examples::

    fw fit conf/digits.yaml                                   # train
    fw fit conf/digits.yaml trainer.max_epochs=3 data.batch_size=32
    fw fit conf/digits.yaml trainer.devices=2 trainer.strategy=ddp_gloo   # 2 workers, Gloo
    torchrun --nproc-per-node=2 -m framework.cli fit conf/digits.yaml trainer.devices=2
    fw fit conf/digits.yaml --print-config                    # show the merged recipe
    fw env                                                    # what a hanging job needs to know
    fw bench --quick                                          # which backend and settings to use here
    fw checkpoint export runs/ck/last.ckpt model.pt           # a sharded checkpoint as one file
    fw lighthouse --port 29510                                # where trainer.strategy=ft replica groups meet

The package: this file (arguments, errors), ``run_recipe.py`` (build a run from a recipe and
execute one stage), ``env_report.py`` (``fw env``), ``checkpoint_export.py`` (``fw checkpoint
export``), ``lighthouse.py`` (``fw lighthouse``), ``__main__.py`` (``python -m framework.cli``).

User mistakes print one line ``fw: error: ...`` and exit with 2 (recipe, arguments) or 1
(distributed set-up, checkpoints); errors in user code keep their traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from framework.errors import ConfigError, FwError, ProgramEnds, install_command

STAGES = ("fit", "validate", "test", "predict")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fw", description="Train PyTorch models from YAML recipes.")
    parser.add_argument("--version", action="version", version=_version())
    # torch.distributed.launch passes --local-rank=N; the torchrun environment reads it from argv
    parser.add_argument("--local-rank", "--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{fit,validate,test,predict,env,bench,checkpoint,lighthouse}")
    for stage in STAGES:
        p = sub.add_parser(stage, help=f"{stage} the recipe's module", epilog=_CKPT_HELP[stage],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("config", nargs="?", help="recipe YAML file")  # missing: our message, not argparse's
        p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.max_epochs=5 module.lr=1e-3; "
                       "~key removes a key, +key=value appends to a list (+callbacks={_target_: ...})")
        p.add_argument("--print-config", action="store_true", help="print the merged recipe and exit")
    sub.add_parser("env", help="report torch, CUDA, MPI, network interfaces and the detected cluster")
    from framework.bench import add_arguments

    add_arguments(sub.add_parser("bench", help="measure backends, strategies and DDP settings on this machine"))
    from framework.cli import checkpoint_export

    checkpoint_export.add_arguments(sub.add_parser("checkpoint", help="export a checkpoint as one file plain torch loads"))
    from framework.cli import lighthouse

    lighthouse.add_arguments(sub.add_parser("lighthouse", help="serve the Lighthouse replica groups of strategy=ft meet at"))
    return parser


_SCORED = ("which weights to {0}: ckpt_path=best (the best checkpoint of the run's ModelCheckpoint, found in the run\n"
           "folder), ckpt_path=last (the newest), ckpt_path=PATH, or ckpt_path=none (fresh weights, on purpose).\n"
           "example: fw {0} conf/digits.yaml ckpt_path=best")
_CKPT_HELP = {
    "fit": "resume with ckpt_path=last (this run's newest checkpoint) or ckpt_path=PATH.\n"
           "example: fw fit conf/digits.yaml trainer.max_epochs=20 ckpt_path=last",
    **{stage: _SCORED.format(stage) for stage in ("validate", "test", "predict")},
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from framework import __version__

    try:
        torch = version("torch")
    except PackageNotFoundError:  # pragma: no cover - fw needs torch
        torch = "not installed"
    return f"fw {__version__} (torch {torch}, python {sys.version.split()[0]})"


def run(args: argparse.Namespace) -> int:
    if args.command == "env":
        from framework.cli.env_report import env_report

        print(env_report())
        return 0
    if args.command == "bench":
        from framework.bench import main as bench

        return bench(args)
    if args.command == "lighthouse":
        from framework.cli.lighthouse import lighthouse

        return lighthouse(args)
    if args.command == "checkpoint":
        from framework.cli.checkpoint_export import export

        sys.stderr.write(export(args) + "\n")
        return 0
    from framework.cli.run_recipe import run_recipe
    from framework.config import load_recipe
    from framework.config.recipe import reads_environment

    # `_target_: mymodels.Net` should find mymodels.py in the directory fw runs from, as
    # `python -m` would; the `fw` console script alone puts only its own directory on the path
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())

    if args.config is None:
        raise ConfigError(f"fw {args.command} needs a recipe: fw {args.command} RECIPE.yaml [key=value ...] "
                          f"(e.g. fw {args.command} conf/digits.yaml)")
    recipe, text = load_recipe(args.config, args.overrides)
    if args.print_config:
        print(text, end="")
        return 0
    try:
        run_recipe(args.command, recipe, text)
    except FwError as err:
        if reads_environment(text):  # its values may differ by node: no check of them is alike on every rank
            err.alike_on_every_rank = False
        raise
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except ProgramEnds as end:  # the workers' job is done, or a signal stopped the fit: its status
        return int(end.code or 0)
    except FwError as err:
        from framework.strategies.launchers.worker_failures import said_by_another_process

        if said_by_another_process(err):  # fw's launcher, or rank 0 for a refusal alike on every rank
            return err.exit_code
        if _in_mpi_job() and not (err.alike_on_every_rank and _mpi_rank() == 0):
            from framework.strategies.mpi import abort_mpi_job

            abort_mpi_job(err)  # one rank's mistake must end them all (MPI has no timeouts); it says the line
        sys.stderr.write(f"fw: error: {err}\n")
        return err.exit_code
    except ModuleNotFoundError as err:
        hint = _missing_extra(err.name or "")
        if hint is None:
            raise
        sys.stderr.write(f"fw: error: {hint}\n")
        return 2


#: optional packages, and how to install them (top-level module -> (distribution, fw extra))
_OPTIONAL = {
    "sklearn": ("scikit-learn", "recipes"),
    "matplotlib": ("matplotlib", "bench"),
    "mpi4py": ("mpi4py", "mpi"),
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
    "tensorboard": ("tensorboard", None),
    "rich": ("rich", None),
    "omegaconf": ("omegaconf", None),
    "torchmetrics": ("torchmetrics", None),
}


def _missing_extra(module: str) -> str | None:
    """One line for a missing optional package: what is missing and the install command."""
    top = module.split(".")[0]
    if top not in _OPTIONAL:
        return None
    dist, extra = _OPTIONAL[top]
    how = f"{install_command(extra)} (or pip install {dist})" if extra else f"pip install {dist}"
    return f"this run needs {dist} (module '{top}'), which is not installed: {how}"


def _mpi_rank() -> int:
    return sys.modules["mpi4py.MPI"].COMM_WORLD.Get_rank()


def _in_mpi_job() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1


def __getattr__(name: str):
    if name == "LightningCLI":  # a port that kept Lightning's CLI class: say what fw has instead
        raise ImportError("fw has no LightningCLI: write a recipe (YAML: module, data, trainer) and run "
                          "`fw fit conf/x.yaml key=value ...`; see docs/guides/basic/recipes.md")
    raise AttributeError(f"module 'framework.cli' has no attribute '{name}'")
