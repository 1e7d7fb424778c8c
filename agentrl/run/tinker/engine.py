"""One base model, many LoRA adapters: what each Tinker training client trains and samples.

Every training client (``create_model``) is one peft adapter injected into the shared base
model, with its own AdamW over that adapter's tensors; the base weights are frozen and held
once. ``forward_backward`` activates the client's adapter, runs the batch and accumulates
gradients on that adapter only; ``optim_step`` steps its optimizer. A sampler snapshot
(``save_weights_for_sampler``) is a copy of an adapter written to disk, loaded into a
sampling slot (its own adapter) when a sampling client asks for it; the most recently used
:data:`SAMPLER_SLOTS` stay resident, so memory does not grow with the snapshots an RL loop
saves every step. All calls run on the server's one worker thread (peft's active adapter is
model-wide state), so requests of different clients are served in turn.

On disk (``state_dir``), a ``tinker://MODEL_ID/KIND/NAME`` path is the folder
``state_dir/MODEL_ID/KIND/NAME`` with ``adapter.safetensors`` (peft names, adapter name
stripped), ``lora.json`` (base model, rank, targets) and, for ``weights`` (save_state),
``optimizer.pt``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from agentrl.models import cache_kwargs
from agentrl.run.tinker import losses
from agentrl.run.tinker.adapters import (
    EPHEMERAL,
    EPHEMERAL_KEEP,
    OPTIMIZER_STATE,
    PEFT_FOLDER,
    SAMPLER_SLOTS,
    LoraSpec,
    RequestError,
    TrainingModel,
    canonical,
    check_sample,
    checkpoint_folder,
    linear_layers,
    unknown_model,
)
from agentrl.run.tinker.decode import BASE, Request, decode, prompt_logprobs
from agentrl.run.tinker.interop import LORA_META, read_run_adapter
from agentrl.run.tinker.wire import ForwardBackwardCall
from agentrl.runfolder import ADAPTER_WEIGHTS


class Engine:
    """The base model with its adapters; every method runs on the worker thread."""

    def __init__(
        self, base_model: str, model: Any, tokenizer: Any, state_dir: Path, device: str = "cpu"
    ) -> None:
        self.base_model = base_model
        self.lm = model  # the transformers model; peft injects adapters into it in place
        self.tokenizer = tokenizer
        self.state_dir = Path(state_dir)
        self.device = torch.device(device)
        self.peft: Any = None
        self.models: dict[str, TrainingModel] = {}
        self.slots: OrderedDict[str, str] = OrderedDict()  # sampler path -> adapter name
        self.vllm: Any = None  # a VLLMLoraSampler: sampling through vLLM (sampler.backend: vllm)
        self._adapters = 0
        for p in self.lm.parameters():
            p.requires_grad_(False)
        self._layers = linear_layers(self.lm)  # before peft wraps them

    @property
    def context_length(self) -> int:
        return int(getattr(self.lm.config, "max_position_embeddings", 2048))

    @property
    def placement(self) -> str:
        return f"in this process, {self.device}"

    @property
    def pids(self) -> list[int]:
        return [os.getpid()]

    @property
    def arch(self) -> str | None:
        return getattr(self.lm.config, "model_type", None)

    def base_bytes(self) -> int:
        """Bytes of base weights this process holds (its shard under FSDP)."""
        total = 0
        for name, p in self.lm.named_parameters():
            if ".lora_" in name:
                continue
            local = p.to_local() if hasattr(p, "to_local") else p
            total += local.numel() * local.element_size()
        return total

    def close(self) -> None:
        """Stop the vLLM engine if there is one (a remote engine's proxy stops its process)."""
        if self.vllm is not None:
            self.vllm.close()
            self.vllm = None

    def describe_model(self, model_id: str) -> tuple[LoraSpec, int]:
        """(spec, optimizer steps) of a training model: what the HTTP side shows of it."""
        tm = self.model(model_id)
        return tm.spec, tm.steps

    def adapter_state(self, model_id: str) -> dict[str, Tensor]:
        """A copy of the model's LoRA tensors on the host (tests compare them bitwise)."""
        return {k: p.detach().cpu().clone() for k, p in self.model(model_id).params.items()}

    # --- adapters ------------------------------------------------------------------------

    def _targets(self, spec: LoraSpec) -> list[str]:
        if spec.targets:
            unknown = sorted(set(spec.targets) - set(self._layers))
            if unknown:
                raise RequestError(
                    f"LoRA targets {unknown} are not linear layers of {self.base_model} "
                    f"(it has {', '.join(sorted(self._layers))})"
                )
            return sorted(spec.targets)
        wanted = {"attn": spec.train_attn, "mlp": spec.train_mlp, "unembed": spec.train_unembed}
        picked = sorted(leaf for leaf, kind in self._layers.items() if wanted[kind])
        if not picked:
            raise RequestError(
                "lora_config: train_attn, train_mlp and train_unembed pick no layer of this model"
            )
        return picked

    def _add_adapter(self, spec: LoraSpec) -> tuple[str, dict[str, torch.nn.Parameter]]:
        from peft import LoraConfig, get_peft_model

        if spec.rank < 1:
            raise RequestError(f"lora_config.rank must be >= 1 (got {spec.rank})")
        self._adapters += 1
        name = f"a{self._adapters}"
        cfg = LoraConfig(
            r=spec.rank,
            lora_alpha=spec.alpha,
            lora_dropout=0.0,
            target_modules=self._targets(spec),
            bias="none",
            task_type="CAUSAL_LM",
        )
        seed = spec.seed if spec.seed is not None else secrets.randbits(31)
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # a LoRA on a tied LM head adds to the head's output only; the embedding stays
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
            torch.manual_seed(seed)
            if self.peft is None:
                self.peft = get_peft_model(self.lm, cfg, adapter_name=name)
            else:
                self.peft.add_adapter(name, cfg)
        self.peft.eval()  # no dropout anywhere; peft's mixed-adapter batches need eval mode
        params = {
            canonical(n, name): p
            for n, p in self.lm.named_parameters()
            if f".lora_A.{name}." in n or f".lora_B.{name}." in n
        }
        for p in params.values():
            p.requires_grad_(True)
        return name, params

    def _activate(self, adapter: str) -> None:
        self.peft.set_adapter(adapter)
        # peft marks only the active adapter trainable; the snapshots never train
        for tm in self.models.values():
            for p in tm.params.values():
                p.requires_grad_(tm.adapter == adapter)

    def create_model(self, model_id: str, spec: LoraSpec) -> dict[str, Any]:
        if model_id in self.models:
            raise RequestError(f"model {model_id} exists already")
        adapter, params = self._add_adapter(spec)
        optimizer = torch.optim.AdamW(
            list(params.values()), lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0
        )
        self.models[model_id] = TrainingModel(model_id, adapter, spec, params, optimizer)
        return {"model_id": model_id, "type": "create_model"}

    def model(self, model_id: str) -> TrainingModel:
        tm = self.models.get(model_id)
        if tm is None:
            raise unknown_model(model_id)
        return tm

    def unload(self, model_id: str) -> dict[str, Any]:
        tm = self.model(model_id)
        for path in tm.ephemeral:  # its session is over: no sampling client is left
            self._drop(path)
        self.peft.delete_adapter(tm.adapter)
        del self.models[model_id]
        return {"model_id": model_id, "type": "unload_model"}

    # --- training ------------------------------------------------------------------------

    def forward_backward(
        self, call: ForwardBackwardCall, loss_scale: float = 1.0
    ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        tm = self.model(call.model_id)
        losses.check(call.loss_fn, call.data, call.config)
        longest = max(len(d.tokens) for d in call.data)
        if longest > self.context_length:
            raise RequestError(
                f"a datum has {longest} tokens; {self.base_model} takes {self.context_length}"
            )
        self._activate(tm.adapter)
        ids = torch.zeros(len(call.data), longest, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, d in enumerate(call.data):
            ids[i, : len(d.tokens)] = torch.tensor(d.tokens)
            mask[i, : len(d.tokens)] = 1
        grad = torch.enable_grad() if not call.forward_only else torch.no_grad()
        outputs, total = [], None
        with grad:
            logits = self.lm(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device)
            ).logits
            for i, d in enumerate(call.data):
                logp_all = torch.log_softmax(logits[i, : len(d.tokens)].float(), dim=-1)
                target = torch.as_tensor(
                    d.inputs["target_tokens"].astype(np.int64), device=logp_all.device
                )
                flat = target.reshape(len(d.tokens), -1)
                logp = logp_all.gather(-1, flat).reshape(target.shape)
                per_token = losses.elementwise(call.loss_fn, logp, d, call.config)
                s = per_token.sum()
                total = s if total is None else total + s
                outputs.append(
                    {
                        "logprobs": logp.detach().cpu().numpy(),
                        "elementwise_loss": per_token.detach().cpu().numpy(),
                    }
                )
            assert total is not None
            if not call.forward_only:
                (total * loss_scale).backward()  # 0: a rank's padding datum (FSDP lockstep)
        return outputs, {"loss:sum": float(total.detach())}

    def optim_step(self, model_id: str, adam: dict[str, float]) -> dict[str, Any]:
        tm = self.model(model_id)
        lr = float(adam.get("learning_rate", 1e-4))
        if lr < 0:
            raise RequestError(f"adam_params.learning_rate must be >= 0 (got {lr})")
        params = list(tm.params.values())
        self._combine_gradients(params)
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        clip = float(adam.get("grad_clip_norm", 0.0))
        if clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, clip, norm)
        for group in tm.optimizer.param_groups:
            group["lr"] = lr
            group["betas"] = (float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.95)))
            group["eps"] = float(adam.get("eps", 1e-12))
            group["weight_decay"] = float(adam.get("weight_decay", 0.0))
        tm.optimizer.step()
        tm.optimizer.zero_grad(set_to_none=True)
        tm.steps += 1
        return {"metrics": {"grad_norm:mean": float(norm)}}

    def _combine_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Where several processes hold copies of the adapter, sum their gradients (ranks)."""

    # --- checkpoints ---------------------------------------------------------------------

    def _folder(self, path: str) -> tuple[Path, str]:
        return checkpoint_folder(self.state_dir, path)

    def _write(self, tm: TrainingModel, kind: str, name: str, optimizer: bool) -> str:
        from safetensors.torch import save_file

        if not name or "/" in name:
            raise RequestError(f"checkpoint name {name!r} must be non-empty and without '/'")
        path = f"tinker://{tm.model_id}/{kind}/{name}"
        folder, _ = self._folder(path)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(folder / PEFT_FOLDER, ignore_errors=True)  # vLLM's copy of a re-saved name
        tensors = {k: p.detach().cpu().contiguous() for k, p in tm.params.items()}
        save_file(tensors, str(folder / ADAPTER_WEIGHTS))
        meta = tm.spec.as_json(self.base_model) | {"steps": tm.steps}
        (folder / LORA_META).write_text(json.dumps(meta, indent=1))
        if optimizer:
            torch.save(_optimizer_state(tm), folder / OPTIMIZER_STATE)
        return path

    def save_state(self, model_id: str, name: str) -> dict[str, Any]:
        tm = self.model(model_id)
        return {"path": self._write(tm, "weights", name, optimizer=True), "type": "save_weights"}

    def save_for_sampler(self, model_id: str, name: str | None) -> str:
        """A named snapshot stays on disk; an unnamed one (save_weights_and_get_sampling_client,
        ephemeral in Tinker) is deleted once :data:`EPHEMERAL_KEEP` newer ones of its model
        exist, so an RL loop that saves every step does not fill the disk."""
        tm = self.model(model_id)
        unnamed = f"{EPHEMERAL}-step{tm.steps}-{secrets.token_hex(3)}"
        path = self._write(tm, "sampler_weights", name or unnamed, False)
        self._evict(path)  # a re-saved name replaces the resident copy (read back from disk)
        if name is None:
            tm.ephemeral.append(path)
            while len(tm.ephemeral) > EPHEMERAL_KEEP:
                self._drop(tm.ephemeral.pop(0))
        return path

    def _drop(self, path: str) -> None:
        self._evict(path)
        shutil.rmtree(self._folder(path)[0], ignore_errors=True)

    def _read(self, path: str) -> tuple[LoraSpec, dict[str, torch.Tensor], Path | None]:
        """(spec, adapter tensors, folder with optimizer state or None) of a tinker:// path,
        or of a local agentrl run / checkpoint trained with model.lora."""
        from safetensors.torch import load_file

        if not path.startswith("tinker://") and Path(path).is_dir():
            meta, tensors = read_run_adapter(path)
            folder = None
        else:
            folder, _ = self._folder(path)
            if not (folder / ADAPTER_WEIGHTS).is_file():
                gone = (
                    f" (an unnamed snapshot: deleted once {EPHEMERAL_KEEP} newer ones exist or "
                    "its session ended; name it with save_weights_for_sampler(name) to keep it)"
                    if folder.name.startswith(EPHEMERAL)
                    else ""
                )
                raise RequestError(f"no checkpoint at {path} (looked in {folder}){gone}", 404)
            meta = json.loads((folder / LORA_META).read_text())
            tensors = load_file(str(folder / ADAPTER_WEIGHTS))
        if meta["base_model"] != self.base_model:
            raise RequestError(
                f"{path} is a LoRA of {meta['base_model']!r}; this server holds {self.base_model!r}"
            )
        tensors = {k: t.to(self.device) for k, t in tensors.items()}
        return LoraSpec.from_json(meta), tensors, folder

    def load_state(
        self, path: str, optimizer: bool, model_id: str, create: bool = False
    ) -> dict[str, Any]:
        spec, tensors, folder = self._read(path)
        if create:
            self.create_model(model_id, spec)
        tm = self.model(model_id)
        if set(tensors) != set(tm.params) or any(
            tensors[k].shape != p.shape for k, p in tm.params.items()
        ):
            raise RequestError(
                f"{path} has rank {spec.rank} (attn={spec.train_attn}, mlp={spec.train_mlp}, "
                f"unembed={spec.train_unembed}); model {model_id} has rank {tm.spec.rank}: "
                "create the training client with create_training_client_from_state instead"
            )
        with torch.no_grad():
            for k, p in tm.params.items():
                p.copy_(tensors[k])
        if optimizer:
            if folder is None or not (folder / OPTIMIZER_STATE).is_file():
                raise RequestError(f"{path} holds no optimizer state (a sampler snapshot?)")
            state = torch.load(folder / OPTIMIZER_STATE, map_location=self.device)
            tm.optimizer.load_state_dict(state["optimizer"])
            tm.steps = int(state["steps"])
        return {"path": path, "model_id": model_id, "type": "load_weights"}

    # --- sampling ------------------------------------------------------------------------

    def _evict(self, path: str) -> None:
        if self.vllm is not None:
            self.vllm.forget(path)
        adapter = self.slots.pop(path, None)
        if adapter is not None:
            self.peft.delete_adapter(adapter)

    def _slot(self, path: str, keep: set[str]) -> str:
        """The adapter holding snapshot `path` (loaded now if needed; the least recently
        used slot outside `keep`, this batch's, makes room)."""
        if path in self.slots:
            self.slots.move_to_end(path)
            return self.slots[path]
        spec, tensors, _ = self._read(path)  # only resident slots stay in memory
        idle = [p for p in self.slots if p not in keep]
        if len(self.slots) >= SAMPLER_SLOTS and idle:
            self._evict(idle[0])
        adapter, params = self._add_adapter(spec)
        with torch.no_grad():
            for k, p in params.items():
                p.requires_grad_(False)
                p.copy_(tensors[k])
        self.slots[path] = adapter
        return adapter

    def _forward(
        self, ids: Tensor, mask: Tensor, positions: Tensor | None, adapters: list[str], cache: Any
    ) -> Any:
        kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "use_cache": True}
        if positions is not None:
            kwargs["position_ids"] = positions
        if cache is not None:
            kwargs.update(cache_kwargs(self.lm, cache))
        names = set(adapters)
        if self.peft is None:
            return self.lm(**kwargs)
        if names == {BASE}:
            with self._adapters_off():
                return self.lm(**kwargs)
        if len(names) == 1:
            self.peft.set_adapter(adapters[0])
            return self.lm(**kwargs)
        return self.peft(adapter_names=adapters, **kwargs)  # peft applies each row's adapter

    @contextlib.contextmanager
    def _adapters_off(self) -> Iterator[None]:
        # per layer, not peft.disable_adapter(): that reads the active adapter's config,
        # gone once the last adapter is deleted
        layers = [m for m in self.lm.modules() if hasattr(m, "_disable_adapters")]
        for m in layers:
            m._disable_adapters = True
        try:
            yield
        finally:
            for m in layers:
                m._disable_adapters = False

    def check_sample(self, request: Request) -> None:
        check_sample(request, self.base_model, self.context_length)

    def sample_batch(
        self, jobs: list[tuple[str | None, Request]], seed: int | None = None
    ) -> list[Any]:
        """Each job's (sequences, prompt log-probs or None), or the error that refused it;
        the accepted ones decoded in one batch. A job is (sampler path or None, request);
        `seed` seeds the draws of unseeded requests (ranks that decode together share it)."""
        if self.vllm is not None:
            return self.vllm.sample_batch(self, jobs, seed)
        out: list[Any] = [None] * len(jobs)
        ready: list[tuple[int, Request]] = []
        keep = {path for path, _ in jobs if path is not None}
        for i, (path, request) in enumerate(jobs):
            try:
                self.check_sample(request)
                request.adapter = BASE if path is None else self._slot(path, keep)
                ready.append((i, request))
            except RequestError as e:
                out[i] = e
        if ready:
            requests = [r for _, r in ready]
            scored = [
                prompt_logprobs(self._forward, r, self.device) if r.prompt_logprobs else None
                for r in requests
            ]
            for r in requests:  # stop strings need text; a remote caller sends no tokenizer
                if r.params.stop_strings and r.params.decode_text is None:
                    r.params = dataclasses.replace(r.params, decode_text=self.tokenizer.decode)
            decoded = decode(self._forward, requests, self.device, seed)
            for (i, _), seqs, lp in zip(ready, decoded, scored, strict=True):
                out[i] = (seqs, lp)
        return out


def _optimizer_state(tm: TrainingModel) -> dict[str, Any]:
    return {"optimizer": tm.optimizer.state_dict(), "steps": tm.steps}
