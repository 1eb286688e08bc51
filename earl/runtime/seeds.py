"""The random streams of a run, in one place: every seed the runtime and its engines derive.

Why it exists: a run must sample the same tokens on one process or many, in any batch, with any
engine. So every stream is a pure hash of integers (splitmix64 rounds), never a shared generator:
`mix_seed` names a run's streams (environment seeds, sampling streams, the shuffle of each dp
rank), `counter_uniform` draws a token's noise from (row stream, position, column) in tensors
(the built-in engines), and `request_seed` gives vLLM one seed per (stream, position) from the
same row hash.

    python -c "from earl.runtime.seeds import mix_seed; print(mix_seed(0, 1, 2))"
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
SAMPLE_STREAM = 1_000_001  # mix_seed(seed, step, SAMPLE_STREAM, episode): an episode's sampling stream
SHUFFLE_STREAM = 2_000_003  # mix_seed(seed, step, SHUFFLE_STREAM, dp_rank): a trainer rank's shuffle
DEFAULT_STREAM_STRIDE = 1_000_003  # rollout without explicit streams: env seed * stride + episode id


def mix_seed(*parts: int) -> int:
    """A deterministic 63-bit seed from integers (splitmix64 rounds)."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
        x ^= x >> 31
    return x & 0x7FFFFFFFFFFFFFFF


def default_stream(env_seed: int, episode_id: int) -> int:
    """An episode's sampling stream when the caller names none: group members share their
    environment seed, never their stream."""
    return env_seed * DEFAULT_STREAM_STRIDE + episode_id


def _as_i64(c: int) -> int:
    """An unsigned 64-bit constant as the signed int64 torch stores (same bits)."""
    c &= _MASK64
    return c - (1 << 64) if c >= 1 << 63 else c


GOLDEN = _as_i64(0x9E3779B97F4A7C15)
MIX1 = _as_i64(0xBF58476D1CE4E5B9)
MIX2 = _as_i64(0x94D049BB133111EB)


def shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (wrapping arithmetic)."""
    x = (x ^ shr(x, 30)) * MIX1
    x = (x ^ shr(x, 27)) * MIX2
    return x ^ shr(x, 31)


def row_hash(seeds_A: torch.Tensor, positions_A: torch.Tensor) -> torch.Tensor:
    """[A] int64: the hash of (row stream, position) that a token's noise starts from."""
    return mix64(mix64(seeds_A.long() * GOLDEN + 1) + positions_A.long() * MIX1)


def counter_uniform(seeds_A: torch.Tensor, positions_A: torch.Tensor, width: int) -> torch.Tensor:
    """[A, width] float64 uniforms in (0, 1), a pure function of (row seed, position, column).

    Counter-based randomness: a token's noise depends only on its episode's seed and where it
    sits in the episode, never on which other episodes share the batch, which process plays the
    episode, or how many tokens were drawn before. So a run samples the same tokens on one
    process or many, with any engine batch size."""
    row = row_hash(seeds_A, positions_A)
    cols = torch.arange(width, device=seeds_A.device, dtype=torch.long) * GOLDEN
    if torch.compiler.is_compiling():  # Inductor fuses the functional form into one kernel
        bits = shr(mix64(row[:, None] + cols[None, :]), 11)  # 53 random bits
        return (bits.double() + 0.5) / float(1 << 53)
    return _uniform_bits_inplace(row[:, None] + cols[None, :])


def _uniform_bits_inplace(x: torch.Tensor) -> torch.Tensor:
    """`counter_uniform`'s finish in eager mode: the same bits as the functional form, in two
    [A, width] buffers instead of a new one per operation (2x faster on a 32 x 32K-vocab step)."""
    t = torch.empty_like(x)
    for k, m in ((30, MIX1), (27, MIX2)):  # mix64, each `x ^ shr(x, k)` then the multiply
        torch.bitwise_right_shift(x, k, out=t).bitwise_and_((1 << (64 - k)) - 1)
        x.bitwise_xor_(t).mul_(m)
    torch.bitwise_right_shift(x, 31, out=t).bitwise_and_((1 << 33) - 1)
    x.bitwise_xor_(t).bitwise_right_shift_(11).bitwise_and_((1 << 53) - 1)  # 53 random bits
    return x.to(torch.float64).add_(0.5).div_(float(1 << 53))


def request_seed(episode_seed: int, position: int) -> int:
    """The vLLM seed of one request: `row_hash` of the episode's sampling stream and the episode
    length at which this turn starts, so two episodes or two turns of one episode never share a
    seed. In [0, 2**63)."""
    s = torch.tensor([int(episode_seed)], dtype=torch.long)
    p = torch.tensor([int(position)], dtype=torch.long)
    return int(row_hash(s, p).item()) & ((1 << 63) - 1)
