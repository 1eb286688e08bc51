"""Suite-wide switches: tests marked `gpu` need CUDA and skip cleanly without it.

    python -m pytest -m gpu          # on a CUDA machine (studies/gpu_check.sh runs this)
"""

import importlib.util

import pytest


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in gpu_items:
        item.add_marker(skip)
