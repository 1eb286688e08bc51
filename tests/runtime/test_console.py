"""What `earl run` prints: under --quiet no progress bar of its own and none of the libraries'
(transformers' "Loading weights"), only the step lines and the summary.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_console.py
"""

import os
import subprocess
import sys
from pathlib import Path

from transformers.utils import logging as hf_logging

from earl.runtime.console import library_progress_bars

sys.path.insert(0, str(Path(__file__).parent))
from chat_model import build_chat_model  # noqa: E402


def test_library_progress_bars_off_for_the_duration_then_as_they_were():
    hf_logging.enable_progress_bar()
    with library_progress_bars(False):
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    with library_progress_bars(True):  # left as they are
        assert hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    with library_progress_bars(False):
        assert not hf_logging.is_progress_bar_enabled()
    assert not hf_logging.is_progress_bar_enabled()  # not switched on by leaving
    hf_logging.enable_progress_bar()


def test_quiet_run_of_an_hf_checkpoint_prints_no_loading_bar(tmp_path):
    """A real HF folder (loaded through transformers' from_pretrained, which draws the bar) run
    through the real CLI in a fresh process (the code before this fix printed the bar here)."""
    model = build_chat_model(tmp_path / "model")
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1",
           **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})}
    r = subprocess.run([sys.executable, "-m", "earl.cli", "run", "--quiet", "--model", str(model), "--steps", "1",
                        "--out", str(tmp_path / "run"), "--set", "groups=2", "--set", "group_size=2",
                        "--set", "plots=false", "--set", "checkpoints=false",
                        "--set", "sampling.max_new_tokens=4"],
                       capture_output=True, text=True, timeout=300, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "step    1" in r.stdout and "first 10 -> last 10" in r.stdout  # the run did print its lines
    assert "Loading weights" not in out, out
