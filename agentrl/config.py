"""Run configuration: pydantic models, YAML loading and dotted overrides.

    cfg = load_config("configs/demo.yaml", overrides=["learner.lr=1e-6"])

Unknown keys are errors that name the key and suggest the closest valid one; bad values
name the field, the value and what is allowed.
"""

from __future__ import annotations

import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from agentrl._suggest import suggest
from agentrl.config_sources import Problem, Sources, report
from agentrl.cpu import Allocator
from agentrl.errors import ConfigError


class _Section(BaseModel):
    # a key's meaning is its attribute docstring (or Field(description=...)); an optional last
    # line "Example: `value`" is its example. docs/config.md is generated from them
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True
    )


class LoraConfig(_Section):
    """LoRA adapters on the policy (peft): the learner trains only them; samplers get merged
    weights (base + B @ A * alpha / r) under the base model's names. See docs/gpu.md."""

    r: int = Field(16, ge=1, description="adapter rank")
    alpha: float = Field(32.0, gt=0.0, description="scale = alpha / r")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapters' input during training (0 = none)."""
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Module names to adapt, or "all-linear" (every linear layer but the LM head)"""


class ModelConfig(_Section):
    name: str = "smollm2-135m-instruct"
    """The policy: an alias (smollm2-135m-instruct, tiny-llama, ...), a hub id, a local folder or a
    .gguf file."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights' dtype for the samplers (the learner keeps float32 masters and autocasts, see
    learner.bf16); auto = bfloat16 where the device computes it natively (a CPU with AVX-512
    BF16 / AMX, a CUDA GPU with bf16), float16 on an older GPU, else float32."""
    chat_template: str | None = None
    """Path to a jinja chat template; null = the model's own, or Hermes when it has none.
    Example: `templates/qwen.jinja`"""
    seed: int = 0
    """For randomly initialised aliases (tiny-llama)"""
    gradient_checkpointing: bool = False
    """Recompute every decoder layer's activations in backward: less learner memory for about a
    third more compute (see learner.recompute_mlp for a lighter one)."""
    lora: LoraConfig | None = None
    """LoRA adapters; null = full fine-tuning.
    Example: `{r: 8}`"""
    cpu_linear: Literal["auto", "onednn", "torch"] = "auto"
    """Float32 linear layers of the learner's and the hf sampler's model on a CPU: onednn = torch's
    oneDNN kernels (torch.ops.mkldnn), torch = torch's default (MKL's sgemm on x86 wheels), auto =
    oneDNN when a 0.1 s timing of both at load finds it at least 10% faster on this CPU (2.2-2.9x
    on AMD EPYC; layers under 256 wide stay on torch's). bf16/fp16, autocast, quantized and
    torch.compile'd layers keep torch's path. auto is a timing: two runs (a run and its resume)
    may pick differently and then differ in float rounding; set onednn or torch to pin it. See
    docs/performance.md."""


class SamplerConfig(_Section):
    backend: Literal["hf", "vllm", "openai"] = "hf"
    """Who decodes: hf (transformers in this process), vllm (an in-process vLLM engine, GPU) or
    openai (an OpenAI-compatible server at base_url). See docs/vllm.md."""
    max_batch_size: int = Field(32, ge=1, description="sequences the sampler decodes together")
    temperature: float = Field(1.0, ge=0.0)
    """Softmax temperature of sampling; 0 = greedy."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling: draw from the smallest set of tokens whose probability reaches top_p (1 =
    off)."""
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    max_new_tokens: int = Field(256, ge=1, description="tokens per assistant turn at most")
    seed: int | None = None
    """Seeded sampling: each episode's turn draws from its own stream, derived from this seed and
    the task's index, so a run and its resume sample the same tokens whatever the batch-mates;
    null = unseeded.
    Example: `1234`"""
    on_update: Literal["auto", "keep", "reprefill", "drain"] = "auto"
    """What in-flight sequences do when new weights arrive (docs/off_policy.md): keep = go on with
    the KV the old weights computed (tokens after the swap see a mix); reprefill = recompute the
    whole context's KV under the new weights, then go on (AReaL's interruptible generation,
    exact); drain = finish on the old weights first (no rollout spans two versions); auto = the
    backend's own: hf keep, vllm reprefill, openai drain"""
    device: str = "auto"
    """hf backend: auto (CUDA when present), cpu, cuda, cuda:N."""
    weight_precision: Literal["auto", "float32", "bfloat16", "int8", "fp8"] = "auto"
    """hf backend: the precision of the sampler's copy of the policy (the learner keeps float32
    and publishes full precision; the sampler requantizes on each publish). auto = model.dtype;
    float32 / bfloat16 = that dtype; int8 = torchao int8 weight-only linear layers (CPU or GPU;
    the LM head stays unquantized); fp8 = torchao float8 weights and activations (CUDA, compute
    capability 8.9+). Behaviour log-probs are the low-precision model's: algorithm.off_policy
    (TIS, MIS, IcePop) corrects the gap. Needs `pip install 'agentrl[lowprec]'` for int8/fp8.
    See docs/performance.md."""
    share_learner_weights: bool = True
    """hf backend, local backend: the sampler computes on the learner's own weight tensors
    where their dtype and device match (float32 sampler, CPU) instead of keeping a copy: one
    copy of the weights in memory, nothing copied on a publish. Synchronous runs: sampling and
    training take turns, so the weights never change under a rollout. Asynchronous runs
    (sampler.on_update: keep, the hf default): the learner's optimizer steps and the sampler's
    forward passes take turns on the tensors (a gate; a pass sees one optimizer step's
    weights), so rows in flight go on with newer weights from the next pass on, each token
    tagged with the version of the weights that produced it (weights between two versions,
    with ppo_epochs or minibatches > 1, keep the older); other on_update policies keep a
    copy. LoRA and
    sharded (FSDP) learners keep a copy. false = the sampler keeps its own copy.
    See docs/architecture.md, "Data flow" (Weights)."""
    gpu_memory_fraction: float | None = Field(None, gt=0.0, le=1.0)
    """Share of the GPU's memory the sampler may use: hf: checked against its weights at start,
    then enforced as the process's CUDA cap; vllm: its gpu_memory_utilization (vLLM's default,
    0.9, leaves a colocated learner nothing); null = no budget / vLLM's default. Ignored on CPU.
    Example: `0.4`"""
    base_url: str | None = None
    """openai backend: the server's URL.
    Example: `http://localhost:8000/v1`"""
    api_key: str | None = None
    """openai backend: the server's API key (null = none sent).
    Example: `sk-local`"""
    options: dict[str, Any] = Field(default_factory=dict)
    """Backend-specific extras, given to the backend's constructor (first-class settings such as
    max_batch_size or dtype are refused here). hf: max_context, prefill_tokens,
    prefix_cache_tokens, kv_cache (growing | dynamic | static), cuda_graphs (auto | on | off),
    default_stop_token_ids, seed (of the unseeded sampling stream). vllm: max_model_len,
    entropy_top_k, weight_transport, transfer_timeout_s, enforce_eager, ignore_eos,
    engine_kwargs. openai: timeout, connect_timeout, max_retries, backoff, entropy_top_k,
    reload_endpoint, model_dir, context_length.
    Example: `{kv_cache: static}`"""


class EnvConfig(_Section):
    name: str = "code_math"
    """The environment: a built-in name (code_math, ...), an installed `agentrl.envs` entry point,
    or module:Class (`agentrl envs list`)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's class (each environment validates its own and names a
    wrong one); e.g. code_math takes generators, difficulty, call_format. `agentrl envs list`
    shows the environments.
    Example: `{difficulty: easy}`"""
    eval_options: dict[str, Any] = Field(default_factory=dict)
    """Options laid over env.options for held-out tasks (`agentrl eval`, orchestrator.eval_every).
    Example: `{difficulty: hard}`"""


class BranchingConfig(_Section):
    enabled: bool = False
    """ARPO entropy-based branching: fork continuations where the policy's entropy rises after a
    tool result (docs/arpo.md)."""
    budget: int = Field(8, ge=1, description="M: total trajectories per task")
    initial: int = Field(2, ge=1, description="N: ordinary samples started per task")
    branches: int = Field(2, ge=1, description="Z: continuations forked at a branch point")
    entropy_window: int = Field(20, ge=1, description="k: tokens whose entropy is measured")
    alpha: float = 0.2
    """ARPO's base branching probability."""
    beta: float = 0.5
    """ARPO's weight of the entropy rise in the branching probability (alpha + beta * delta_H)."""
    tau: float = 0.5
    """mode=threshold: branch when the entropy rise exceeds tau."""
    mode: Literal["stochastic", "threshold"] = "stochastic"
    """stochastic = branch with probability alpha + beta * delta_H; threshold = branch when delta_H
    > tau."""
    attribution: str = "soft"
    """How a branch tree's sequence advantages reach its tokens: soft | hard, or a name registered
    with @register_tree_attribution (checked when the learner is built)"""

    @model_validator(mode="after")
    def _budget(self) -> BranchingConfig:
        if self.initial > self.budget:
            raise ValueError(
                f"initial ({self.initial}) must be <= budget ({self.budget}): raise "
                "rollout.branching.budget or lower rollout.branching.initial"
            )
        return self


class GroupHookConfig(_Section):
    """A group hook (agentrl.rollout.hooks): a registered name or module:function."""

    name: str
    """The hook: a registered name (ghpo_hint, replay) or module:function.
    Example: `ghpo_hint`"""
    options: dict[str, Any] = Field(default_factory=dict)
    """The hook's keyword options: ghpo_hint takes success, solution_key, prompt_key, fraction;
    replay takes success.
    Example: `{fraction: 0.5}`"""


class RolloutConfig(_Section):
    group_size: int = Field(8, ge=1, description="G: samples per task")
    concurrency: int = Field(32, ge=1, description="episodes in flight at once")
    max_turns: int = Field(4, ge=1)
    """Assistant turns per episode at most (hitting a limit ends the episode as truncated)."""
    max_tool_calls: int = Field(8, ge=0)
    """Tool calls per episode at most (0 = no tools run)."""
    max_tokens: int = Field(1024, ge=16, description="token budget of a whole episode")
    on_template_mismatch: Literal["error", "resample"] = "error"
    """When re-rendering the conversation does not reproduce the sampled tokens: error = stop
    naming the sample; resample = drop it and sample again."""
    infra_retries: int = Field(1, ge=0)
    """Times an episode that failed for an infrastructure reason (sandbox, tool server, timeout) is
    retried before it is masked out of the loss."""
    episode_timeout_s: float = Field(300.0, gt=0)
    """Wall-clock limit of one episode attempt in seconds; past it the attempt counts as an
    infrastructure failure (retried infra_retries times)."""
    workflow: str = "episode"
    """How one sample is produced: "episode" (the environment-driven runner) or a workflow, `async
    def run_episode(ctx) -> Trajectory`, by registered name or `module:function`.
    Example: `my_agent.py:run_episode`"""
    branching: BranchingConfig = Field(default_factory=BranchingConfig)
    """ARPO tree rollouts (docs/arpo.md)."""
    group_hooks: list[str | GroupHookConfig] = Field(default_factory=list)
    """Hooks run in order on each finished group before it reaches the buffer: ghpo_hint (resample
    an all-fail group with a hint), replay (a stored success into an all-fail group), or your
    own; a name or {name, options}. See docs/credit.md.
    Example: `[ghpo_hint]`"""


class OverlongConfig(_Section):
    enabled: bool = False
    """DAPO's soft overlong penalty: a linear penalty on samples longer than max_len - cache_len."""
    max_len: int = Field(1024, ge=1, description="L_max: the length at which the penalty is full")
    cache_len: int = Field(256, ge=0, description="L_cache: soft-penalty interval")
    coef: float = 1.0
    """Scale of the soft overlong penalty (the full penalty at max_len is -coef)."""
    filter: bool = False
    """DAPO overlong filtering: truncated samples (a limit hit, or the last turn cut at
    max_new_tokens) leave the loss; independent of the soft penalty (`enabled`)"""


class AlgorithmConfig(_Section):
    advantage: str = "grpo"
    """The advantage estimator: gae | grpo | dr_grpo | rloo | reinforce_pp | reinforce_pp_baseline
    | gigpo | grpo_lambda | lite_ppo | reinforce_mean | tree_grpo | raft (rejection sampling: each
    group's best samples, the rest leave the loss), or a name registered with @register_advantage
    (docs/credit.md).
    Example: `rloo`"""
    policy_loss: str = "ppo"
    """The policy loss: ppo | gspo | gspo_token | gmpo | gvpo | ppo_adaptive_kl | cispo | sapo | m2po
    | dppo_kl (prime-rl's default) | reinforce (-A log pi: with advantage raft, RAFT's NLL), or a
    name registered with @register_policy_loss.
    Example: `gspo`"""
    agg: str = "token-mean"
    """How per-token losses become one: token-mean | seq-mean-token-mean | seq-mean-token-sum-norm,
    or a name registered with @register_aggregation.
    Example: `seq-mean-token-mean`"""
    eps_low: float = Field(0.2, ge=0.0)
    """Lower clip range of the ratio (ratio >= 1 - eps_low) in clipping losses (ppo, gspo, ...); an
    error with a loss that takes no clip: unset it (`--set algorithm.eps_low=null`)."""
    eps_high: float = Field(0.28, ge=0.0)
    """Upper clip range (ratio <= 1 + eps_high); above eps_low = DAPO's clip-higher."""
    dual_clip_c: float | None = Field(None, gt=1.0)
    """Dual-clip PPO: for negative advantages the loss is bounded by c * |A| (c > 1); null = off.
    Example: `3.0`"""
    kl: str | None = None
    """KL estimator against the reference model: k1 | k2 | k3 | k3+; null disables the KL term.
    Example: `k3`"""
    kl_coef: float = Field(0.0, ge=0.0)
    """Weight of the KL term (loss, or reward with kl_in_reward); 0 = no KL, no reference model."""
    ref_refresh_every: int = Field(0, ge=0)
    """Every N learner steps the reference model becomes a copy of the current policy (0 = never:
    the initial policy throughout). Needs a reference: a KL term or a loss that reads ref_logprobs.
    Example: `50`"""
    kl_in_reward: bool = False
    """REINFORCE++: the KL penalty goes into the per-token reward (r_t - kl_coef * KL_t) instead of
    the loss; needs `kl`, kl_coef > 0 and a token-reward advantage"""
    entropy_coef: float = 0.0
    """Entropy bonus: the loss subtracts entropy_coef * the aggregated entropy of the trained
    tokens (0 = none); the start value under entropy_coef_schedule."""
    entropy_coef_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """The entropy coefficient over the run: constant = entropy_coef; linear / cosine = from
    entropy_coef at the first learner step to entropy_coef_end at the last (orchestrator.max_steps).
    Example: `linear`"""
    entropy_coef_end: float = 0.0
    """The entropy coefficient at the last step under a linear or cosine entropy_coef_schedule."""
    off_policy: Literal["none", "tis", "decoupled"] = "none"
    """Off-policy corrections (docs/off_policy.md); the is_* keys act under tis / decoupled"""
    is_cap: float = Field(2.0, gt=0.0, description="cap of truncated importance weights")
    is_mode: Literal["truncate", "mask"] = "truncate"
    """A weight above is_cap: truncate = cap it at is_cap; mask = drop the token from the loss."""
    is_level: Literal["token", "sequence"] = "token"
    """One importance weight per token, or per sequence (the product of the row's token ratios)."""
    is_mask: str | None = None
    """Drop tokens whose pi_old/pi_behave is outside [is_mask_low, is_mask_high]: token = IcePop,
    geometric = whole sequences by their geometric-mean ratio (or a registered mask); null = no
    mask.
    Example: `token`"""
    is_mask_low: float = Field(0.5, ge=0.0)
    """is_mask: lower bound of the kept ratio pi_old/pi_behave."""
    is_mask_high: float = Field(5.0, gt=0.0)
    """is_mask: upper bound of the kept ratio pi_old/pi_behave."""
    proximal: Literal["recompute", "loglinear"] = "recompute"
    """decoupled's pi_prox: recompute = a no-grad pass at the start of the step; loglinear =
    AReaL's interpolation between behaviour and current log-probs (no extra pass)."""
    proximal_bypass: Literal["auto", "off"] = "auto"
    """auto = skip decoupled's recompute pass when pi_old is the behaviour policy (max_staleness 0,
    one optimizer update per step, the hf sampler in the learner's dtype, every trained token at
    the learner's version) and use the behaviour log-probs; off = always recompute."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: groups whose rewards are all equal (no signal) are dropped and more
    are sampled."""
    max_dropped_groups: int = Field(64, ge=1)
    """Dynamic sampling's bound: after this many all-equal groups in a row (a warning half way),
    stop with an error naming the likely cause, or (train) train on them anyway"""
    on_max_dropped: Literal["error", "train"] = "error"
    """After max_dropped_groups all-equal groups in a row: error = stop naming the likely cause;
    train = train on them anyway."""
    min_group_reward_std: float = Field(0.0, ge=0.0)
    """Dynamic sampling also drops groups whose reward std (unbiased, over the valid samples) is
    below this, under the same max_dropped_groups bound; 0 = only all-equal groups. Needs
    dynamic_sampling: true.
    Example: `0.1`"""
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)
    """DAPO's overlong reward shaping and filtering."""
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount of the estimators that take one (gae, reinforce_pp, ...)."""
    lam: float = Field(1.0, ge=0.0, le=1.0)
    """GAE's lambda (bias/variance of the advantage; 1 = Monte Carlo returns)."""
    critic: bool = False
    """PPO with a learned value function"""
    value_clip: float = Field(0.2, ge=0.0)
    """PPO value clipping: the value loss keeps the new value within value_clip of the old one."""
    vf_coef: float = Field(0.5, ge=0.0)
    """Weight of the value loss (critic=true)."""
    norm_length: int | None = None
    """The constant denominator of seq-mean-token-sum-norm; null = rollout.max_tokens.
    Example: `1024`"""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options of the selected advantage and policy loss, each routed to the function that
    takes it (an option no selected function takes is an error): gae: whiten_advantages; grpo:
    eps, norm_by_std; gigpo: omega, step_gamma, norm_by_std, eps; grpo_lambda: top_fraction,
    length_coef, success, eps; lite_ppo, reinforce_pp, reinforce_pp_baseline, tree_grpo: eps;
    gmpo: log_clip; gvpo: beta; ppo_adaptive_kl: kl_beta, kl_target; cispo: eps_low_is; sapo:
    tau_pos, tau_neg; m2po: m2_threshold; dppo_kl: dppo_mask_low, dppo_mask_high, adv_tau, kl_tau;
    raft: min_reward; your registered functions: their keyword parameters.
    Example: `{norm_by_std: false}`"""

    @field_validator("proximal_bypass", mode="before")
    @classmethod
    def _bypass_off(cls, v: Any) -> Any:
        # YAML reads a bare on/off as a boolean (`--set algorithm.proximal_bypass=off`)
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


class LearnerConfig(_Section):
    lr: float = Field(1e-6, gt=0.0)
    """AdamW learning rate of the policy."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas (beta1, beta2).
    Example: `[0.9, 0.95]`"""
    grad_clip: float = Field(1.0, gt=0.0)
    """Global gradient-norm clip per optimizer step."""
    warmup_steps: int = Field(0, ge=0)
    """Optimizer steps of linear learning-rate warmup (from lr / (warmup_steps + 1) up to lr; 0 =
    none)."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rate after warmup: constant, or a linear / cosine decay to 0 at
    orchestrator.max_steps."""
    batch_groups: int = Field(4, ge=1, description="task groups per training step")
    micro_batch_size: int = Field(4, ge=1, description="sequences per forward/backward")
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each step's batch."""
    minibatches: int = Field(1, ge=1, description="optimizer steps per epoch")
    bf16: Literal["auto", "on", "off"] = "auto"
    """bf16 autocast: auto = where the device computes bf16 natively; on = also on a GPU without it
    (a CPU without bf16 instructions says so and trains in float32)"""
    fp16: Literal["on", "off"] = "off"
    """fp16 autocast with a gradient scaler (loss scaling, overflowing steps skipped; its state is
    checkpointed): for GPUs without bf16. Not together with bf16=on"""
    device: str = "auto"
    """Where the learner computes: auto (CUDA when present), cpu, cuda, cuda:N; the critic and the
    reference model live here too."""
    gpu_memory_fraction: float | None = Field(None, gt=0.0, le=1.0)
    """Share of the GPU's memory the learner may use (weights, gradients, AdamW state checked at
    start, then enforced as its process's CUDA cap); null = no budget. Ignored on CPU.
    Example: `0.5`"""
    weight_sharing: Literal["auto", "cuda_ipc", "shared_memory"] = "auto"
    """How the learner process hands weights to this one: auto = CUDA IPC handles when the learner
    is on CUDA (no trip through host memory), else shared-memory files"""
    logprob_chunk: int = Field(512, ge=1, description="sequence chunk for log-softmax")
    fused_logprobs: Literal["auto", "on", "off"] = "auto"
    """The LM head's element-wise log-softmax passes compiled with torch.compile (fused per row):
    auto = on CPU where it compiles, else the eager passes; on = an error if it cannot; off =
    eager. See agentrl.algos.fused"""
    compile: Literal["auto", "on", "off"] = "off"
    """Regional torch.compile: each decoder layer of the policy (critic, reference model) compiled
    in place, fusing the element-wise work around the matmuls: off (the default until a GPU run
    has measured it); auto = on CUDA, off on CPU (a first compile of tens of seconds, paid back
    by long runs only); on = any device (share_prompt is off then). See agentrl.learner.compiled"""
    share_prompt: bool = True
    """Forward a group's shared prompt once (its KV cache repeated for the group's rows): identical
    values and gradients, a fraction of the compute when prompts dominate"""
    packing: bool = False
    """A micro-batch's sequences concatenated into one row (position ids restarting per sequence,
    attention block-diagonal): no compute on padding. Micro-batches whose rows share a prompt
    (share_prompt) keep that path; see docs/performance.md#packing"""
    sdpa_backend: Literal["auto", "torch", "math", "flash"] = "auto"
    """Attention kernel: auto = math for micro-batches of <= 256 tokens on CPU (faster there), else
    PyTorch's own choice; torch / math / flash force one"""
    critic_lr: float | None = None
    """AdamW learning rate of the critic (algorithm.critic=true); null = learner.lr.
    Example: `1.0e-5`"""
    recompute_mlp: bool = False
    """Keep only the gated MLP's input for backward and recompute its gate/up projections there
    (Llama-family MLPs): about half a layer's activations for +13% of the learner's matmuls
    (full model.gradient_checkpointing: all of them for +33%). See docs/performance.md#half-
    precision-and-activation-checkpointing"""
    world_size: int = Field(1, ge=1)
    """Ranks of one torch.distributed group training the policy together (gloo on CPU, NCCL on GPU,
    one GPU each), launched by the run layer: local processes, or Ray actors in a placement
    group under orchestrator.backend=ray. See agentrl.learner.distributed"""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Ddp = every rank holds the model, gradients summed by all-reduce; fsdp = torch's FSDP2 per
    decoder layer: parameters, gradients and AdamW state sharded 1/world_size"""
    cpu_offload: bool = False
    """Fsdp: keep the sharded parameters, gradients and optimizer state in host memory"""
    collective_timeout_s: float = Field(600.0, gt=0)
    """How long any collective of the learner group may wait before it fails (a dead rank)"""

    @field_validator("bf16", "fp16", "fused_logprobs", "compile", mode="before")
    @classmethod
    def _on_off(cls, v: Any) -> Any:
        # YAML reads a bare on/off as a boolean (`--set learner.bf16=off`)
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _one_half_precision(self) -> LearnerConfig:
        if self.fp16 == "on" and self.bf16 == "on":
            raise ValueError(
                "learner.fp16=on and learner.bf16=on ask for two autocast dtypes: set "
                "learner.bf16=auto (or off) to train in fp16, or learner.fp16=off for bf16"
            )
        if self.parallel == "fsdp" and self.fp16 == "on":
            raise ValueError(
                "learner.parallel=fsdp does not take learner.fp16=on (its gradient scaler is "
                "not sharded): use learner.bf16, or learner.parallel=ddp"
            )
        if self.cpu_offload and self.parallel != "fsdp":
            raise ValueError(
                "learner.cpu_offload=true offloads FSDP2's shards: set learner.parallel=fsdp, "
                "or learner.cpu_offload=false"
            )
        return self


class OrchestratorConfig(_Section):
    max_steps: int = Field(20, ge=1)
    """Training steps (one optimizer round over learner.batch_groups groups each)."""
    max_staleness: int = Field(1, ge=0)
    """How many versions the learner's weights may be ahead of the weights that sampled a
    trained token (> 0: sampling and training overlap); 0 = synchronous on-policy"""
    time_limit_s: float | None = Field(None, gt=0)
    """Stop after the step that crosses this wall time in seconds (checkpointed); null = no limit.
    Example: `3600`"""
    seed: int = 0
    """Seed of the run: task order, torch, and the samplers' seeded streams."""
    curriculum: Literal["off", "learnability"] = "off"
    """learnability = a task (by its id) is issued with probability max(curriculum_min_weight,
    4 p (1 - p)), p its running success rate (an EMA of its groups' mean reward clipped to
    [0, 1]): tasks solved about half the time come most, always- or never-solved ones rarely.
    Acts on tasks whose ids recur across epochs (docs/credit.md)."""
    curriculum_min_weight: float = Field(0.1, gt=0.0, le=1.0)
    """The issue probability of a task that is always or never solved under curriculum."""
    backend: Literal["local", "ray"] = "local"
    """Where the run's parts live: local = this process (plus the learner child); ray = the same
    classes in Ray actors sized by the `ray` section (see docs/ray.md)"""
    checkpoint_every: int = Field(5, ge=0, description="0 disables periodic checkpoints")
    eval_every: int = Field(0, ge=0)
    """Evaluate on held-out tasks (env.eval_options) every N steps and at the last step: pass@k /
    maj@k logged as eval/* metrics; 0 = never"""
    eval_tasks: int = Field(16, ge=1, description="held-out tasks per evaluation")
    eval_samples: int = Field(4, ge=1, description="samples per held-out task (k)")
    cpu_threads: int | None = Field(None, ge=1)
    """Torch intra-op threads on CPU. None: every core in sync mode; half the cores in async mode
    for the sampler's process, where the sampler and the learner compute at the same time (the
    learner's own process: learner_cpu_threads).
    Example: `4`"""
    learner_cpu_threads: int | None = Field(None, ge=1)
    """Torch threads of the learner when it runs in its own process (learner_worker); None:
    cpu_threads if set, else every core: it then takes the cores the sampler leaves idle between
    batches (idle OpenMP threads sleep there: OMP_WAIT_POLICY=PASSIVE).
    Example: `4`"""
    cpu_allocator: Allocator = "auto"
    """The C allocator of each process of the run: tcmalloc = gperftools' tcmalloc, preloaded
    (`agentrl train` restarts itself once with it; the learner process starts with it): freed
    memory serves the next tensor without page faults, and less of it stays resident than under
    glibc (docs/performance.md#tcmalloc); auto = tcmalloc where it is installed (make setup
    installs libtcmalloc-minimal4), else compact; compact = glibc with every thread on one arena
    (what one thread frees serves another's next tensor); reuse = one glibc arena, and freed
    memory stays in the process (fewer page faults, resident memory near its peak); system = the
    allocator as the process has it. See agentrl.cpu"""
    learner_worker: Literal["auto", "thread", "process"] = "auto"
    """Where the learner computes: process = a spawned child with its own interpreter (its Python
    loop never waits on the sampler's GIL; weights come back in shared memory); thread = a
    worker thread of this process (the Learner object stays reachable as orch.learner, plug-ins
    registered at run time are seen); auto = process when async (sampler and learner compute at
    the same time), thread when synchronous"""
    run_dir: str | None = None
    """Where the run writes metrics, trace and checkpoints; null = runs/<config name>-<time>
    (`--run-dir` wins).
    Example: `runs/demo`"""


class WandbConfig(_Section):
    """Weights & Biases: ``logging.wandb: {mode: offline}`` writes a local run folder."""

    mode: Literal["online", "offline", "disabled"] = "offline"
    """Disabled: nothing is logged and wandb is never imported (W&B's own word for off)"""
    project: str = "agentrl"
    """W&B project."""
    entity: str | None = None
    """W&B entity (team or user); null = your default.
    Example: `my-team`"""
    name: str | None = None
    """Default: the run directory's name.
    Example: `demo-grpo`"""
    group: str | None = None
    """W&B group of runs; null = none.
    Example: `ablation-kl`"""
    tags: list[str] = Field(default_factory=list)
    """W&B tags.
    Example: `[demo, grpo]`"""
    dir: str | None = None
    """Parent of the wandb/ folder; default: the run directory.
    Example: `/tmp/wandb`"""

    @property
    def enabled(self) -> bool:
        return self.mode != "disabled"


class LoggingConfig(_Section):
    tensorboard: bool = False
    """Write TensorBoard events into the run folder (needs the tensorboard package)."""
    wandb: WandbConfig = Field(default_factory=lambda: WandbConfig(mode="disabled"))
    """Absent or false: off; true: the defaults of WandbConfig (offline); or a mapping"""
    progress: bool = True
    """Print a progress line per step."""
    trace: bool = True
    """Write every episode (tokens, rewards, advantages) to the run's trace for `agentrl view`."""
    log_every: int = Field(1, ge=1)
    """A trained step's metrics go to metrics.jsonl, TensorBoard and W&B every N steps (the last
    step always); the progress line and the other events are not thinned"""

    @model_validator(mode="before")
    @classmethod
    def _wandb_shorthand(cls, data: Any) -> Any:
        wandb = data.get("wandb") if isinstance(data, dict) else {}
        if wandb is None or isinstance(wandb, bool):
            data = {**data, "wandb": {} if wandb else {"mode": "disabled"}}
        return data


class RayRoleConfig(_Section):
    """One role's Ray actors: how many, and what each one reserves."""

    replicas: int = Field(1, ge=1)
    """Actors of this role."""
    num_cpus: float = Field(1.0, ge=0)
    """CPUs each actor reserves."""
    num_gpus: float = Field(0.0, ge=0)
    """GPUs each actor reserves (fractions share one)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources a node must offer (`ray start --resources='{"rollout": 8}'`).
    Example: `{rollout: 1}`"""


class RayConfig(_Section):
    """Placement under ``orchestrator.backend: ray`` (ignored by ``local``)."""

    address: str | None = None
    """An existing cluster ("ray://host:10001", "host:6379", "auto"); None: RAY_ADDRESS when set,
    else a local Ray instance started for the run (and stopped with it).
    Example: `ray://head:10001`"""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of a local instance; CPUs of a local instance (scheduling tokens); None: the machine's
    cores, or what the roles reserve in all when that is more (the default roles start on a
    2-core laptop).
    Example: `8`"""
    samplers: RayRoleConfig = Field(default_factory=RayRoleConfig)
    """The sampler actors."""
    rollout_workers: RayRoleConfig = Field(default_factory=RayRoleConfig)
    """The rollout-worker actors (episodes and tools)."""
    learner: RayRoleConfig = Field(default_factory=RayRoleConfig)
    """The learner actor(s)."""
    weight_transport: Literal["object_store", "gloo", "nccl"] = "object_store"
    """How weights travel from the learner to the samplers: object_store = put once, every replica
    reads it; gloo / nccl = a torch.distributed broadcast group (CPU / GPU)"""
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """PACK keeps a role's bundles on few nodes; SPREAD over many; STRICT_* insist"""
    max_restarts: int = Field(3, ge=0, description="restarts of a dead sampler/rollout actor")
    sticky_slack: int = Field(8, ge=0)
    """An episode stays on its replica (warm prefix cache) unless that replica has this many more
    requests in flight than the least busy one"""
    start_timeout_s: float = Field(
        60.0, gt=0, description="seconds to wait for resources and actors"
    )


DATASET_ENV = "dataset"  # agentrl.envs.dataset:DatasetEnv


class DataConfig(_Section):
    """Tasks from local files through Hugging Face ``datasets`` (docs/bring_your_own.md):
    they replace the environment's own tasks; every column reaches the reward functions."""

    path: str | dict[str, str] | None = None
    """A file, glob or folder (JSON/JSONL, CSV, parquet, arrow, a save_to_disk folder), or {split:
    path} for several splits; None: the environment's own tasks.
    Example: `data/train.jsonl`"""
    format: Literal["auto", "json", "csv", "parquet", "arrow", "disk"] = "auto"
    """File format; auto = from the file extension."""
    split: str = "train"
    """The split training reads."""
    eval_split: str | None = None
    """The split `agentrl eval` and eval_every use.
    Example: `test`"""
    prompt: str | None = None
    """Column mapping: the user's text (None: the first of prompt, question present), or a chat
    column (a list of {role, content}) instead; the reference answer (optional).
    Example: `question`"""
    messages: str | None = None
    """A chat column (a list of {role, content}) used as the prompt instead of `prompt`.
    Example: `messages`"""
    answer: str | None = "answer"
    """The reference-answer column (null = none)."""
    id: str | None = None
    """Default: the row's index in its split.
    Example: `task_id`"""
    columns: list[str] | None = None
    """Columns kept in the task (None: all).
    Example: `[question, answer]`"""
    shuffle: bool = True
    """A fresh seeded order every epoch (seed = orchestrator.seed + epoch)"""
    streaming: bool = False
    """Read rows lazily (large files); shuffles within a buffer"""
    shuffle_buffer: int = Field(10_000, ge=1)
    """streaming: rows shuffled within a buffer of this many."""
    max_rows: int | None = Field(None, ge=1)
    """Use at most this many rows of each split (null = all).
    Example: `1000`"""


class RewardFunctionConfig(_Section):
    fn: str
    """Package.module:function or file.py:function.
    Example: `my_rewards.py:exact_match`"""
    weight: float = 1.0
    """This function's weight in the summed reward."""
    name: str | None = None
    """Default: the function's name (reward_info key).
    Example: `exact`"""


class JudgeConfig(_Section):
    """LLM-as-judge: a prompt per finished episode, a score parsed from the reply."""

    model: str | None = None
    """The judge: a model (alias, folder or hub id) on its own hf sampler, or with base_url an
    OpenAI-compatible server; None = the run's own sampler (the policy judges itself).
    Example: `qwen2.5-0.5b-instruct`"""
    base_url: str | None = None
    """An OpenAI-compatible server for the judge (null = a local hf sampler).
    Example: `http://localhost:8000/v1`"""
    api_key: str | None = None
    """The judge server's API key.
    Example: `sk-local`"""
    template: str = (
        "Rate the answer to the question from 0 to 10.\n\nQuestion: {question}\n\n"
        "Reference answer: {answer}\n\nAnswer: {completion}\n\n"
        "Reply with 'Score: <0-10>'."
    )
    """Str.format fields: {question}, {completion}, {answer} and every task column"""
    pattern: str = r"(?i)score\s*[:=]?\s*(-?\d+(?:\.\d+)?)"
    """Regular expression that finds the score in the judge's reply; its group 1 is the score"""
    min_score: float = 0.0
    """The parsed score is mapped from [min, max] to [0, 1]"""
    max_score: float = 10.0
    """The top of the judge's scale (mapped to 1)."""
    weight: float = 1.0
    """The judge score's weight in the reward."""
    max_new_tokens: int = Field(64, ge=1)
    """Tokens of the judge's reply."""
    temperature: float = Field(0.0, ge=0.0)
    """Judge sampling temperature (0 = greedy; > 0 for samples > 1)."""
    on_unparseable: Literal["error", "infra_error", "zero"] = "error"
    """An unparseable reply: stop the run naming it (error), mask the episode (infra_error), or
    score it 0"""
    samples: int = Field(1, ge=1)
    """K judgements per episode; SPCT (Liu et al. 2025): k sampled judgements voted into one score
    (mean of the parsed scores, or the most frequent one), with principles in the prompt
    ({principles} in the template, else put before it)"""
    vote: Literal["mean", "majority"] = "mean"
    """How samples > 1 judgements become one score: their mean, or the most frequent."""
    principles: list[str] = Field(default_factory=list)
    """SPCT principles put in the judge's prompt.
    Example: `["Is the final answer correct?"]`"""

    @model_validator(mode="after")
    def _range(self) -> JudgeConfig:
        if not self.min_score < self.max_score:
            raise ValueError(
                f"reward.judge.min_score ({self.min_score}) must be below max_score "
                f"({self.max_score})"
            )
        if self.samples > 1 and self.temperature == 0:
            raise ValueError(
                f"reward.judge.samples={self.samples} votes over sampled judgements, but "
                "reward.judge.temperature=0 makes them all the same: set a temperature > 0 "
                "(e.g. 0.7) or samples=1"
            )
        return self


class RewardConfig(_Section):
    """Rewards beyond the environment's: plain Python functions, a reward model, a judge.

    reward = env_weight * environment reward + sum(weight_i * function_i) +
    model_weight * reward model score + judge.weight * judge score."""

    functions: list[str | RewardFunctionConfig] = Field(default_factory=list)
    """Reward functions fn(task, completion, ...) -> float: module:function or file.py:function, or
    {fn, weight, name}.
    Example: `[my_rewards.py:exact_match]`"""
    weights: list[float] | None = None
    """One per function (TRL's reward_weights).
    Example: `[1.0, 0.5]`"""
    env_weight: float = 1.0
    """Weight of the environment's own reward."""
    model: str | None = None
    """A reward model folder (agentrl rm train).
    Example: `runs/rm`"""
    model_weight: float = 1.0
    """Weight of reward.model's score."""
    model_device: str = "auto"
    """Device of reward.model / process_model: auto (CUDA when present), cpu, cuda, cuda:N."""
    model_batch_size: int = Field(16, ge=1)
    """Episodes scored per reward-model forward."""
    model_max_length: int = Field(2048, ge=16)
    """Tokens of an episode the reward model reads (longer ones are cut from the left)."""
    judge: JudgeConfig | None = None
    """An LLM judge scoring each finished episode; null = none."""
    step_weight: float = 1.0
    """The environment's step rewards (StepResult.step_reward, never the outcome) reach the
    learner on the last token of their turn, times this weight; sequence-level estimators add
    their weighted sum to the outcome. 0 ignores them"""
    process: list[str | RewardFunctionConfig] = Field(default_factory=list)
    """Process rewards from Python: fn(task, turn_text, turn_index) for every assistant turn,
    weighted and added to that turn's process reward (module:function, as functions).
    Example: `[my_rewards.py:step_score]`"""
    process_model: str | None = None
    """A process reward model (PRM): a reward model folder (agentrl rm train) that scores the
    conversation up to each assistant turn; times its weight, added to that turn's process
    reward. Loaded on model_device with model_batch_size / model_max_length (shared with
    reward.model when both name the same folder).
    Example: `runs/prm`"""
    process_model_weight: float = 1.0
    """Weight of process_model's per-turn scores."""

    @model_validator(mode="after")
    def _weights(self) -> RewardConfig:
        if self.weights is not None and len(self.weights) != len(self.functions):
            raise ValueError(
                f"reward.weights has {len(self.weights)} entries for {len(self.functions)} "
                "reward.functions: give one weight per function"
            )
        return self

    @property
    def enabled(self) -> bool:
        return bool(
            self.functions or self.model or self.judge or self.process or self.process_model
        )


class GatewayConfig(_Section):
    """The run's OpenAI-compatible gateway, which agent programs (``env.name: agent``,
    ``verifiers``) call; ``agentrl serve`` uses it too."""

    max_n: int = Field(4, ge=1, description="largest n (samples per request) a request may ask for")
    """Example: `8`"""
    tool_parser: str = Field(
        "hermes",
        description="how tool calls are read from model text (agentrl.tools.parser_names())",
    )
    strict_model: bool = Field(
        False,
        description="answer model names other than agentrl and model.name with 404 "
        "(false: any name reaches the policy and is recorded in the trace)",
    )
    host: str = Field("127.0.0.1", description="interface the gateway listens on")
    port: int = Field(0, ge=0, le=65535, description="port the gateway listens on (0: a free one)")
    subagent_credit: Literal["all", "main"] = Field(
        "all",
        description="which samples of an agent episode get its reward: all (sub-agents and "
        "compacted contexts too) or main (only the conversation that ended the episode; "
        "the rest are not trained)",
    )


# env.options keys of the agent-program environments that moved to the gateway: section
GATEWAY_OPTIONS = ("max_n", "tool_parser", "strict_model", "host", "port")


def _gateway_options_moved(data: Any) -> Any:
    """Old configs' ``env.options.max_n`` ... (env.name agent / verifiers) become
    ``gateway.max_n`` ..., each with a warning naming the new key."""
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict) or env.get("name") not in ("agent", "verifiers"):
        return data
    gateway = data.get("gateway") or {}
    if not isinstance(gateway, dict):
        return data  # validation names the bad section
    env, gateway = dict(env), dict(gateway)
    for section in ("options", "eval_options"):
        options = env.get(section)
        if not isinstance(options, dict) or not set(options) & set(GATEWAY_OPTIONS):
            continue
        env[section] = options = dict(options)
        for key in GATEWAY_OPTIONS:
            if key in options:
                warnings.warn(
                    f"env.{section}.{key} is deprecated: set gateway.{key} instead (the "
                    "gateway: section of the config)",
                    FutureWarning,
                    stacklevel=2,
                )
                gateway.setdefault(key, options.pop(key))
    return {**data, "env": env, "gateway": gateway}


class PreferenceConfig(_Section):
    """`agentrl dpo`: preference optimisation (docs/preference.md)."""

    loss: str = "dpo"
    """A registered preference loss: dpo, cdpo, robust, ipo, hinge, kto, orpo, simpo, tdpo, rpo (DPO +
    alpha * the chosen answer's length-normalised NLL)"""
    beta: float | None = Field(None, gt=0.0)
    """The loss's beta; null = the loss's own default.
    Example: `0.1`"""
    options: dict[str, Any] = Field(default_factory=dict)
    """The loss's other keyword options: dpo, cdpo, robust: label_smoothing; ipo: length_normalize;
    kto: lambda_d, lambda_u; orpo: lam; simpo: gamma, label_smoothing; tdpo: alpha, variant; rpo:
    alpha (the NLL's weight, 1.0).
    Example: `{label_smoothing: 0.1}`"""
    epochs: int = Field(1, ge=1)
    """Passes over the preference data."""
    batch_size: int = Field(8, ge=1, description="pairs (or unpaired rows) per step")
    max_length: int = Field(2048, ge=16)
    """Longer examples are skipped (and counted)"""
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    """Share of the preference data held out to measure the loss's accuracy"""
    checkpoint_every: int = Field(0, ge=0)
    """Steps (and each epoch's end); 0 = the end only"""
    seed: int = 0
    """Seed of the data order and the held-out split."""
    rounds: int = Field(3, ge=1)
    """Online DPO: rollouts -> best-vs-worst pairs (ties skipped) -> train -> publish"""
    groups_per_round: int = Field(8, ge=1)
    """Online DPO: rollout groups per round."""
    epochs_per_round: int = Field(1, ge=1)
    """Online DPO: passes over a round's pairs."""
    min_reward_gap: float = Field(0.0, ge=0.0)
    """Online DPO: a group whose best - worst reward is <= this is a tie and gives no pair"""
    step_pairs: bool = True
    """ARPO tree groups also give fork-level (Step-DPO) pairs"""


class TeacherConfig(_Section):
    """A distillation teacher: a model in the learner's process, or a server."""

    model: str | None = None
    """An alias or model folder (same tokenizer as model.name), or the served model's name with
    base_url (null: the first one /v1/models lists).
    Example: `runs/sft-teacher/export`"""
    base_url: str | None = None
    """An OpenAI-compatible server that returns prompt log-probs (vLLM's prompt_logprobs).
    Example: `http://localhost:8000/v1`"""
    api_key: str | None = None
    """The teacher server's API key.
    Example: `sk-local`"""
    timeout_s: float = Field(300.0, gt=0)
    """Seconds per request to the teacher server."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        # a string teacher: an http(s) URL is a server, anything else a model
        if isinstance(value, str):
            is_url = value.startswith(("http://", "https://"))
            return {"base_url": value} if is_url else {"model": value}
        return value


class DistillConfig(_Section):
    """On-policy distillation (docs/credit.md): a teacher scores the student's sampled tokens and
    the per-token reverse KL (student minus teacher log-prob) is the advantage:
    A = reward_weight * A_task - weight * (log p_student - log p_teacher)."""

    teacher: TeacherConfig | None = None
    """The teacher of tasks that name none: a model folder or alias, an http(s) URL of a server
    returning prompt log-probs, or {model, base_url, api_key}; null (and no teachers): off.
    Example: `runs/teacher/export`"""
    teachers: dict[str, TeacherConfig] = Field(default_factory=dict)
    """Several teachers by key; a task's task_key field names its teacher.
    Example: `{math: runs/math-teacher, code: http://localhost:8001/v1}`"""
    task_key: str = "teacher"
    """The task field that names a task's teacher in teachers."""
    weight: float = Field(1.0, ge=0.0)
    """The reverse KL's weight in the advantage."""
    reward_weight: float = 0.0
    """The task reward's advantage weight (0: distillation alone)."""


class AlertConfig(_Section):
    """One alert: a warning line and an AlertFired event when a metric crosses a bound."""

    above: float | None = None
    """Fire when the metric is above this.
    Example: `0.5`"""
    below: float | None = None
    """Fire when the metric is below this.
    Example: `0.01`"""

    @model_validator(mode="after")
    def _one_bound(self) -> AlertConfig:
        if self.above is None and self.below is None:
            raise ValueError("an alert needs `above: x` or `below: y`")
        return self


class MonitorsConfig(_Section):
    """Health monitors logged every step as monitor/* metrics (docs/credit.md), and alerts."""

    ngram: int = Field(4, ge=1)
    """monitor/repetition counts repeated n-grams of this length in each sample."""
    baseline_steps: int = Field(3, ge=1)
    """monitor/length_drift compares the response length with its mean over the first N steps."""
    alerts: dict[str, AlertConfig] = Field(default_factory=dict)
    """Metric -> {above: x} or {below: y}: a warning line and an AlertFired event (metrics.jsonl)
    each step the metric is past it.
    Example: `{monitor/repetition: {above: 0.5}, monitor/reward_std: {below: 0.01}}`"""


class Config(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy model."""
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    """Who generates the rollouts' tokens."""
    env: EnvConfig = Field(default_factory=EnvConfig)
    """The environment: tasks, tools and rewards."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """How episodes and groups are produced."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Advantage estimator, policy loss and their settings."""
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    """Optimizer, precision, batching and placement of the learner."""
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    """Steps, asynchrony, checkpoints, evaluation and threads of the run."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Where metrics and traces go."""
    ray: RayConfig = Field(default_factory=RayConfig)
    """Placement under orchestrator.backend=ray."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Tasks from local dataset files."""
    reward: RewardConfig = Field(default_factory=RewardConfig)
    """Rewards beyond the environment's own."""
    preference: PreferenceConfig = Field(default_factory=PreferenceConfig)
    """Preference optimisation (`agentrl dpo`)."""
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    """The OpenAI-compatible gateway that agent programs call (docs/gateway.md)."""
    distill: DistillConfig = Field(default_factory=DistillConfig)
    """On-policy distillation from teacher models (docs/credit.md)."""
    monitors: MonitorsConfig = Field(default_factory=MonitorsConfig)
    """Per-step health monitors and their alerts (docs/credit.md)."""

    _moved_gateway_options = model_validator(mode="before")(_gateway_options_moved)

    @model_validator(mode="after")
    def _dataset_env(self) -> Config:
        # a dataset runs in the one-turn dataset environment unless another one is named;
        # written out explicitly so a saved config (resume, export) reads the same
        if self.data.path is not None and "name" not in self.env.model_fields_set:
            self.env.name = DATASET_ENV
        return self

    # where each key's value was written (a file's line, a --set override); see source_of
    _sources: Sources = PrivateAttr(default_factory=Sources)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def source_of(self, key: str) -> str:
        """Where the value of dotted `key` came from: ``configs/x.yaml, line 12``, ``--set
        key=value``, or ``default``."""
        return self._sources.of(key)


# --- loading -------------------------------------------------------------------------

# keys that existed once: an old config naming one gets this line instead of "unknown key"
REMOVED_KEYS: dict[str, str] = {
    "sampler.drain_on_update": "sampler.drain_on_update was removed: use sampler.on_update: "
    "drain (finish in-flight sequences on the old weights before a swap)",
    "orchestrator.partial_rollouts": "orchestrator.partial_rollouts was removed: use "
    "sampler.on_update: drain for partial_rollouts: false (no rollout spans two weight "
    "versions); true is the default (sampler.on_update: auto)",
    "learner.bf16_matmul": "learner.bf16_matmul was removed: delete it (bf16 matmuls run on "
    "torch's kernels; on a CPU without bf16 instructions a bf16 config computes in float32)",
    "learner.share_weights": "learner.share_weights was removed: delete it (the sampler keeps "
    "its own copy of the weights; how a learner process hands them over is "
    "learner.weight_sharing)",
}


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at `loc` (for key suggestions)."""
    cls: Any = Config
    for part in loc[:-1]:
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            return None
        f = cls.model_fields.get(str(part))
        if f is None:
            return None
        cls = f.annotation
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _problems(err: ValidationError) -> list[Problem]:
    """Every pydantic error as a problem naming its dotted key."""
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        dotted = ".".join(str(p) for p in loc)
        printable = dotted if dotted.isprintable() else repr(dotted)[1:-1]
        if e["type"] == "extra_forbidden" and dotted in REMOVED_KEYS:
            problems.append(Problem(dotted, REMOVED_KEYS[dotted]))
        elif e["type"] == "extra_forbidden":
            owner = _model_at(loc)
            hint = suggest(str(loc[-1]), owner.model_fields) if owner else ""
            valid = ", ".join(owner.model_fields) if owner else ""
            problems.append(
                Problem(dotted, f"unknown key '{printable}'{hint}; valid keys here: {valid}")
            )
        else:
            problems.append(Problem(dotted, f"{e['msg']} (got {e.get('input')!r})"))
    return problems


def _yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line: what, and where (line, column)."""
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return repr(where + what)[1:-1]


def _field_at(path: list[str]) -> tuple[FieldInfo | None, bool]:
    """The schema field a dotted override path names, and whether the path reaches inside a
    free-form mapping (``env.options.size``); (None, False) for an unknown key."""
    model: Any = Config
    field = None
    for part in path:
        if model is None:  # under a mapping-valued field: any key goes
            return field, True
        field = model.model_fields.get(part)
        if field is None:
            return None, False
        sections = [
            a
            for a in (field.annotation, *typing.get_args(field.annotation))
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        model = sections[0] if sections else None
    return field, False


def _takes_null(field: FieldInfo) -> bool:
    annotation = field.annotation
    return annotation is Any or type(None) in typing.get_args(annotation)


def _unsets(path: list[str]) -> bool:
    """Whether ``--set KEY=null`` removes KEY (its default applies) rather than writing null:
    always, unless KEY takes null and its default is something else (``data.answer``); an
    unknown KEY keeps its null so the unknown-key error names it."""
    field, in_mapping = _field_at(path)
    if in_mapping:
        return True
    if field is None:
        return False
    return not _takes_null(field) or field.get_default(call_default_factory=True) is None


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(
    data: dict[str, Any], overrides: list[str], sources: Sources | None = None
) -> dict[str, Any]:
    """Apply dotted `key=value` overrides (values parsed as YAML scalars) to a dict;
    ``key=null`` unsets the key (see :func:`_unsets`). `sources` records each override."""
    for item in overrides:
        path, value = _parse_override(item)
        if sources is not None:
            sources.set(".".join(path), f"--set {item}")
        if value is None and _unsets(path):
            node: Any = data
            for part in path[:-1]:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(path[-1], None)
            continue
        node = data
        for part in path[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
            node = nxt
        node[path[-1]] = value
    return data


@dataclass
class RawConfig:
    """A config as written (the YAML with the overrides applied), before validation, and
    where each of its keys came from."""

    data: dict[str, Any]
    sources: Sources


def read_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RawConfig:
    """The YAML file (or nothing) with `overrides` applied; a missing file, broken YAML or a
    malformed override is a :class:`ConfigError` here (nothing else can be checked then)."""
    data: dict[str, Any] = {}
    sources = Sources()
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p} (see configs/ for ready-to-run ones)")
        text = p.read_text()
        try:
            loaded = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {_yaml_problem(e)}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: top level must be a mapping of sections")
        data = loaded
        sources = Sources.from_yaml(text, str(p))
    return RawConfig(apply_overrides(data, overrides or [], sources), sources)


def validate_config(raw: RawConfig) -> tuple[Config | None, list[Problem]]:
    """The validated config, or None and every problem pydantic found."""
    try:
        cfg = Config.model_validate(raw.data)
    except ValidationError as e:
        return None, _problems(e)
    cfg._sources = raw.sources
    return cfg, []


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> Config:
    cfg, problems = validate_config(RawConfig(data, Sources.from_mapping(data, source)))
    if cfg is None:
        raise ConfigError(report(problems, Sources.from_mapping(data, source)))
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (or defaults when `path` is None) and apply overrides; every
    problem is reported at once, each with where its value came from."""
    raw = read_config(path, overrides)
    cfg, problems = validate_config(raw)
    if cfg is None:
        raise ConfigError(report(problems, raw.sources))
    return cfg
