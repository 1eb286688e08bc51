"""The one place policies are registered by name: `SELECTORS` and `DISPATCHERS`.

    python -c "from earl.policies import SELECTORS, DISPATCHERS; print(list(SELECTORS), list(DISPATCHERS))"
"""

from __future__ import annotations

from earl.policies.cost_selector import CostModelSelector
from earl.policies.dispatch import CentralizedDispatcher, Dispatcher, LayoutAwareDispatcher
from earl.policies.selectors import EarlTableSelector, Selector, StaticSelector

SELECTORS: dict[str, type[Selector]] = {
    "static": StaticSelector,
    "earl-table": EarlTableSelector,
    "cost-model": CostModelSelector,
}
DISPATCHERS: dict[str, type[Dispatcher]] = {
    "centralized": CentralizedDispatcher,
    "layout-aware": LayoutAwareDispatcher,
}
EARL_POLICY = ("cost-model", "layout-aware")  # EARL's (selector, dispatcher): what `earl simulate` shows


def _lookup(kind: str, registry: dict, name: str):
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(registry)}")
    return registry[name]


def make_selector(name: str, *, cost_model, initial, stage_gpus: int, **options) -> Selector:
    """A selector by name. Options are the selector's keyword arguments (e.g. `margin`,
    `hysteresis`, `patience` for cost-model; `ranges` for earl-table); unknown ones raise."""
    cls = _lookup("selector", SELECTORS, name)
    try:
        return cls(cost_model=cost_model, initial=initial, stage_gpus=stage_gpus, **options)
    except TypeError as e:
        raise ValueError(f"selector {name!r}: {e}") from None


def make_dispatcher(name: str, **options) -> Dispatcher:
    """A dispatcher by name (`controller=RANK` optional)."""
    return _lookup("dispatcher", DISPATCHERS, name)(**options)
