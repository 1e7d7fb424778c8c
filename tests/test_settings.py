"""The resolve stage: every component's settings from one config, decided once."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from agentrl.config import (
    AlgorithmConfig,
    BranchingConfig,
    Config,
    DataConfig,
    DistillConfig,
    JudgeConfig,
    LearnerConfig,
    MonitorsConfig,
    OverlongConfig,
    PreferenceConfig,
    RewardConfig,
    RolloutConfig,
    SamplerConfig,
    TeacherConfig,
    config_from_dict,
    load_config,
)
from agentrl.envs.dataset import DataSettings
from agentrl.errors import ConfigError
from agentrl.learner.settings import (
    AlgorithmSettings,
    DistillSettings,
    MonitorSettings,
    OverlongSettings,
    TeacherSettings,
    TrainSettings,
)
from agentrl.preference.settings import PreferenceSettings
from agentrl.rewards.settings import RM_LR, JudgeSettings, RewardSettings
from agentrl.rollout.settings import BranchingSettings, RolloutSettings
from agentrl.run.settings import (
    data_settings,
    preference_settings,
    resolve,
    reward_model_training_settings,
    sft_settings,
)
from agentrl.samplers import sampler_options
from agentrl.samplers.settings import SamplerSettings
from agentrl.training.settings import SFT_LR

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answers")

# each config section and the settings that carry it (keys the resolve stage folds away:
# reward.weights goes into each function's weight)
MIRRORS = [
    (AlgorithmConfig, AlgorithmSettings, set()),
    (OverlongConfig, OverlongSettings, set()),
    (LearnerConfig, TrainSettings, set()),
    (RolloutConfig, RolloutSettings, set()),
    (BranchingConfig, BranchingSettings, set()),
    (SamplerConfig, SamplerSettings, set()),
    (RewardConfig, RewardSettings, {"weights"}),
    (JudgeConfig, JudgeSettings, set()),
    (DataConfig, DataSettings, set()),
    (PreferenceConfig, PreferenceSettings, set()),
    (DistillConfig, DistillSettings, set()),
    (TeacherConfig, TeacherSettings, set()),
    (MonitorsConfig, MonitorSettings, set()),
]


@pytest.mark.parametrize(("section", "settings", "folded"), MIRRORS)
def test_every_config_key_reaches_its_settings(section, settings, folded) -> None:
    names = {f.name for f in dataclasses.fields(settings)}
    missing = set(section.model_fields) - names - folded
    assert not missing, f"{settings.__name__} lacks {sorted(missing)}: add them"


def test_algorithm_defaults_agree_with_the_schema() -> None:
    # the objective calls a key at its default "not set" (agentrl.learner.objective)
    for key, field in AlgorithmConfig.model_fields.items():
        if key == "overlong":
            continue
        default = field.default_factory() if field.default_factory else field.default
        assert AlgorithmSettings.default(key) == default, key


def test_the_demo_config_resolves_to_frozen_picklable_settings() -> None:
    settings = resolve(load_config("configs/demo.yaml"))
    assert pickle.loads(pickle.dumps(settings)) == settings  # what the learner process gets
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.learner.train.lr = 1.0  # type: ignore[misc, union-attr]


@no_cuda
def test_auto_is_decided_once_on_a_cpu_machine() -> None:
    s = resolve(Config())
    assert s.learner is not None
    assert s.learner.train.device == "cpu" and s.sampler.device == "cpu"
    assert s.learner.train.weight_sharing == "shared_memory"
    assert s.learner.sampler_dtype in (torch.float32, torch.bfloat16)


@pytest.mark.parametrize(("staleness", "worker"), [(0, "thread"), (1, "process")])
def test_async_runs_put_the_learner_in_its_own_process(staleness: int, worker: str) -> None:
    s = resolve(config_from_dict({"orchestrator": {"max_staleness": staleness}}))
    assert s.asynchronous == (staleness > 0) and s.learner_worker == worker
    assert s.learner is not None and s.learner.max_staleness == staleness


def test_ranks_need_processes() -> None:
    cfg = config_from_dict(
        {"learner": {"world_size": 2}, "orchestrator": {"learner_worker": "thread"}}
    )
    with pytest.raises(ConfigError, match=r"orchestrator\.learner_worker=process"):
        resolve(cfg)


@no_cuda
def test_only_training_resolves_the_learners_device() -> None:
    cfg = config_from_dict({"learner": {"device": "cuda:0"}})
    assert resolve(cfg, "eval").learner is None  # an eval run does not check learner.device
    with pytest.raises(ConfigError, match=r"learner\.device"):
        resolve(cfg)


def test_cross_section_values_land_where_they_are_used() -> None:
    cfg = config_from_dict(
        {
            "rollout": {"max_tokens": 300, "branching": {"attribution": "hard"}},
            "reward": {
                "step_weight": 0.5,
                "functions": ["a:f", {"fn": "b:g", "weight": 3.0}],
                "weights": [2.0, 4.0],
            },
            "sampler": {"temperature": 0.7, "max_new_tokens": 9},
            "orchestrator": {"seed": 5},
        }
    )
    s = resolve(cfg)
    assert s.learner is not None and s.learner.temperature == 0.7
    assert (s.objective.norm_length, s.objective.attribution, s.objective.step_weight) == (
        300,
        "hard",
        0.5,
    )
    assert [f.weight for f in s.reward.functions] == [2.0, 4.0]  # reward.weights wins
    assert s.rollout.sampling.max_new_tokens == 9 and s.rollout.seed == 5
    assert s.objective.algorithm.explicit == frozenset()


def test_a_backend_still_refuses_what_the_user_set_and_it_cannot_honour() -> None:
    cfg = config_from_dict(
        {"sampler": {"backend": "openai", "base_url": "http://x"}, "model": {"dtype": "float16"}}
    )
    with pytest.raises(ConfigError, match=r"model\.dtype cannot be honoured"):
        sampler_options(resolve(cfg).sampler)
    ok = config_from_dict({"sampler": {"backend": "openai", "base_url": "http://x"}})
    assert sampler_options(resolve(ok).sampler)["base_url"] == "http://x"


@no_cuda
def test_the_training_modes_resolve_device_and_lr_once_with_their_flags_winning() -> None:
    plain = Config()
    assert sft_settings(plain).train.lr == SFT_LR  # learner.lr unset: the mode's own default
    assert reward_model_training_settings(plain).train.lr == RM_LR
    set_lr = load_config(overrides=["learner.lr=3e-4", "model.name=tiny-llama"])
    assert sft_settings(set_lr).train.lr == 3e-4
    assert sft_settings(set_lr, lr=1e-2).train.lr == 1e-2  # the flag wins
    assert reward_model_training_settings(set_lr).model == "tiny-llama"
    assert reward_model_training_settings(set_lr, model="other").model == "other"
    for settings in (sft_settings(plain), reward_model_training_settings(plain)):
        assert settings.train.device == "cpu"  # learner.device: auto, decided here
    pref = preference_settings(load_config(overrides=["preference.loss=ipo", "env.name=echo"]))
    assert pref.train.device == "cpu" and pref.loss == "ipo"
    assert pref.tools is not None and pref.tools.name == "echo"
    assert preference_settings(plain).tools is None  # no env named: rows bring their tools
    assert pickle.loads(pickle.dumps(pref)) == pref
    with pytest.raises(ConfigError, match=r"learner\.device"):
        sft_settings(plain, device="tpu")


def test_data_settings_remember_whether_the_answer_column_was_asked_for() -> None:
    assert not data_settings(Config()).answer_explicit
    assert data_settings(load_config(overrides=["data.answer=solution"])).answer_explicit


def test_distill_and_monitor_settings_resolve() -> None:
    cfg = config_from_dict(
        {
            "distill": {
                "teacher": "runs/teacher",
                "teachers": {"code": "http://localhost:8001", "math": {"model": "m"}},
                "reward_weight": 0.5,
            },
            "monitors": {"alerts": {"monitor/repetition": {"above": 0.5}}},
        }
    )
    learner = resolve(cfg).learner
    assert learner is not None
    d = learner.distill
    assert d.enabled and d.teacher == TeacherSettings(model="runs/teacher")
    assert (
        d.teachers["code"].base_url == "http://localhost:8001" and d.teachers["code"].model is None
    )
    assert d.teachers["math"].model == "m" and d.reward_weight == 0.5
    assert learner.monitors.alerts == (("monitor/repetition", "above", 0.5),)
    pickle.loads(pickle.dumps(learner))  # the learner process receives it
    with pytest.raises(ConfigError, match="above"):
        config_from_dict({"monitors": {"alerts": {"monitor/entropy": {}}}})
