"""The part of the vLLM backend that runs inside vLLM's own processes.

vLLM imports these two classes by name in its engine-core and worker processes (started with
spawn): `WorkerExtension` is mixed into its worker (`worker_extension_cls=`) and receives the
trainer's weights through `LLM.collective_rpc`; `PaddingMask` is a batch-level logits processor
(`logits_processors=`) that keeps the sampler off the model's padding ids. This module imports
vllm at the top, so only vLLM's processes (and tests that have vllm) import it; the engine that
drives them is earl.runtime.engine.vllm.

    python -m pytest -q -m vllm tests/runtime/test_engine_vllm.py
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from earl.runtime.engine.vllm import TOKENIZER_VOCAB_KEY, mask_padding_logits, receive_bucket


class PaddingMask(LogitsProcessor):
    """Sets the logits of ids at or past the tokenizer's size to -inf for every request of the
    batch: one slice fill per decode step, whatever the number of padding ids (a per-request
    `logit_bias` map costs vLLM a scatter per request and step: 0.55x of the built-in engine's
    tokens/s on a model with a large padded embedding, as issue #21 measured). Applied before sampling, so vLLM's
    processed log-probs are normalised over the tokenizer's ids, as the built-in engine's are.
    The tokenizer's size arrives in `additional_config[TOKENIZER_VOCAB_KEY]`."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.vocab = int((vllm_config.additional_config or {}).get(TOKENIZER_VOCAB_KEY, 0))

    def is_argmax_invariant(self) -> bool:
        return False  # a padding id could be the argmax of a random model

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass  # the same mask for every request: no per-request state

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return mask_padding_logits(logits, self.vocab)


class WorkerExtension:
    """Mixed by vLLM into its worker class; called through `LLM.collective_rpc("earl_...")`.
    `self.model_runner`, `self.device` and `reload_weights` belong to the vLLM worker.

    Buckets are kept until `earl_finish_weights`, which hands all of them to the worker's own
    `reload_weights` (checkpoint format): vLLM re-runs each layer's post-load processing there,
    which a plain `load_weights` on a loaded model skips (on the CPU it fails outright: the
    repacked parameters have lost their `weight_loader`)."""

    def earl_load_bucket(self, meta: list[dict], buffer) -> None:
        pending = getattr(self, "_earl_pending", None)
        if pending is None:
            pending = self._earl_pending = []
        pending.append(receive_bucket(meta, buffer, self.device))

    def earl_finish_weights(self) -> list[str]:
        """Load the buckets received since the last call; returns the names loaded (HF names)."""
        named = [t for bucket in getattr(self, "_earl_pending", None) or [] for t in bucket]
        self._earl_pending = []
        model = self.model_runner.model
        if hasattr(self, "reload_weights"):
            self.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
            refresh_cpu_gemms(model)
        else:  # an older vLLM: its loader writes the unprocessed (GPU, unquantized) parameters
            model.load_weights(weights=named)
        return [n for n, _ in named]


def refresh_cpu_gemms(model: torch.nn.Module) -> None:
    """Re-pack the CPU GEMMs of layers that keep their weight (the embedding, and the LM head
    tied to it). vLLM's layerwise reload processes one of two tied parents only (its documented
    limit): on the CPU the tied LM head kept a oneDNN copy of the *old* embedding, so after an
    update vLLM's log-probs were those of the new body with the old head (0.02 nats off the
    trainer's after one step; tests/runtime/test_engine_vllm.py now compares them). Layers whose
    weight vLLM moved into a packed kernel (weight emptied) were re-processed by the reload."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.ndim == 2 \
                and weight.numel() > 0:
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
