"""Garbage collection at step boundaries (earl.runtime.gc_steps): the automatic collector is off
inside a run's steps and restored after; collections run by hand every `gc_every` steps; the
run's results do not depend on it; bad values fail with the valid choices.

    python -m pytest -q tests/runtime/test_gc_steps.py
"""

import gc

import pytest

from earl.runtime.gc_steps import StepGC
from earl.runtime.resolve import resolve_config
from earl.runtime.run import run_training
from tests.runtime.test_run import deterministic, small


def test_step_gc_collects_by_hand_and_restores_the_collector():
    assert gc.isenabled()
    with StepGC(every=2) as g:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        cycle = []
        cycle.append(cycle)  # garbage only the cyclic collector frees
        del cycle
        for step in range(1, 6):
            g.step_done(step)
        assert g.collections == 2 and g.seconds > 0  # steps 2 and 4
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with StepGC(every=0) as g:  # Python's automatic collector, untouched
        assert gc.isenabled()
        g.step_done(1)
        assert g.collections == 0


def test_bad_gc_every_names_the_valid_values():
    with pytest.raises(ValueError, match="gc_every must be >= 0"):
        resolve_config(overrides={"gc_every": "-1"})
    with pytest.raises(ValueError, match="gc_every must be an int >= 0"):
        StepGC(every=1.5)


def test_run_is_the_same_with_either_collector(tmp_path):
    """The collector decides when memory is freed, never what a step computes."""
    rows = [run_training(small(steps=2, gc_every=k), tmp_path / str(k), progress=False, echo=lambda s: None).metrics
            for k in (0, 1)]
    assert [deterministic(r) for r in rows[0]] == [deterministic(r) for r in rows[1]]
    assert gc.isenabled()
