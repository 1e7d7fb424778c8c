"""A vLLM worker extension: weight reloads that also refresh a tied LM head.

vLLM 0.32 reloads weights in place layer by layer and re-runs each loaded layer's
``process_weights_after_loading``. A model with tied embeddings (SmolLM2, Qwen2.5-0.5B,
Llama 3.2 1B/3B) never loads ``lm_head.weight``: its LM head shares the embedding parameter,
whose values change, but on CPU the head computes with a copy packed at start-up
(``dispatch_cpu_unquantized_gemm``), so logits kept coming from the initial head. Reloading
through :meth:`AgentRLWorkerExtension.agentrl_reload_weights` repacks the head after the
reload. The vllm sampler starts its engine with this class; a ``vllm serve`` that the
openai sampler reloads takes ``--worker-extension-cls`` with :data:`WORKER_EXTENSION`.

Imported inside vLLM's worker processes: no import of vLLM here at module level.
"""

from __future__ import annotations

from typing import Any

WORKER_EXTENSION = "agentrl.samplers.vllm_worker.AgentRLWorkerExtension"
RELOAD_METHOD = "agentrl_reload_weights"


def refresh_tied_lm_head(model: Any) -> bool:
    """Repack `model`'s LM head when it shares its weight with the input embeddings, on CPU
    (elsewhere the head computes with the shared weight itself); returns whether it did."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    head_weight = getattr(lm_head, "weight", None)
    if head_weight is None or embed is None or not hasattr(lm_head, "quant_method"):
        return False
    if head_weight.data_ptr() != embed.weight.data_ptr():
        return False  # an untied head: reloaded and repacked like every other layer
    lm_head.quant_method.process_weights_after_loading(lm_head)
    return True


class AgentRLWorkerExtension:
    """Methods mixed into vLLM's worker class (``worker_extension_cls``)."""

    def agentrl_reload_weights(self, weights_path: str) -> bool:
        """``reload_weights`` from a safetensors folder, then the tied-head refresh."""
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)  # type: ignore[attr-defined]
        return refresh_tied_lm_head(self.model_runner.get_model())  # type: ignore[attr-defined]
