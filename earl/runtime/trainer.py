"""The batch the experience and training stages exchange, log-probs, and the policy-gradient loss.

`ExperienceBatch` holds padded tensors; `batch_logprobs` is the experience stage's forward-only
pass; `token_logprobs` computes log-probs and entropy from the decoder's hidden states and the
LM head on the generated positions only, a chunk of positions at a time (full-vocabulary fp32
logits never exist for a whole micro-batch; a bias-free linear head gets a hand-written
backward, `_HeadLogprobs`); `Trainer.backward` runs the clipped policy loss composed from
earl.runtime.losses (ratio level, asymmetric and dual clip, aggregation, the KL estimator;
docs/losses.md), the entropy bonus and optionally truncated importance sampling against the
engine's log-probs (earl.runtime.mismatch), with token-budget micro-batching. The loss is
normalised over the whole global (mini)batch, so any split into micro-batches or data-parallel
shards gives the same gradient. `train_step` is one training step: the loss over mini-batches,
each followed by an optimizer step (the strategies are earl.runtime.optim's). Advantages come
from earl.runtime.advantages.

    pytest tests/runtime/test_trainer.py
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass

import torch
import torch.utils.checkpoint

from earl.cost_model.model import SHARE_MIN_FRAC, micro_batches
from earl.runtime.dist import comm_device
from earl.runtime.losses import clipped_pg, kl_estimate, loss_denominator, policy_ratio, token_weights
from earl.runtime.mismatch import SUM_KEYS, mismatch_sums, tis_weights
from earl.runtime.rollout import Trajectory
from earl.runtime.run_config import GROUP_ALGOS, TrainerConfig


@dataclass
class ExperienceBatch:
    """N right-padded sequences of T tokens. Per-token tensors at position t describe token t
    (log p(token t | tokens < t)); position 0 is always a prompt token."""

    sample_ids: torch.Tensor  # [N] long, the episode ids
    group_ids: torch.Tensor  # [N] long
    input_ids: torch.Tensor  # [N, T] long
    attention_mask: torch.Tensor  # [N, T] bool, real tokens
    loss_mask: torch.Tensor  # [N, T] bool, model-generated tokens
    engine_logprobs: torch.Tensor  # [N, T] float, from the rollout engine (the behaviour policy)
    rewards: torch.Tensor  # [N] float, episode returns
    token_rewards: torch.Tensor  # [N, T] float, each step's reward on that turn's last token
    turn_ids: torch.Tensor  # [N, T] long, the turn a generated token belongs to; -1 elsewhere
    old_logprobs: torch.Tensor | None = None  # [N, T] float, policy before this step
    ref_logprobs: torch.Tensor | None = None  # [N, T] float, frozen reference
    advantages: torch.Tensor | None = None  # [N, T] float
    legal_bits: torch.Tensor | None = None  # [N, T] long, the env's legal actions per move (0: none listed)

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        return self.attention_mask.sum(1)

    def select(self, idx: list[int] | torch.Tensor) -> ExperienceBatch:
        """Rows `idx`, cropped to their longest sequence."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        width = int(self.lengths[idx].max()) if len(idx) else 0
        out = {}
        for f in dataclasses.fields(self):
            t = getattr(self, f.name)
            if t is None:
                out[f.name] = None
            elif t.dim() == 2:
                out[f.name] = t[idx, :width]
            else:
                out[f.name] = t[idx]
        return ExperienceBatch(**out)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}


def turn_fields(trajs: list[Trajectory], mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Over `trajs`' tokens laid end to end (`mask`: their loss masks, flat): each token's
    reward (a turn's reward sits on its last token, `Trajectory.step_rewards`) and the turn it
    belongs to (turn k spans the tokens after turn k-1's last one up to its own; -1 after the
    last turn and off the mask). A few whole-tensor operations, not two per turn: the hand-off
    builds these for every episode of a step, and per-turn indexing cost ~10 us a turn."""
    lengths = torch.tensor([len(t.token_ids) for t in trajs], dtype=torch.long)
    counts = torch.tensor([len(t.step_rewards) for t in trajs], dtype=torch.long)
    total = int(lengths.sum())
    starts = torch.cumsum(lengths, 0) - lengths  # each episode's first token, flat
    ends = torch.tensor([p for t in trajs for p, _ in t.step_rewards], dtype=torch.long) \
        + torch.repeat_interleave(starts, counts)
    if ends.numel() > 1 and bool((ends[1:] < ends[:-1]).any()):
        bad = next(t for t in trajs if [p for p, _ in t.step_rewards] != sorted(p for p, _ in t.step_rewards))
        raise ValueError(f"episode {bad.episode_id}: step_rewards positions must not decrease, got "
                         f"{[p for p, _ in bad.step_rewards]}")
    tok_r = torch.zeros(total).index_add_(0, ends, torch.tensor([r for t in trajs for _, r in t.step_rewards],
                                                                dtype=torch.float32))
    first = torch.cumsum(counts, 0) - counts  # each episode's first turn among `ends`
    lo, hi = torch.repeat_interleave(first, lengths), torch.repeat_interleave(first + counts, lengths)
    nxt = torch.searchsorted(ends, torch.arange(total))  # the first turn ending at or after each token
    turn_ids = torch.where((nxt < hi) & mask, nxt - lo, -1)
    return tok_r, turn_ids


def collate(trajs: list[Trajectory], pad_id: int) -> ExperienceBatch:
    n, width = len(trajs), max(len(t.token_ids) for t in trajs)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros(n, width, dtype=torch.bool)
    mask = torch.zeros(n, width, dtype=torch.bool)
    lps = torch.zeros(n, width)
    tok_r = torch.zeros(n, width)
    turn_ids = torch.full((n, width), -1, dtype=torch.long)
    legal = torch.zeros(n, width, dtype=torch.long)
    lengths = [len(t.token_ids) for t in trajs]
    flat_r, flat_turn = turn_fields(trajs, torch.tensor([x for t in trajs for x in t.loss_mask], dtype=torch.bool))
    for i, (t, r, turn) in enumerate(zip(trajs, flat_r.split(lengths), flat_turn.split(lengths), strict=True)):
        k = len(t.token_ids)
        ids[i, :k] = torch.tensor(t.token_ids)
        attn[i, :k] = True
        mask[i, :k] = torch.tensor(t.loss_mask, dtype=torch.bool)
        tok_r[i, :k], turn_ids[i, :k] = r, turn
        lps[i, :k] = torch.tensor(t.logprobs)
        legal[i, :k] = torch.tensor(t.legal_per_token, dtype=torch.long)
    return ExperienceBatch(
        sample_ids=torch.tensor([t.episode_id for t in trajs]),
        group_ids=torch.tensor([t.group_id for t in trajs]),
        input_ids=ids, attention_mask=attn, loss_mask=mask, engine_logprobs=lps,
        rewards=torch.tensor([t.reward for t in trajs], dtype=torch.float32), token_rewards=tok_r,
        turn_ids=turn_ids, legal_bits=legal)


LOGIT_CHUNK_TOKENS = 512  # positions whose full-vocabulary fp32 logits exist at once


def _decoder_and_head(model):
    """(decoder, lm_head) of an HF *ForCausalLM: hidden states, then the vocabulary projection."""
    head = model.get_output_embeddings()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return decoder, head


def _hidden_states(model, decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The decoder's final hidden states [n, t, H], through the model's own forward (so FSDP2's
    root hooks gather its weights, which stay gathered for the head afterwards) with no
    position kept for logits."""
    got = []
    hook = decoder.register_forward_hook(lambda mod, args, out: got.append(out.last_hidden_state))
    try:
        model(input_ids=input_ids, attention_mask=attention_mask.long(), use_cache=False,
              logits_to_keep=torch.empty(0, dtype=torch.long, device=input_ids.device))
    finally:
        hook.remove()
    return got[-1]




def _shared_prefixes(input_ids: torch.Tensor, attention_mask: torch.Tensor, sel: torch.Tensor):
    """Rows that open on the same tokens before their first position needing logits (a GRPO
    group's members: one prompt, several completions): (the rows' prefix lengths [n], one row per
    distinct prefix, each row's prefix index [n]), or None when sharing saves under
    SHARE_MIN_FRAC of the tokens. A row's prefix ends before the first position whose hidden
    state feeds the head (so the prefix pass needs no output)."""
    has = sel.any(1)
    first = torch.where(has, sel.float().argmax(1), torch.zeros_like(has, dtype=torch.long))
    ids, lens, starts = input_ids.tolist(), attention_mask.sum(1).tolist(), first.tolist()
    index: dict[tuple[int, ...], int] = {}
    leaders, of_row, saved = [], [], 0
    for r, p in enumerate(starts):
        key = tuple(ids[r][:p])
        if p and key in index:
            saved += p
        elif p:
            index[key] = len(leaders)
            leaders.append(r)
        of_row.append(index.get(key, 0) if p else 0)
    if not leaders or saved < SHARE_MIN_FRAC * sum(lens):
        return None
    return first, leaders, of_row


def _plain_params(model) -> bool:
    """Every parameter a plain tensor (no FSDP2 / DTensor shard)."""
    return all(type(p) in (torch.Tensor, torch.nn.Parameter) for p in model.parameters())


def _hidden_states_shared(model, decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          sel: torch.Tensor, first: torch.Tensor, leaders: list[int], of_row: list[int]):
    """The final hidden states at the positions `sel` [n, t-1] (as `h[:, :-1][sel]`), with each
    distinct prefix (`_shared_prefixes`) run once: its KV, kept in the autograd graph, is
    gathered for every row that opens on it, and only the rest of each row runs per row. Prefix
    and suffix batches are right-padded (every query sees at least one real key)."""
    from transformers import DynamicCache

    dev, n = input_ids.device, input_ids.shape[0]
    lens = attention_mask.sum(1)
    lead = torch.tensor(leaders, device=dev)
    p_lead = first[lead]
    width = int(p_lead.max())
    ar = torch.arange(width, device=dev)
    pre_mask = ar[None, :] < p_lead[:, None]
    pre_ids = torch.where(pre_mask, input_ids[lead, :width], 0)
    s = int((lens - first).max())
    cols = torch.arange(s, device=dev)
    suf_mask = cols[None, :] < (lens - first)[:, None]
    src = (first[:, None] + cols[None, :]).clamp(max=input_ids.shape[1] - 1)
    suf_ids = torch.where(suf_mask, input_ids.gather(1, src), 0)
    # transformers 5.2x names the argument `cache` (`past_key_values` before)
    arg = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers 4.x
        cache = DynamicCache()
    empty = torch.empty(0, dtype=torch.long, device=dev)
    model(input_ids=pre_ids, attention_mask=pre_mask.long(), use_cache=True, logits_to_keep=empty, **{arg: cache})
    cache.batch_select_indices(torch.tensor(of_row, device=dev))
    mask = torch.cat([ar[None, :] < first[:, None], suf_mask], 1).long()  # [n, width + s]
    got = []
    hook = decoder.register_forward_hook(lambda mod, args, out: got.append(out.last_hidden_state))
    try:
        model(input_ids=suf_ids, attention_mask=mask, position_ids=first[:, None] + cols[None, :], use_cache=True,
              logits_to_keep=empty, **{arg: cache})
    finally:
        hook.remove()
    rows, ts = sel.nonzero(as_tuple=True)
    assert n == suf_ids.shape[0] and bool((ts >= first[rows]).all())
    return got[-1][rows, ts - first[rows]]


def _chunk_logprobs(head, h_KH: torch.Tensor, targets_K: torch.Tensor, temperature: float,
                    with_entropy: bool, vocab_size: int | None = None, action_ids: torch.Tensor | None = None):
    """log p(target) and the entropy at K positions from their hidden states, over the first
    `vocab_size` ids (None: all of the head's rows); the fp32 logits [K, V] live only inside this call.
    With `action_ids` [A], also log p of each of those ids [K, A] (a third value)."""
    logits = head(h_KH)[..., :vocab_size].float() / temperature
    lse = logits.logsumexp(-1)
    lp = logits.gather(-1, targets_K[:, None]).squeeze(-1) - lse
    ent = lse - (torch.softmax(logits, -1) * logits).sum(-1) if with_entropy else torch.zeros_like(lp)
    if action_ids is None:
        return lp, ent
    return lp, ent, logits[:, action_ids] - lse[:, None]


class _HeadLogprobs(torch.autograd.Function):
    """log p(target) and the entropy at K positions from their hidden states h [K, H] and a
    bias-free LM head's weight W [V, H], as `_chunk_logprobs` computes them, with a hand-written
    backward: it recomputes the chunk's logits from h and W (the [K, V] fp32 logits are never
    kept between the passes) and forms d/dlogits directly, g_lp * (onehot - p) plus, for an
    entropy with a gradient, -g_ent * p * (log p + H). Against checkpointing the head, this skips
    re-running the log-sum-exp and autograd's zero-filled scatter of the gather. `keep`: the
    micro-batch's last chunk keeps its logits for the backward instead (autograd runs that
    chunk's backward first, so one chunk's logits still exist at a time: this saves one
    recompute, a [K, H] x [H, V] matmul, per micro-batch)."""

    @staticmethod
    def forward(ctx, h_KH, weight, targets_K, temperature, vocab_size, with_entropy, keep=False):
        w = weight[:vocab_size]
        logits = (h_KH @ w.T).float()
        if temperature != 1:
            logits.div_(temperature)
        lse = logits.logsumexp(-1)
        lp = logits.gather(-1, targets_K[:, None]).squeeze(-1) - lse
        ent = lse - (torch.softmax(logits, -1) * logits).sum(-1) if with_entropy else torch.zeros_like(lp)
        ctx.save_for_backward(h_KH, weight, targets_K, lse, ent, *((logits,) if keep else ()))
        ctx.temperature, ctx.vocab_size, ctx.with_entropy = temperature, vocab_size, with_entropy
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        h_KH, weight, targets_K, lse, ent, *kept = ctx.saved_tensors
        temperature = ctx.temperature
        w = weight[:ctx.vocab_size]
        if g_lp is None:
            g_lp = torch.zeros_like(lse)
        # in place on the one [K, V] buffer: logits -> log p -> d loss / d logits
        if kept:
            grad = kept[0]
        else:
            grad = (h_KH @ w.T).float()
            if temperature != 1:
                grad.div_(temperature)
        grad.sub_(lse[:, None])
        if ctx.with_entropy and g_ent is not None:
            p = grad.exp()
            grad.add_(ent[:, None]).mul_(p).mul_(-g_ent[:, None]).sub_(p.mul_(g_lp[:, None]))
        else:
            grad.exp_().mul_(-g_lp[:, None])
        grad.scatter_add_(-1, targets_K[:, None], g_lp[:, None])
        if temperature != 1:
            grad.div_(temperature)
        grad = grad.to(w.dtype)
        g_h = grad @ w if ctx.needs_input_grad[0] else None
        g_w = None
        if ctx.needs_input_grad[1]:
            g_w = grad.T @ h_KH
            if g_w.shape[0] != weight.shape[0]:  # rows past the vocabulary cut get no gradient
                g_w = torch.cat([g_w, g_w.new_zeros(weight.shape[0] - g_w.shape[0], weight.shape[1])])
        return g_h, g_w, None, None, None, None, None


def _plain_head_weight(head) -> torch.Tensor | None:
    """The weight of a bias-free nn.Linear head held as a plain tensor (not an FSDP2 / DTensor
    shard), which `_HeadLogprobs` reads directly; None otherwise (the checkpointed path)."""
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    w = head.weight
    return w if type(w) in (torch.Tensor, torch.nn.Parameter) else None


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float,
                   with_entropy: bool = False, need: torch.Tensor | None = None,
                   chunk_tokens: int = LOGIT_CHUNK_TOKENS, vocab_size: int | None = None,
                   action_ids: torch.Tensor | None = None):
    """[n, t] log p(token t | < t) at `temperature` (column 0 is 0), optionally the entropy;
    with `action_ids` [A] (token ids), a third value: [n, t, A] log p(each action id | < t) at
    the positions that get logits (the input of the legality term, `legality_loss`).

    The softmax runs over the first `vocab_size` ids (the tokenizer's; None: every row of the
    head), as the engines sample: a checkpoint's padded embedding rows (Qwen2.5: 151,936 rows,
    151,665 tokens) are never drawn, and counting their mass would put the trainer's log-probs
    off the engine's (earl.runtime.mismatch measures the gap).

    Only positions where `need` [n, t] is True (default: every real token but the first) get
    logits, computed from the decoder's hidden states `chunk_tokens` positions at a time, so the
    full-vocabulary fp32 logits of a whole micro-batch never exist. Under autograd each chunk's
    logits are recomputed in the backward pass (`_HeadLogprobs` for a plain bias-free linear
    head, else activation checkpointing of the head), so only the hidden states are kept. Other
    positions hold 0."""
    n, t = input_ids.shape
    if need is None:
        need = attention_mask.bool()
    sel = need[:, 1:].bool() & attention_mask[:, 1:].bool()  # [n, t-1]: predicts token t+1
    decoder, head = _decoder_and_head(model)
    shared = _shared_prefixes(input_ids, attention_mask, sel) if _plain_params(model) else None
    if shared is None:
        h_KH = _hidden_states(model, decoder, input_ids, attention_mask)[:, :-1][sel]
    else:  # a group's prompt runs once (its members' completions attend to its KV)
        h_KH = _hidden_states_shared(model, decoder, input_ids, attention_mask, sel, *shared)
    targets = input_ids[:, 1:][sel]
    grad = torch.is_grad_enabled()
    weight = _plain_head_weight(head) if grad and action_ids is None else None
    lps, ents, acts = [], [], []
    for a in range(0, h_KH.shape[0], chunk_tokens):
        args = (head, h_KH[a:a + chunk_tokens], targets[a:a + chunk_tokens], temperature, with_entropy, vocab_size)
        if action_ids is not None:
            args += (action_ids.to(h_KH.device),)
            f = torch.utils.checkpoint.checkpoint if grad else (lambda fn, *xs, **_: fn(*xs))
            lp, ent, act = f(_chunk_logprobs, *args, use_reentrant=False)
            acts.append(act)
        elif weight is not None:
            last = a + chunk_tokens >= h_KH.shape[0]
            lp, ent = _HeadLogprobs.apply(args[1], weight, args[2], temperature, vocab_size, with_entropy, last)
        elif grad:
            lp, ent = torch.utils.checkpoint.checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(*args)
        lps.append(lp)
        ents.append(ent)
    dev = input_ids.device

    def place(parts: list[torch.Tensor]) -> torch.Tensor:
        out = torch.zeros(n, t - 1, dtype=torch.float32, device=dev)
        if parts:
            out = out.masked_scatter(sel, torch.cat(parts))
        return torch.nn.functional.pad(out, (1, 0))

    if action_ids is None:
        return place(lps), (place(ents) if with_entropy else None)
    act_all = torch.zeros(n, t - 1, len(action_ids), dtype=torch.float32, device=dev)
    if acts:
        act_all[sel] = torch.cat(acts)
    return place(lps), (place(ents) if with_entropy else None), torch.nn.functional.pad(act_all, (0, 0, 1, 0))


def legality_loss(action_lp: torch.Tensor, legal_bits: torch.Tensor) -> torch.Tensor:
    """Per position [n, t]: -log P(a legal action) = -log sum over the set bits i of
    `legal_bits` [n, t] of p(action i) (`action_lp` [n, t, A], token_logprobs' third value); 0
    where no bit is set. A dense signal at every move: it names every legal cell of the position,
    where the policy gradient of one sampled move names one (docs/cpu/learning/README.md)."""
    a = action_lp.shape[-1]
    listed = legal_bits > 0
    legal = ((legal_bits[..., None] >> torch.arange(a, device=legal_bits.device)) & 1).bool()
    legal = legal | ~listed[..., None]  # no list: a finite placeholder (its gradient must not be NaN)
    mass = action_lp.masked_fill(~legal, float("-inf")).logsumexp(-1)
    return torch.where(listed, -mass, torch.zeros_like(mass))


def full_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float,
                        with_entropy: bool = False, vocab_size: int | None = None):
    """The reference: fp32 logits of every position of the whole batch at once (what
    `token_logprobs` computes in chunks). For tests and the memory benchmark only."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask.long()).logits[:, :-1, :vocab_size].float()
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    lp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    lp = torch.nn.functional.pad(lp, (1, 0))
    if not with_entropy:
        return lp, None
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return lp, torch.nn.functional.pad(ent, (1, 0))


@torch.no_grad()
def batch_logprobs(model, batch: ExperienceBatch, temperature: float, token_budget: int,
                   vocab_size: int | None = None) -> torch.Tensor:
    """Forward-only log-probs of a whole batch (over the first `vocab_size` ids), micro-batched;
    only generated (loss-mask) tokens get logits, the rest are 0 (every consumer multiplies by
    the loss mask)."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    dev = next(model.parameters()).device
    for mb in micro_batches(batch.lengths.tolist(), token_budget):
        sub = batch.select(mb)
        lp, _ = token_logprobs(model, sub.input_ids.to(dev), sub.attention_mask.to(dev), temperature,
                               need=sub.loss_mask.to(dev), vocab_size=vocab_size)
        out[mb, :lp.shape[1]] = lp.cpu()
    return out * batch.loss_mask


class Trainer:
    """The clipped policy-gradient loss with token-budget micro-batching. It owns no optimizer:
    `train_step` hands it one (the `earl.runtime.optim.ReplicatedAdamW` strategy, which is plain
    AdamW on one process)."""

    def __init__(self, model: torch.nn.Module, cfg: TrainerConfig, *, temperature: float, lockstep=None,
                 vocab_size: int | None = None, action_ids: list[int] | None = None):
        self.model, self.cfg, self.temperature = model, cfg, temperature
        # token ids of the env's actions (`Env.actions`, one token each), the legality term's
        # vocabulary; None: the env lists none (or not as single tokens) and the term is off
        self.action_ids = torch.tensor(action_ids, dtype=torch.long) if action_ids else None
        self.vocab_size = vocab_size  # the tokenizer's ids the softmax runs over (None: the head's rows)
        # a process group whose ranks must run the same number of forward/backward passes
        # (FSDP2 gathers weights inside each): short ranks add passes on a dummy row
        self.lockstep = lockstep
        # (mismatch_sums, max |delta|) of the last `backward` whose batch was its own old policy
        self.gap: tuple[dict[str, float], float] = (dict.fromkeys(SUM_KEYS, 0.0), 0.0)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def lr_at(self, progress: float) -> float:
        """The learning rate at `progress` in [0, 1] of the run (the decay schedule)."""
        cfg = self.cfg
        lo = cfg.lr * cfg.lr_min_frac
        if cfg.lr_decay == "linear":
            return cfg.lr + (lo - cfg.lr) * progress
        if cfg.lr_decay == "cosine":
            return lo + (cfg.lr - lo) * 0.5 * (1 + math.cos(math.pi * progress))
        return cfg.lr

    @property
    def uses_legal_bits(self) -> bool:
        """Whether the loss has the legality term (`trainer.legal_coef`), so the batch must carry
        each move's legal actions (`legal_bits`)."""
        return bool(self.cfg.legal_coef) and self.action_ids is not None

    @property
    def needs_old_logprobs(self) -> bool:
        """Whether the experience stage must compute the old policy's log-probs for this loss.
        With one optimizer step per batch (`minibatches` 1) the weights the loss sees are the
        old policy's: the training forward's own log-probs, detached, are the old ones (the
        ratio is exactly 1), so that pass is skipped (a batch whose old_logprobs is None) and
        the engine-gap figures come from the training forward (`gap`). REINFORCE++'s KL penalty
        is part of the rewards, which the experience stage computes from them."""
        cfg = self.cfg
        return cfg.minibatches > 1 or bool(cfg.kl_coef and cfg.algo == "reinforce++")

    def backward(self, batch: ExperienceBatch, total_tokens: float,
                 total_seqs: float | None = None) -> dict[str, float]:
        """Forward + backward of the loss over `batch` (None: nothing local, lockstep passes
        only), token-summed and divided by the global (mini)batch's `total_tokens` (its loss
        tokens), or for `loss_agg` sequence / constant by its `total_seqs` sequences (None: this
        batch's), so dp shards add up to the single-process gradient. Returns token sums of the
        loss terms. A batch without old log-probs is its own old policy (`needs_old_logprobs`);
        then `self.gap` holds its (`mismatch_sums`, max |delta|) against the engine."""
        cfg, dev = self.cfg, self.device
        sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "entropy": 0.0, "legal_loss": 0.0}
        self.gap = (dict.fromkeys(SUM_KEYS, 0.0), 0.0)
        self.model.train()
        mbs = micro_batches(batch.lengths.tolist(), cfg.token_budget) if batch is not None else []
        if self.lockstep is not None:
            most = torch.tensor([len(mbs)], device=comm_device())
            torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX, group=self.lockstep)
            for _ in range(int(most) - len(mbs)):  # same passes on every rank; adds 0 to the grads
                ids = torch.zeros(1, 2, dtype=torch.long, device=dev)
                lp, _ = token_logprobs(self.model, ids, torch.ones_like(ids), self.temperature)
                (lp.sum() * 0.0).backward()
        if total_seqs is None:
            total_seqs = float(batch.size) if batch is not None else 0.0
        denom = loss_denominator(cfg.loss_agg, total_tokens, total_seqs, cfg.loss_tokens)
        # the entropy is in the loss only with a bonus; else its metric is the Monte-Carlo
        # estimate -log p(sampled token), which costs nothing (the tokens were drawn from pi)
        with_entropy = cfg.entropy_coef != 0
        for mb in mbs:
            sub = batch.select(mb)
            t = {k: v.to(dev) for k, v in sub.tensors().items()}
            mask = t["loss_mask"].float()
            legal = self.uses_legal_bits and "legal_bits" in t
            lp, ent, *act = token_logprobs(self.model, t["input_ids"], t["attention_mask"],
                                           self.temperature, with_entropy=with_entropy, need=t["loss_mask"],
                                           vocab_size=self.vocab_size, action_ids=self.action_ids if legal else None)
            old = t["old_logprobs"] if "old_logprobs" in t else lp.detach()
            if "old_logprobs" not in t:
                g, top = mismatch_sums(old, t["engine_logprobs"], t["loss_mask"], cfg.tis_cap)
                self.gap = ({k: self.gap[0][k] + g[k] for k in SUM_KEYS}, max(self.gap[1], top))
            ratio = policy_ratio(lp, old, mask, cfg.ratio_level)
            pg, clipped = clipped_pg(ratio, t["advantages"], cfg.clip_low, cfg.clip_high, cfg.dual_clip)
            if cfg.tis_cap:  # the tokens came from the engine, not from the old policy
                pg = pg * tis_weights(old, t["engine_logprobs"], cfg.tis_cap)
            loss_tok = pg - cfg.entropy_coef * ent if with_entropy else pg
            if legal:
                illegal = legality_loss(act[0], t["legal_bits"] * t["loss_mask"])
                loss_tok = loss_tok + cfg.legal_coef * illegal
                sums["legal_loss"] += float((illegal.detach() * mask).sum())
            if cfg.kl_coef and cfg.algo in GROUP_ALGOS:
                if "ref_logprobs" not in t:
                    raise ValueError(f"trainer.kl_coef > 0 with {cfg.algo} needs reference log-probs in the batch")
                kl = kl_estimate(lp, t["ref_logprobs"], cfg.kl_estimator)
                if cfg.kl_ratio_weighted:
                    kl = kl * ratio
                loss_tok = loss_tok + cfg.kl_coef * kl
                sums["kl"] += float((kl.detach() * mask).sum())
            elif "ref_logprobs" in t:
                sums["kl"] += float(((lp.detach() - t["ref_logprobs"]) * mask).sum())
            loss = (loss_tok * token_weights(mask, cfg.loss_agg)).sum() / denom
            loss.backward()
            sums["loss"] += float(loss.detach()) * total_tokens
            sums["pg_loss"] += float((pg.detach() * mask).sum())
            sums["clip_frac"] += float((clipped.float() * mask).sum())
            sums["entropy"] += float(((ent.detach() if with_entropy else -lp.detach()) * mask).sum())
        return sums


def train_step(trainer: Trainer, optim, local: ExperienceBatch, *, progress: float = 0.0,
               generator: torch.Generator | None = None) -> dict:
    """One training step: `minibatches` optimizer steps of `optim` (an earl.runtime.optim
    strategy) over the global batch, given this rank's dp share `local` (every tp rank of a dp
    group passes the same share). Each rank splits its share the same number of ways, so all dp
    ranks step together. Returns global token-weighted stats (identical on every rank)."""
    lr = trainer.lr_at(progress)
    for group in optim.inner.param_groups:
        group["lr"] = lr
    k = trainer.cfg.minibatches
    n = local.size
    perm = torch.randperm(n, generator=generator) if k > 1 else torch.arange(n)
    chunks = [perm[i * n // k:(i + 1) * n // k].tolist() for i in range(k)]
    keys = ("loss", "pg_loss", "kl", "clip_frac", "entropy", "legal_loss")
    totals = dict.fromkeys(keys, 0.0)
    norms, tokens, steps = [], 0.0, 0
    for idx in chunks:
        sub = local.select(idx) if idx else None
        n_local = float(sub.loss_mask.sum()) if sub is not None else 0.0
        optim.zero_grad(set_to_none=True)
        n_global, seqs_global = optim.dp_sum([n_local, float(len(idx))])
        if n_global == 0:
            continue
        if (sub is not None and n_local) or trainer.lockstep is not None:
            sums = trainer.backward(sub if n_local else None, n_global, seqs_global)
        else:
            sums = dict.fromkeys(keys, 0.0)
        norms.append(optim.step())
        reduced = optim.dp_sum([sums[key] for key in keys])
        for key, v in zip(keys, reduced, strict=True):
            totals[key] += v / n_global
        tokens += n_global
        steps += 1
    out = {key: v / max(steps, 1) for key, v in totals.items()}
    out["grad_norm"] = sum(norms) / len(norms) if norms else float("nan")
    out["train_tokens"] = tokens
    out["lr"] = lr
    return out
