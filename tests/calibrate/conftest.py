"""One tiny real calibration shared by the calibrate and validate tests (about 12 s)."""

import pytest

from earl.calibrate import run_calibration


@pytest.fixture(scope="session")
def calibration():
    return run_calibration(device="cpu", budget_s=8.0)


@pytest.fixture(scope="session")
def calibrated_profile(calibration, tmp_path_factory):
    return str(calibration.profile.save(tmp_path_factory.mktemp("profile") / "cpu.json"))
