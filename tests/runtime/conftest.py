"""Shared fixtures for the runtime tests (CPU, tiny random models)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny():
    from earl.runtime.hf_model import load_policy

    return load_policy("tiny", seed=0)
