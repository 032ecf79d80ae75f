"""The hybrid batcher (torch-free): budget, policies, request table and the Scheduler."""

from .batch import ScheduledBatch, ScheduledEntry
from .budget import NewTokenRatio, StepBudget
from .scheduler import Scheduler
from .stats import SchedulerStats

__all__ = [
    "NewTokenRatio",
    "ScheduledBatch",
    "ScheduledEntry",
    "Scheduler",
    "SchedulerStats",
    "StepBudget",
]
