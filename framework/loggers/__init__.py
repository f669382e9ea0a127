"""Loggers: where metrics and hyperparameters go. TensorBoard is imported only on first write."""

from framework.loggers.base import Logger
from framework.loggers.csv import CSVLogger
from framework.loggers.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger"]
