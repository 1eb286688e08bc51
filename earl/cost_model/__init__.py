"""Analytical cost model: compute, memory and communication estimates for every RL stage."""

from earl.cost_model.memory import MemoryBreakdown
from earl.cost_model.model import STAGES, CostModel, Estimate
from earl.cost_model.profile import HardwareProfile, load_profile
from earl.cost_model.search import enumerate_plans, rank_plans

__all__ = ["CostModel", "Estimate", "MemoryBreakdown", "HardwareProfile", "load_profile",
           "enumerate_plans", "rank_plans", "STAGES"]
