"""Hardware calibration: micro-benchmarks, fits and version-stamped profiles.

    earl calibrate --device cpu --budget-s 60 --out /tmp/cpu.json
    python -c "from earl.calibrate import run_calibration as r; print(r(budget_s=20).profile.fit_quality)"
"""

__all__ = ["PHASES", "CalibrationResult", "Progress", "current_stamp", "run_calibration"]


def __getattr__(name: str):
    # Lazy, so `python -m earl.calibrate.<module>` does not import its own module twice.
    if name in __all__:
        from earl.calibrate import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'earl.calibrate' has no attribute {name!r}")
