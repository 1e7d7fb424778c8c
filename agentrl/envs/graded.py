"""What the environments that grade in ``reward()`` share (``code_tests``, ``repo``: their
graders run in sandboxes, asynchronously): the verifier slot they leave to ``reward()``,
and the rule that a task file is read with ``source: file``."""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import model_validator

from agentrl.envs.base import EnvOptions
from agentrl.errors import EnvError


class GradedInReward:
    """The verifier slot of an environment that grades in ``reward()``, never here."""

    def __init__(self, why: str) -> None:
        self.why = why

    def score(self, answer_text: str, task: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        raise EnvError(self.why)


def check_file_source(source: str, dataset_path: str | None, what: str) -> None:
    """``source: file`` needs ``dataset_path`` (a JSONL of `what`), which nothing else reads."""
    if source == "file" and not dataset_path:
        raise ValueError(f"source 'file' needs dataset_path (a JSONL of {what})")
    if dataset_path and source != "file":
        raise ValueError(f"dataset_path is read with source: file (got source: {source})")


class FileSourceOptions(EnvOptions):
    """Options with ``source`` and ``dataset_path`` (declared by the subclass), checked by
    :func:`check_file_source`; `file_holds` names what a line of the file is."""

    file_holds: ClassVar[str] = "tasks"

    @model_validator(mode="after")
    def _file_needs_path(self) -> Self:
        check_file_source(self.source, self.dataset_path, self.file_holds)  # type: ignore[attr-defined]
        return self
