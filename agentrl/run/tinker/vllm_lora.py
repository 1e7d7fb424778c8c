"""Sampling through vLLM's multi-LoRA (``sampler.backend: vllm``).

The engine keeps training with transformers + peft; its sampling requests go to a vLLM
engine started with ``enable_lora``: each sampler snapshot is a peft-format folder
(``adapter_config.json`` + ``adapter_model.safetensors``, written beside the snapshot the
first time it is sampled) named in a ``LoRARequest``, and every request of a batch is
submitted at once, so vLLM's scheduler decodes rows of several adapters in the same steps
(punica kernels; ``max_loras`` adapters resident, others swapped from host memory).

The engine is agentrl's :class:`~agentrl.samplers.vllm.VLLMSampler` (its options, its
start and close, ``logprobs_mode=processed_logprobs``: the log-probs are agentrl's
definition, ``log_softmax(logits / T)``, exactly when top_k = 0 and top_p = 1), driven
through its ``AsyncLLM`` from a blocking portal (the engine's calls run on the server's
worker thread). LoRA sizes come from ``sampler.options.engine_kwargs``: ``max_lora_rank``
(default 32, Tinker's default rank) and ``max_loras`` (default 8).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import uuid
from pathlib import Path
from typing import Any

from agentrl.run.tinker.adapters import PEFT_FOLDER, RequestError
from agentrl.run.tinker.decode import BASE, Request, prompt_logprobs
from agentrl.run.tinker.wire import Sequence
from agentrl.samplers.settings import SamplerSettings

DEFAULT_MAX_LORA_RANK = 32
DEFAULT_MAX_LORAS = 8


class VLLMLoraSampler:
    """A vLLM engine serving the base model and any number of LoRA snapshots."""

    def __init__(self, settings: SamplerSettings, eos_token_id: int | None) -> None:
        from anyio.from_thread import start_blocking_portal

        from agentrl.samplers.vllm import VLLMSampler

        engine_kwargs = dict(settings.options.get("engine_kwargs") or {})
        engine_kwargs.setdefault("enable_lora", True)
        engine_kwargs.setdefault("max_lora_rank", DEFAULT_MAX_LORA_RANK)
        engine_kwargs.setdefault("max_loras", DEFAULT_MAX_LORAS)
        self.max_lora_rank = int(engine_kwargs["max_lora_rank"])
        options = {**settings.options, "engine_kwargs": engine_kwargs}
        self.sampler = VLLMSampler.from_settings(dataclasses.replace(settings, options=options))
        self.eos = eos_token_id
        self._ids: dict[str, int] = {}
        self._next_id = itertools.count(1)
        self._portal_cm = start_blocking_portal(backend="asyncio")
        self._portal = self._portal_cm.__enter__()
        try:
            self._portal.call(self.sampler.start)
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise

    def close(self) -> None:
        try:
            self._portal.call(self.sampler.close)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def lora(self, path: str, folder: Path) -> Any:
        """The LoRARequest of snapshot `path`, whose peft folder is `folder`."""
        from vllm.lora.request import LoRARequest

        if path not in self._ids:
            self._ids[path] = next(self._next_id)
        return LoRARequest(path, self._ids[path], str(folder))

    def forget(self, path: str) -> None:
        """`path` was deleted or re-saved: the next request loads it again under a new id."""
        self._ids.pop(path, None)

    def sample_batch(
        self, engine: Any, jobs: list[tuple[str | None, Request]], seed: int | None
    ) -> list[Any]:
        """`engine`'s :meth:`~agentrl.run.tinker.engine.Engine.sample_batch` through vLLM:
        every snapshot is a LoRARequest. Prompt log-probs are scored by `engine` (peft, the
        training model's forward): with ``enable_lora`` vLLM 0.32's CPU kernels fail on them
        (``einsum(): subscript b has size 4 for operand 1 which does not broadcast with
        previously seen size 9``, in punica_cpu ``add_lora_logits``) and its engine dies."""
        out: list[Any] = [None] * len(jobs)
        ready: list[tuple[int, Any, Request, list[float] | None]] = []
        keep = {path for path, _ in jobs if path is not None}
        for i, (path, request) in enumerate(jobs):
            try:
                engine.check_sample(request)
                lora = None if path is None else self._lora(engine, path)
                scored = None
                if request.prompt_logprobs:
                    request.adapter = BASE if path is None else engine._slot(path, keep)
                    scored = prompt_logprobs(engine._forward, request, engine.device)
                    request = dataclasses.replace(request, prompt_logprobs=False)
                ready.append((i, lora, request, scored))
            except RequestError as e:
                out[i] = e
        if ready:
            results = self.sample([(lora, r) for _, lora, r, _ in ready], seed)
            for (i, _, _, scored), seqs in zip(ready, results, strict=True):
                out[i] = (seqs, scored)
        return out

    def _lora(self, engine: Any, path: str) -> Any:
        """The LoRARequest of snapshot `path` (its peft folder written the first time)."""
        folder, _ = engine._folder(path)
        if not (folder / PEFT_FOLDER / "adapter_model.safetensors").is_file():
            spec, tensors, _ = engine._read(path)
            if spec.rank > self.max_lora_rank:
                raise RequestError(
                    f"{path} has LoRA rank {spec.rank}; the vLLM sampler takes ranks up to "
                    f"{self.max_lora_rank} (sampler.options.engine_kwargs.max_lora_rank)"
                )
            tensors = {k: t.cpu() for k, t in tensors.items()}
            write_peft_folder(folder, tensors, spec.rank, spec.alpha, engine._targets(spec))
        return self.lora(path, folder / PEFT_FOLDER)

    def sample(
        self, jobs: list[tuple[Any, Request]], seed: int | None = None
    ) -> list[list[Sequence]]:
        """Each (LoRARequest or None, request)'s sequences, all submitted together."""

        async def run() -> list[Any]:
            return await asyncio.gather(*(self._one(lora, r, seed) for lora, r in jobs))

        return self._portal.call(run)

    def _params(self, r: Request, seed: int | None) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        p = r.params
        stops = set(p.stop_tokens)
        return SamplingParams(
            n=r.num_samples,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            seed=p.seed if p.seed is not None else seed,
            max_tokens=p.max_tokens,
            logprobs=0,
            ignore_eos=self.eos not in stops,  # Tinker: stop=[] never stops early
            stop_token_ids=sorted(stops - {self.eos}),
            stop=list(p.stop_strings) or None,
            output_kind=RequestOutputKind.FINAL_ONLY,  # one output with all n samples
        )

    async def _one(self, lora: Any, r: Request, seed: int | None) -> list[Sequence]:
        final = None
        stream = self.sampler.engine.generate(
            {"prompt_token_ids": list(r.prompt)},
            self._params(r, seed),
            request_id=f"tinker-{uuid.uuid4().hex}",
            lora_request=lora,
        )
        async for out in stream:
            final = out
        assert final is not None
        seqs = [
            Sequence(
                list(o.token_ids),
                [lps[t].logprob for t, lps in zip(o.token_ids, o.logprobs, strict=True)],
                o.finish_reason == "stop",
            )
            for o in sorted(final.outputs, key=lambda o: o.index)
        ]
        return seqs


def write_peft_folder(
    folder: Path, tensors: dict[str, Any], rank: int, alpha: float, targets: list[str]
) -> Path:
    """The adapter of a snapshot as peft saves one (what vLLM's LoRARequest loads)."""
    from safetensors.torch import save_file

    out = folder / PEFT_FOLDER
    if (out / "adapter_model.safetensors").is_file():
        return out
    tmp = folder / f".{PEFT_FOLDER}-{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted(targets),
        "fan_in_fan_out": False,
        "modules_to_save": None,
    }
    (tmp / "adapter_config.json").write_text(json.dumps(config, indent=1))
    peft_names = {f"base_model.model.{k}": v.contiguous() for k, v in tensors.items()}
    save_file(peft_names, str(tmp / "adapter_model.safetensors"))
    tmp.rename(out)
    return out
