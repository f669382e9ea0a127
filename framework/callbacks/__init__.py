"""Callbacks: checkpointing, early stopping, learning-rate, throughput and step-time logging, progress.

None of these modules imports rich or tensorboard at import time.
"""

from framework.callbacks.base import Callback
from framework.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from framework.callbacks.lr_monitor import LearningRateMonitor
from framework.callbacks.model_checkpoint import ModelCheckpoint
from framework.callbacks.prediction_writer import BasePredictionWriter, PredictionWriter
from framework.callbacks.progress import RichProgressBar
from framework.callbacks.step_breakdown import StepTimeBreakdown
from framework.callbacks.throughput import ThroughputMonitor

__all__ = ["BasePredictionWriter", "Callback", "EarlyStopping", "EarlyStoppingReason", "LearningRateMonitor", "ModelCheckpoint",
           "PredictionWriter", "RichProgressBar", "StepTimeBreakdown", "ThroughputMonitor"]
