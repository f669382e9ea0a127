"""Loggers: where metrics and hyperparameters go. TensorBoard, MLflow and W&B are imported only
at first use (MLflow and W&B are extras: ``pip install 'fw[mlflow]'``, ``'fw[wandb]'``)."""

from framework.loggers.base import Logger
from framework.loggers.csv import CSVLogger
from framework.loggers.dummy import DummyLogger
from framework.loggers.mlflow import MLFlowLogger
from framework.loggers.tensorboard import TensorBoardLogger
from framework.loggers.wandb import WandbLogger

__all__ = ["CSVLogger", "DummyLogger", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]
