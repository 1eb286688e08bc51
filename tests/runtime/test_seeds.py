"""earl.runtime.seeds, the one home of a run's random streams: the values are pinned (a run's
seeded output depends on them bit for bit) and every engine uses the same functions.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_seeds.py
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

import torch

from earl.runtime import seeds
from earl.runtime.seeds import counter_uniform, default_stream, mix_seed, request_seed


def test_mix_seed_values_are_pinned():
    assert [mix_seed(1, 2, 3), mix_seed(0), mix_seed(7, 9, seeds.SAMPLE_STREAM, 5), mix_seed(-4, 2**70)] == [
        8141517521349060329, 6229623725594924965, 8330225610268375156, 412229106224153257]
    assert all(0 <= mix_seed(s, 1) < 2**63 for s in range(-5, 5))


def test_request_seed_is_the_row_hash_of_counter_uniform_and_pinned():
    got = [request_seed(s, p) for s in (-3, 0, 7, 2**40) for p in (0, 5, 300)]
    assert got[:4] == [8404144936228440588, 4432471439660097806, 3531439745049230972, 8841707400507832957]
    row = seeds.row_hash(torch.tensor([7]), torch.tensor([40]))
    assert request_seed(7, 40) == int(row.item()) & ((1 << 63) - 1)


def test_counter_uniform_bits_are_pinned():
    u = counter_uniform(torch.tensor([0, 5, -7, 2**40]), torch.tensor([0, 1, 2, 99]), 33)
    assert hashlib.sha1(u.numpy().tobytes()).hexdigest() == "0f0432f53dbe130f481ca9b3e39b97ca60a903e2"


def test_counter_uniform_in_place_equals_the_functional_form():
    """Eager mode finishes the hash in place; compiled code (and this reference) is functional."""
    s, p = torch.tensor([0, 5, -7, 2**40, 123456789]), torch.tensor([0, 1, 2, 99, 4096])
    row = seeds.row_hash(s, p)
    for width in (1, 33, 31942):
        cols = torch.arange(width, dtype=torch.long) * seeds.GOLDEN
        ref = (seeds.shr(seeds.mix64(row[:, None] + cols[None, :]), 11).double() + 0.5) / float(1 << 53)
        got = counter_uniform(s, p, width)
        assert torch.equal(got, ref) and 0 < got.min() and got.max() < 1


def test_default_stream_separates_group_members():
    assert default_stream(3, 0) != default_stream(3, 1)
    assert default_stream(3, 1) == 3 * seeds.DEFAULT_STREAM_STRIDE + 1


def test_every_engine_draws_from_this_module():
    """No engine carries its own copy of the mixers (the vLLM backend once imported the
    built-in one's private constants)."""
    code = ("import earl.runtime.engine.base as b, earl.runtime.engine.vllm as v, earl.runtime.seeds as s\n"
            "assert b.counter_uniform is s.counter_uniform and v.request_seed is s.request_seed\n"
            "assert not any(hasattr(b, n) for n in ('_mix64', '_GOLDEN', '_MIX1'))\n")
    subprocess.run([sys.executable, "-c", code], check=True)
