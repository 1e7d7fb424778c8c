"""Run configuration: pydantic models, YAML loading and dotted overrides.

    cfg = load_config("configs/demo.yaml", overrides=["learner.lr=1e-6"])

Unknown keys are errors that name the key and suggest the closest valid one; bad values
name the field, the value and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrl._suggest import suggest
from agentrl.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(_Section):
    """LoRA adapters on the policy (peft): the learner trains only them; samplers get merged
    weights (base + B @ A * alpha / r) under the base model's names. See docs/gpu.md."""

    r: int = Field(16, ge=1, description="adapter rank")
    alpha: float = Field(32.0, gt=0.0, description="scale = alpha / r")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # module names to adapt, or "all-linear" (every linear layer but the LM head)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class ModelConfig(_Section):
    name: str = "smollm2-135m-instruct"  # alias, hub id, local folder or .gguf file
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    chat_template: str | None = None  # path to a jinja template; default: model's or Hermes
    seed: int = 0  # for randomly initialised aliases (tiny-llama)
    gradient_checkpointing: bool = False
    lora: LoraConfig | None = None  # null = full fine-tuning


class SamplerConfig(_Section):
    backend: Literal["hf", "vllm", "openai"] = "hf"
    max_batch_size: int = Field(32, ge=1, description="sequences decoded together")
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    max_new_tokens: int = Field(256, ge=1, description="per assistant turn")
    # seeded sampling: each episode's turn draws from its own stream, derived from this
    # seed and the task's index, so a run and its resume sample the same tokens whatever
    # the batch-mates; null = unseeded
    seed: int | None = None
    # what in-flight sequences do when new weights arrive (docs/off_policy.md): keep = go
    # on with the KV the old weights computed (tokens after the swap see a mix); reprefill =
    # recompute the whole context's KV under the new weights, then go on (AReaL's
    # interruptible generation, exact); drain = finish on the old weights first (no rollout
    # spans two versions); auto = the backend's own: hf keep, vllm reprefill, openai drain
    on_update: Literal["auto", "keep", "reprefill", "drain"] = "auto"
    device: str = "auto"  # hf backend: auto (CUDA when present), cpu, cuda, cuda:N
    # share of the GPU's memory the sampler may use: hf: checked against its weights at
    # start, then enforced as the process's CUDA cap; vllm: its gpu_memory_utilization
    # (vLLM's default, 0.9, leaves a colocated learner nothing); null = no budget / vLLM's
    # default. Ignored on CPU
    gpu_memory_fraction: float | None = Field(None, gt=0.0, le=1.0)
    base_url: str | None = None  # openai backend
    api_key: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)  # backend-specific extras


class EnvConfig(_Section):
    name: str = "code_math"  # built-in name, entry-point name, or module:Class
    options: dict[str, Any] = Field(default_factory=dict)
    eval_options: dict[str, Any] = Field(default_factory=dict)  # held-out tasks for eval


class BranchingConfig(_Section):
    enabled: bool = False
    budget: int = Field(8, ge=1, description="M: total trajectories per task")
    initial: int = Field(2, ge=1, description="N: ordinary samples started per task")
    branches: int = Field(2, ge=1, description="Z: continuations forked at a branch point")
    entropy_window: int = Field(20, ge=1, description="k: tokens whose entropy is measured")
    alpha: float = 0.2
    beta: float = 0.5
    tau: float = 0.5
    mode: Literal["stochastic", "threshold"] = "stochastic"
    # how a branch tree's sequence advantages reach its tokens: soft | hard, or a name
    # registered with @register_tree_attribution (checked when the learner is built)
    attribution: str = "soft"

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
    options: dict[str, Any] = Field(default_factory=dict)


class RolloutConfig(_Section):
    group_size: int = Field(8, ge=1, description="G: samples per task")
    concurrency: int = Field(32, ge=1, description="episodes in flight")
    max_turns: int = Field(4, ge=1)
    max_tool_calls: int = Field(8, ge=0)
    max_tokens: int = Field(1024, ge=16, description="token budget of a whole episode")
    on_template_mismatch: Literal["error", "resample"] = "error"
    infra_retries: int = Field(1, ge=0)
    episode_timeout_s: float = Field(300.0, gt=0)
    # how one sample is produced: "episode" (the environment-driven runner) or a workflow,
    # `async def run_episode(ctx) -> Trajectory`, by registered name or "module:function"
    workflow: str = "episode"
    branching: BranchingConfig = Field(default_factory=BranchingConfig)
    # hooks run in order on each finished group before it reaches the buffer: ghpo_hint
    # (resample an all-fail group with a hint), replay (a stored success into an all-fail
    # group), or your own; a name or {name, options}. See docs/credit.md
    group_hooks: list[str | GroupHookConfig] = Field(default_factory=list)


class OverlongConfig(_Section):
    enabled: bool = False
    max_len: int = Field(1024, ge=1, description="L_max")
    cache_len: int = Field(256, ge=0, description="L_cache: soft-penalty interval")
    coef: float = 1.0
    # DAPO overlong filtering: truncated samples (a limit hit, or the last turn cut at
    # max_new_tokens) leave the loss; independent of the soft penalty (`enabled`)
    filter: bool = False


class AlgorithmConfig(_Section):
    advantage: str = "grpo"  # gae | grpo | dr_grpo | rloo | reinforce_pp | reinforce_pp_baseline
    # | gigpo | grpo_lambda | lite_ppo | reinforce_mean | tree_grpo (docs/credit.md)
    policy_loss: str = "ppo"  # ppo | gspo | gspo_token | gmpo | gvpo | ppo_adaptive_kl
    # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm, or a name registered with
    # @register_aggregation (every registry name is checked when the learner is built)
    agg: str = "token-mean"
    eps_low: float = Field(0.2, ge=0.0)
    eps_high: float = Field(0.28, ge=0.0)
    dual_clip_c: float | None = Field(None, gt=1.0)
    kl: str | None = None  # k1 | k2 | k3 | k3+ ; None disables the KL term
    kl_coef: float = Field(0.0, ge=0.0)
    # REINFORCE++: the KL penalty goes into the per-token reward (r_t - kl_coef * KL_t)
    # instead of the loss; needs `kl`, kl_coef > 0 and a token-reward advantage
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    # off-policy corrections (docs/off_policy.md); the is_* keys act under tis / decoupled
    off_policy: Literal["none", "tis", "decoupled"] = "none"
    is_cap: float = Field(2.0, gt=0.0, description="cap of truncated importance weights")
    is_mode: Literal["truncate", "mask"] = "truncate"  # above is_cap: cap the weight, or drop
    is_level: Literal["token", "sequence"] = "token"  # sequence: prod of the row's token ratios
    # drop tokens whose pi_old/pi_behave is outside [is_mask_low, is_mask_high]: token =
    # IcePop, geometric = whole sequences by their geometric-mean ratio (or a registered mask)
    is_mask: str | None = None
    is_mask_low: float = Field(0.5, ge=0.0)
    is_mask_high: float = Field(5.0, gt=0.0)
    # decoupled's pi_prox: recompute = a no-grad pass at the start of the step; loglinear =
    # AReaL's interpolation between behaviour and current log-probs (no extra pass)
    proximal: Literal["recompute", "loglinear"] = "recompute"
    # auto: skip that pass when pi_old is the behaviour policy (max_staleness 0, one
    # optimizer update per step, the hf sampler in the learner's dtype, every trained token
    # at the learner's version) and use the behaviour log-probs; off: always recompute
    proximal_bypass: Literal["auto", "off"] = "auto"
    dynamic_sampling: bool = False
    # dynamic sampling's bound: after this many all-equal groups in a row (a warning half
    # way), stop with an error naming the likely cause, or (train) train on them anyway
    max_dropped_groups: int = Field(64, ge=1)
    on_max_dropped: Literal["error", "train"] = "error"
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    lam: float = Field(1.0, ge=0.0, le=1.0)
    critic: bool = False  # PPO with a learned value function
    value_clip: float = Field(0.2, ge=0.0)
    vf_coef: float = Field(0.5, ge=0.0)
    norm_length: int | None = None  # constant for seq-mean-token-sum-norm (default: max_tokens)
    options: dict[str, Any] = Field(default_factory=dict)  # extra kwargs for custom registries

    @field_validator("proximal_bypass", mode="before")
    @classmethod
    def _bypass_off(cls, v: Any) -> Any:
        # YAML reads a bare on/off as a boolean (`--set algorithm.proximal_bypass=off`)
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


class LearnerConfig(_Section):
    lr: float = Field(1e-6, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(1.0, gt=0.0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    batch_groups: int = Field(4, ge=1, description="task groups per training step")
    micro_batch_size: int = Field(4, ge=1, description="sequences per forward/backward")
    ppo_epochs: int = Field(1, ge=1)
    minibatches: int = Field(1, ge=1, description="optimizer steps per epoch")
    # bf16 autocast: auto = where the device computes bf16 natively; on = also on a GPU
    # without it (a CPU without bf16 instructions says so and trains in float32)
    bf16: Literal["auto", "on", "off"] = "auto"
    # fp16 autocast with a gradient scaler (loss scaling, overflowing steps skipped; its
    # state is checkpointed): for GPUs without bf16. Not together with bf16=on
    fp16: Literal["on", "off"] = "off"
    device: str = "auto"  # auto (CUDA when present), cpu, cuda, cuda:N; the critic and the
    # reference model live here too
    # share of the GPU's memory the learner may use (weights, gradients, AdamW state checked
    # at start, then enforced as its process's CUDA cap); null = no budget. Ignored on CPU
    gpu_memory_fraction: float | None = Field(None, gt=0.0, le=1.0)
    # how the learner process hands weights to this one: auto = CUDA IPC handles when the
    # learner is on CUDA (no trip through host memory), else shared-memory files
    weight_sharing: Literal["auto", "cuda_ipc", "shared_memory"] = "auto"
    logprob_chunk: int = Field(512, ge=1, description="sequence chunk for log-softmax")
    # the LM head's element-wise log-softmax passes compiled with torch.compile (fused per
    # row): auto = on CPU where it compiles, else the eager passes; on = an error if it
    # cannot; off = eager. See agentrl.algos.fused
    fused_logprobs: Literal["auto", "on", "off"] = "auto"
    # regional torch.compile: each decoder layer of the policy (critic, reference model)
    # compiled in place, fusing the element-wise work around the matmuls: off (the default
    # until a GPU run has measured it); auto = on CUDA, off on CPU (a first compile of tens
    # of seconds, paid back by long runs only); on = any device (share_prompt is off then).
    # See agentrl.learner.compiled
    compile: Literal["auto", "on", "off"] = "off"
    # forward a group's shared prompt once (its KV cache repeated for the group's rows):
    # identical values and gradients, a fraction of the compute when prompts dominate
    share_prompt: bool = True
    # a micro-batch's sequences concatenated into one row (position ids restarting per
    # sequence, attention block-diagonal): no compute on padding. Micro-batches whose rows
    # share a prompt (share_prompt) keep that path; see docs/performance.md#packing
    packing: bool = False
    # attention kernel: auto = math for micro-batches of <= 256 tokens on CPU (faster there),
    # else PyTorch's own choice; torch / math / flash force one
    sdpa_backend: Literal["auto", "torch", "math", "flash"] = "auto"
    critic_lr: float | None = None
    # keep only the gated MLP's input for backward and recompute its gate/up projections
    # there (Llama-family MLPs): about half a layer's activations for +13% of the learner's
    # matmuls (full model.gradient_checkpointing: all of them for +33%). See
    # docs/performance.md#half-precision-and-activation-checkpointing
    recompute_mlp: bool = False
    # ranks of one torch.distributed group training the policy together (gloo on CPU, NCCL
    # on GPU, one GPU each), launched by the run layer: local processes, or Ray actors in a
    # placement group under orchestrator.backend=ray. See agentrl.learner.distributed
    world_size: int = Field(1, ge=1)
    # ddp = every rank holds the model, gradients summed by all-reduce; fsdp = torch's
    # FSDP2 per decoder layer: parameters, gradients and AdamW state sharded 1/world_size
    parallel: Literal["ddp", "fsdp"] = "ddp"
    # fsdp: keep the sharded parameters, gradients and optimizer state in host memory
    cpu_offload: bool = False
    # how long any collective of the learner group may wait before it fails (a dead rank)
    collective_timeout_s: float = Field(600.0, gt=0)

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
    max_staleness: int = Field(1, ge=0, description="0 = synchronous on-policy")
    time_limit_s: float | None = Field(
        None, gt=0, description="stop after the step that crosses this wall time (checkpointed)"
    )
    seed: int = 0
    # where the run's parts live: local = this process (plus the learner child); ray = the
    # same classes in Ray actors sized by the `ray` section (see docs/ray.md)
    backend: Literal["local", "ray"] = "local"
    checkpoint_every: int = Field(5, ge=0, description="0 disables periodic checkpoints")
    # evaluate on held-out tasks (env.eval_options) every N steps and at the last step:
    # pass@k / maj@k logged as eval/* metrics; 0 = never
    eval_every: int = Field(0, ge=0)
    eval_tasks: int = Field(16, ge=1, description="held-out tasks per evaluation")
    eval_samples: int = Field(4, ge=1, description="samples per held-out task (k)")
    # torch intra-op threads on CPU. None: every core in sync mode; half the cores in async
    # mode for the sampler's process, where the sampler and the learner compute at the same
    # time (the learner's own process: learner_cpu_threads)
    cpu_threads: int | None = Field(None, ge=1)
    # torch threads of the learner when it runs in its own process (learner_worker); None:
    # cpu_threads if set, else every core: it then takes the cores the sampler leaves idle
    # between batches (idle OpenMP threads sleep there: OMP_WAIT_POLICY=PASSIVE)
    learner_cpu_threads: int | None = Field(None, ge=1)
    # system: the C allocator as the process has it; reuse (opt in, glibc): freed memory
    # stays in the process for the next allocation instead of going back to the kernel
    # (fewer page faults on CPU, resident memory near its peak); see agentrl.cpu
    cpu_allocator: Literal["reuse", "system"] = "system"
    # where the learner computes: process = a spawned child with its own interpreter (its
    # Python loop never waits on the sampler's GIL; weights come back in shared memory);
    # thread = a worker thread of this process (the Learner object stays reachable as
    # orch.learner, plug-ins registered at run time are seen); auto = process when async
    # (sampler and learner compute at the same time), thread when synchronous
    learner_worker: Literal["auto", "thread", "process"] = "auto"
    run_dir: str | None = None


class WandbConfig(_Section):
    """Weights & Biases: ``logging.wandb: {mode: offline}`` writes a local run folder."""

    # disabled: nothing is logged and wandb is never imported (W&B's own word for off)
    mode: Literal["online", "offline", "disabled"] = "offline"
    project: str = "agentrl"
    entity: str | None = None
    name: str | None = None  # default: the run directory's name
    group: str | None = None
    tags: list[str] = Field(default_factory=list)
    dir: str | None = None  # parent of the wandb/ folder; default: the run directory

    @property
    def enabled(self) -> bool:
        return self.mode != "disabled"


class LoggingConfig(_Section):
    tensorboard: bool = False
    # absent or false: off; true: the defaults of WandbConfig (offline); or a mapping
    wandb: WandbConfig = Field(default_factory=lambda: WandbConfig(mode="disabled"))
    progress: bool = True
    trace: bool = True
    # a trained step's metrics go to metrics.jsonl, TensorBoard and W&B every N steps (the
    # last step always); the progress line and the other events are not thinned
    log_every: int = Field(1, ge=1)

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
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    # custom Ray resources a node must offer (`ray start --resources='{"rollout": 8}'`)
    resources: dict[str, float] = Field(default_factory=dict)


class RayConfig(_Section):
    """Placement under ``orchestrator.backend: ray`` (ignored by ``local``)."""

    # an existing cluster ("ray://host:10001", "host:6379", "auto"); None: RAY_ADDRESS when
    # set, else a local Ray instance started for the run (and stopped with it)
    address: str | None = None
    # CPUs of a local instance (scheduling tokens); None: the machine's cores, or what the
    # roles reserve in all when that is more (the default roles start on a 2-core laptop)
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a local instance")
    samplers: RayRoleConfig = Field(default_factory=RayRoleConfig)
    rollout_workers: RayRoleConfig = Field(default_factory=RayRoleConfig)
    learner: RayRoleConfig = Field(default_factory=RayRoleConfig)
    # how weights travel from the learner to the samplers: object_store = put once, every
    # replica reads it; gloo / nccl = a torch.distributed broadcast group (CPU / GPU)
    weight_transport: Literal["object_store", "gloo", "nccl"] = "object_store"
    # PACK keeps a role's bundles on few nodes; SPREAD over many; STRICT_* insist
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    max_restarts: int = Field(3, ge=0, description="restarts of a dead sampler/rollout actor")
    # an episode stays on its replica (warm prefix cache) unless that replica has this many
    # more requests in flight than the least busy one
    sticky_slack: int = Field(8, ge=0)
    start_timeout_s: float = Field(60.0, gt=0, description="wait for resources and actors")


DATASET_ENV = "dataset"  # agentrl.envs.dataset:DatasetEnv


class DataConfig(_Section):
    """Tasks from local files through Hugging Face ``datasets`` (docs/bring_your_own.md):
    they replace the environment's own tasks; every column reaches the reward functions."""

    # a file, glob or folder (JSON/JSONL, CSV, parquet, arrow, a save_to_disk folder), or
    # {split: path} for several splits; None: the environment's own tasks
    path: str | dict[str, str] | None = None
    format: Literal["auto", "json", "csv", "parquet", "arrow", "disk"] = "auto"
    split: str = "train"
    eval_split: str | None = None  # the split `agentrl eval` and eval_every use
    # column mapping: the user's text (None: the first of prompt, question present), or a
    # chat column (a list of {role, content}) instead; the reference answer (optional)
    prompt: str | None = None
    messages: str | None = None
    answer: str | None = "answer"
    id: str | None = None  # default: the row's index in its split
    columns: list[str] | None = None  # columns kept in the task (None: all)
    shuffle: bool = True  # a fresh seeded order every epoch (seed = orchestrator.seed + epoch)
    streaming: bool = False  # read rows lazily (large files); shuffles within a buffer
    shuffle_buffer: int = Field(10_000, ge=1)
    max_rows: int | None = Field(None, ge=1)


class RewardFunctionConfig(_Section):
    fn: str  # package.module:function or file.py:function
    weight: float = 1.0
    name: str | None = None  # default: the function's name (reward_info key)


class JudgeConfig(_Section):
    """LLM-as-judge: a prompt per finished episode, a score parsed from the reply."""

    # the judge: a model (alias, folder or hub id) on its own hf sampler, or with base_url
    # an OpenAI-compatible server; None = the run's own sampler (the policy judges itself)
    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    # str.format fields: {question}, {completion}, {answer} and every task column
    template: str = (
        "Rate the answer to the question from 0 to 10.\n\nQuestion: {question}\n\n"
        "Reference answer: {answer}\n\nAnswer: {completion}\n\n"
        "Reply with 'Score: <0-10>'."
    )
    pattern: str = r"(?i)score\s*[:=]?\s*(-?\d+(?:\.\d+)?)"  # group 1 is the score
    min_score: float = 0.0  # the parsed score is mapped from [min, max] to [0, 1]
    max_score: float = 10.0
    weight: float = 1.0
    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    # an unparseable reply: stop the run naming it (error), mask the episode (infra_error),
    # or score it 0
    on_unparseable: Literal["error", "infra_error", "zero"] = "error"
    # SPCT (Liu et al. 2025): k sampled judgements voted into one score (mean of the
    # parsed scores, or the most frequent one), with principles in the prompt
    # ({principles} in the template, else put before it)
    samples: int = Field(1, ge=1, description="k judgements per episode")
    vote: Literal["mean", "majority"] = "mean"
    principles: list[str] = Field(default_factory=list)

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
    weights: list[float] | None = None  # one per function (TRL's reward_weights)
    env_weight: float = 1.0
    model: str | None = None  # a reward model folder (agentrl rm train)
    model_weight: float = 1.0
    model_device: str = "auto"
    model_batch_size: int = Field(16, ge=1)
    model_max_length: int = Field(2048, ge=16)
    judge: JudgeConfig | None = None
    # the environment's step rewards (StepResult.step_reward, never the outcome) reach the
    # learner on the last token of their turn, times this weight;
    # sequence-level estimators add their weighted sum to the outcome. 0 ignores them
    step_weight: float = 1.0
    # process rewards from Python: fn(task, turn_text, turn_index) for every assistant turn,
    # weighted and added to that turn's process reward (module:function, as functions)
    process: list[str | RewardFunctionConfig] = Field(default_factory=list)
    # a process reward model (PRM): a reward model folder (agentrl rm train) that scores the
    # conversation up to each assistant turn; times its weight, added to that turn's process
    # reward. Loaded on model_device with model_batch_size / model_max_length (shared with
    # reward.model when both name the same folder)
    process_model: str | None = None
    process_model_weight: float = 1.0

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


class PreferenceConfig(_Section):
    """`agentrl dpo`: preference optimisation (docs/preference.md)."""

    # a registered preference loss: dpo, cdpo, robust, ipo, hinge, kto, orpo, simpo, tdpo
    loss: str = "dpo"
    beta: float | None = Field(None, gt=0.0)  # None: the loss's own default
    options: dict[str, Any] = Field(default_factory=dict)  # the loss's other options
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(8, ge=1, description="pairs (or unpaired rows) per step")
    max_length: int = Field(2048, ge=16)  # longer examples are skipped (and counted)
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0)  # held-out share for accuracy
    checkpoint_every: int = Field(0, ge=0)  # steps (and each epoch's end); 0 = the end only
    seed: int = 0
    # online DPO: rollouts -> best-vs-worst pairs (ties skipped) -> train -> publish
    rounds: int = Field(3, ge=1)
    groups_per_round: int = Field(8, ge=1)
    epochs_per_round: int = Field(1, ge=1)
    min_reward_gap: float = Field(0.0, ge=0.0)  # best - worst <= this is a tie
    step_pairs: bool = True  # ARPO tree groups also give fork-level (Step-DPO) pairs


class Config(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    preference: PreferenceConfig = Field(default_factory=PreferenceConfig)

    @model_validator(mode="after")
    def _dataset_env(self) -> Config:
        # a dataset runs in the one-turn dataset environment unless another one is named;
        # written out explicitly so a saved config (resume, export) reads the same
        if self.data.path is not None and "name" not in self.env.model_fields_set:
            self.env.name = DATASET_ENV
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


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


def _format_error(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        dotted = ".".join(str(p) for p in loc)
        if not dotted.isprintable():  # a key with a line break must not split the message
            dotted = repr(dotted)[1:-1]
        if e["type"] == "extra_forbidden" and dotted in REMOVED_KEYS:
            lines.append(REMOVED_KEYS[dotted])
        elif e["type"] == "extra_forbidden":
            owner = _model_at(loc)
            hint = suggest(str(loc[-1]), owner.model_fields) if owner else ""
            valid = ", ".join(owner.model_fields) if owner else ""
            lines.append(f"unknown key '{dotted}'{hint}; valid keys here: {valid}")
        else:
            value = e.get("input")
            lines.append(f"{dotted or '<root>'}: {e['msg']} (got {value!r})")
    return f"invalid config ({source}):\n  " + "\n  ".join(lines)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line: what, and where (line, column)."""
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return repr(where + what)[1:-1]


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


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted `key=value` overrides (values parsed as YAML scalars) to a dict."""
    for item in overrides:
        path, value = _parse_override(item)
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


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_error(e, source)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (or defaults when `path` is None) and apply overrides."""
    data: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p} (see configs/ for ready-to-run ones)")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {_yaml_problem(e)}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: top level must be a mapping of sections")
        data = loaded
        source = str(p)
    data = apply_overrides(data, overrides or [])
    return config_from_dict(data, source)
