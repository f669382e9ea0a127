"""Callbacks: checkpointing, early stopping, learning-rate, throughput, step-time and device-stats
logging, progress, weight averaging (SWA, EMA), a training timer, a callback made of functions, and
reports to Ray Train.

None of these modules imports rich, tensorboard or ray at import time.
"""

from framework.callbacks.base import Callback
from framework.callbacks.base_prediction_writer import BasePredictionWriter
from framework.callbacks.device_stats_monitor import DeviceStatsMonitor
from framework.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from framework.callbacks.lambda_callback import LambdaCallback
from framework.callbacks.lr_monitor import LearningRateMonitor
from framework.callbacks.model_checkpoint import ModelCheckpoint
from framework.callbacks.model_summary import ModelSummary
from framework.callbacks.prediction_writer import PredictionWriter
from framework.callbacks.progress import RichProgressBar
from framework.callbacks.ray_report import RayTrainReport
from framework.callbacks.step_breakdown import StepTimeBreakdown
from framework.callbacks.stochastic_weight_avg import StochasticWeightAveraging
from framework.callbacks.throughput import ThroughputMonitor
from framework.callbacks.timer import Timer
from framework.callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging

__all__ = ["BasePredictionWriter", "Callback", "DeviceStatsMonitor", "EMAWeightAveraging", "EarlyStopping",
           "EarlyStoppingReason", "LambdaCallback", "LearningRateMonitor", "ModelCheckpoint", "ModelSummary",
           "PredictionWriter", "RayTrainReport", "RichProgressBar", "StepTimeBreakdown", "StochasticWeightAveraging",
           "ThroughputMonitor", "Timer", "WeightAveraging"]
