"""The exception hierarchy of agentrl.

Every error raised on purpose by the package derives from :class:`AgentRLError`, so a
caller can catch the whole family in one clause. Errors caused by bad user input
(configs, datasets, plug-ins, tool arguments) say which field is wrong and how to fix it.
"""

from __future__ import annotations


class AgentRLError(Exception):
    """Base class of every error agentrl raises on purpose."""


# --- bad input from users -------------------------------------------------------------


class ConfigError(AgentRLError, ValueError):
    """A config file or a `--set` override is invalid. The message names the field."""


class DatasetError(AgentRLError, ValueError):
    """A dataset file is malformed. The message names the file, the line and the field."""


class PluginError(AgentRLError):
    """A plug-in (environment, tool, algorithm) could not be found or loaded."""


class MissingExtra(AgentRLError, ImportError):
    """An optional part of agentrl is used without its extra; the message names the extra:
    ``the search index needs tantivy: pip install 'agentrl[demo]'``."""


class UnknownNameError(AgentRLError, KeyError):
    """A name looked up in a registry does not exist; the message suggests close names."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else ""


# --- models and samplers ---------------------------------------------------------------


class ModelLoadError(AgentRLError):
    """A model or tokenizer could not be loaded."""


class SamplerError(AgentRLError):
    """A sampler failed to generate."""


class PromptError(SamplerError, ValueError):
    """A prompt is empty or longer than the model's context."""


class WeightUpdateError(AgentRLError):
    """New weights could not be applied; the sampler keeps its previous version."""


# --- episodes, tools, sandboxes ---------------------------------------------------------


class InfraError(AgentRLError):
    """The platform failed (not the agent): the episode is `infra_error`, not a bad answer."""


class SandboxError(InfraError):
    """The sandbox itself failed (could not start, died, protocol broke)."""


class SandboxUnavailableError(SandboxError):
    """A sandbox backend cannot run on this machine (the message says why)."""


class ToolError(AgentRLError):
    """A tool failed for reasons of the platform (service down, timeout of the platform)."""


class EnvError(InfraError):
    """An environment raised in `reset` or `step`."""


class TemplateMismatchError(AgentRLError):
    """Incremental rendering diverged from a full render of the conversation."""


# --- training ---------------------------------------------------------------------------


class CheckpointError(AgentRLError):
    """A checkpoint is missing, incomplete or incompatible."""


class TrainingStalledError(AgentRLError):
    """Training cannot make progress (every sampled group is dropped, say)."""


class RewardError(AgentRLError, ValueError):
    """A reward (function, model, judge) gave something that is not a finite number: the
    run stops rather than train on it. The message names the source and the value."""


def user_error(e: BaseException) -> AgentRLError | None:
    """The :class:`AgentRLError` behind `e`, also when a task group wrapped it in an
    exception group (the first one found); None for anything else (a bug: show it)."""
    if isinstance(e, AgentRLError):
        return e
    for inner in getattr(e, "exceptions", ()):  # BaseExceptionGroup
        found = user_error(inner)
        if found is not None:
            return found
    return None
