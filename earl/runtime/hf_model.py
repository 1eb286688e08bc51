"""Build or load the policy model: a built-in tiny config initialised randomly, or an HF causal
LM (Qwen2 / Llama families) from a local directory of safetensors weights. Never downloads.

Model code here knows nothing about parallelism: the multi-process runtime shards the module
this returns (build, then apply TP / FSDP), and the engine and trainer take it as an argument.

    python -c "from earl.runtime.hf_model import load_policy; print(load_policy('tiny').spec)"
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from pathlib import Path

import torch

from earl.parallel import ParamShape
from earl.runtime.tokenizer import CharTokenizer, Tokenizer, load_tokenizer
from earl.runtime.tp import param_shapes
from earl.specs import MODEL_CATALOG, ModelSpec

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BUILTIN_MODELS = tuple(n for n, m in MODEL_CATALOG.items()
                       if n.startswith("tiny") and m.vocab_size == CharTokenizer().vocab_size)


@dataclass
class Policy:
    """A causal LM, its tokenizer and its shapes."""

    model: torch.nn.Module  # a transformers *ForCausalLM
    tokenizer: Tokenizer
    spec: ModelSpec  # shapes, for the cost model and the selector
    source: str  # "tiny" or the checkpoint directory


def hf_config_from_spec(spec: ModelSpec, dtype: str):
    """A transformers config object with the shapes of `spec`."""
    from transformers import AutoConfig

    d = spec.to_hf_dict()
    model_type = d.pop("model_type")
    d.pop("architectures")
    d["torch_dtype"] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]
    return AutoConfig.for_model(model_type, **d)


def check_dtype(dtype: str) -> torch.dtype:
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"model dtype {dtype!r} unknown; valid: {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[dtype]


def build_builtin(name: str, *, seed: int, dtype: str = "fp32") -> Policy:
    """A randomly initialised built-in model (`tiny`, ...) with the built-in tokenizer.
    The same `seed` gives the same weights, so a frozen reference can be rebuilt exactly."""
    from transformers import AutoModelForCausalLM

    torch_dtype = check_dtype(dtype)
    spec = MODEL_CATALOG[name]
    cfg = hf_config_from_spec(spec, dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg).to(torch_dtype)
    return Policy(model=model, tokenizer=CharTokenizer(), spec=spec, source=name)


def check_model_path(path: str, weights: bool = True) -> None:
    """Cheap checks (no weights read): a built-in name, or a directory with config.json and
    (unless `weights` is false: a reader of its shapes only) safetensors weights."""
    if path in BUILTIN_MODELS:
        return
    d = Path(path)
    if not d.exists():
        raise ValueError(f"model {path!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) "
                         "nor an existing directory")
    if not d.is_dir():
        raise ValueError(f"model path {str(path)!r} is not a directory; give a local HF checkpoint "
                         f"directory or one of: {', '.join(BUILTIN_MODELS)}")
    if not (d / "config.json").is_file():
        raise ValueError(f"model directory {d} has no config.json")
    if weights and not list(d.glob("*.safetensors")):
        raise ValueError(f"model directory {d} has no *.safetensors weights "
                         "(only safetensors checkpoints are loaded)")


def load_hf(path: str | Path, *, dtype: str = "fp32") -> Policy:
    """Load a local HF checkpoint directory (config.json + *.safetensors [+ tokenizer])."""
    from transformers import AutoModelForCausalLM

    torch_dtype = check_dtype(dtype)
    d = Path(path)
    check_model_path(str(d))
    spec = ModelSpec.from_hf_config(d)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(d), local_files_only=True, dtype=torch_dtype,
                                                     use_safetensors=True)
    except Exception as e:  # noqa: BLE001 - safetensors/transformers raise many kinds
        raise ValueError(f"cannot load the model in {d}: {type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0]}") from None
    tok = load_tokenizer(d, spec.vocab_size)
    return Policy(model=model, tokenizer=tok, spec=spec, source=str(d))


def load_policy(path: str, *, seed: int = 0, dtype: str = "fp32") -> Policy:
    """`path` is a built-in name (see BUILTIN_MODELS) or a local checkpoint directory."""
    check_model_path(path)
    if path in BUILTIN_MODELS:
        return build_builtin(path, seed=seed, dtype=dtype)
    return load_hf(path, dtype=dtype)


def model_shapes(path: str) -> dict[str, ParamShape]:
    """Full parameter shapes of the model `path` names (built-in or HF directory) from its config
    alone: the module is built on the meta device, no weights are read or allocated."""
    from transformers import AutoConfig, AutoModelForCausalLM

    check_model_path(path, weights=False)  # a checkpoint kept as its config.json (`earl validate --rescore`)
    if path in BUILTIN_MODELS:
        config = hf_config_from_spec(MODEL_CATALOG[path], "fp32")
    else:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    with torch.device("meta"):
        return param_shapes(AutoModelForCausalLM.from_config(config))


def save_hf(policy: Policy, directory: str | Path) -> None:
    """Write an HF checkpoint directory (safetensors) that `load_hf` reads back."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(str(d), safe_serialization=True)
    if isinstance(policy.tokenizer, CharTokenizer):
        policy.tokenizer.save(d)
    else:
        policy.tokenizer.tok.save_pretrained(str(d))


def empty_like_policy(policy: Policy, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A model of the policy's architecture and dtype (or `dtype`) with uninitialised weights (no
    file read, no init kernels): a re-shard or a checkpoint fills it. Buffers (rotary tables)
    are real."""
    from transformers import AutoModelForCausalLM

    try:
        from transformers.modeling_utils import no_init_weights
    except ImportError:  # pragma: no cover - older transformers
        no_init_weights = contextlib.nullcontext
    dtype = dtype or next(policy.model.parameters()).dtype
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(policy.model.config)
    return model.to(dtype)


def cache_kwarg(model: torch.nn.Module) -> str:
    """The forward() keyword for the KV cache: `cache` in new transformers, else the old name."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
