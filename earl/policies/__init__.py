"""earl.policies: which parallelism each RL stage uses (selectors) and how intermediate data
moves between stages (dispatchers). Pure Python: never imports torch or simpy.

    python -c "from earl.policies.explain import demo; demo()"
"""

from earl.policies.balance import balance_aligned, balance_samples, imbalance_ratio, round_robin_samples
from earl.policies.cost_selector import CostModelSelector
from earl.policies.dispatch import (
    CentralizedDispatcher,
    Dispatcher,
    LayoutAwareDispatcher,
    cp_token_range,
    rank_traffic,
    received_sets,
    required_sets,
)
from earl.policies.explain import explain_selection, format_decision
from earl.policies.registry import DISPATCHERS, SELECTORS, make_dispatcher, make_selector
from earl.policies.selectors import EarlTableSelector, PlanScore, Selector, StaticSelector
from earl.policies.types import Decision, Layout, Sample, Transfer, TransferPlan

__all__ = [
    "SELECTORS", "DISPATCHERS", "make_selector", "make_dispatcher", "balance_samples", "balance_aligned",
    "round_robin_samples", "imbalance_ratio", "Selector", "StaticSelector", "EarlTableSelector",
    "CostModelSelector", "PlanScore", "Dispatcher", "CentralizedDispatcher", "LayoutAwareDispatcher",
    "cp_token_range", "received_sets", "required_sets", "rank_traffic", "explain_selection",
    "format_decision", "Decision", "Layout", "Sample", "Transfer", "TransferPlan",
]
