"""W&B offline: a run's events become a local ``wandb/offline-run-*`` folder, no network."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from agentrl.config import LoggingConfig, WandbConfig, config_from_dict
from agentrl.errors import ConfigError, MissingExtra
from agentrl.run.events import (
    BatchTrained,
    EvalFinished,
    EventBus,
    RunFinished,
    RunStarted,
)
from agentrl.run.subscribers import subscribers_for
from tests.procs import live_descendants
from tests.waiting import wait_until

pytest.importorskip("wandb")
pytestmark = pytest.mark.timeout(120)  # a W&B service that waits for a network fails here


@pytest.fixture(autouse=True, scope="module")
def _no_wandb_core_left_behind():
    """wandb keeps its wandb-core service process for the life of the process that started
    it: end it with this module, so later tests that count this process's children (the
    sandbox's "nothing left behind") see none of it."""
    import wandb

    before = live_descendants()
    yield
    wandb.teardown()
    wait_until(lambda: live_descendants() <= before, "wandb-core gone after teardown")


@pytest.fixture(autouse=True)
def _no_network_no_account(tmp_path, monkeypatch):
    # any request to a server would go to a closed local port; no key, no user settings
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))


def _records(path: Path) -> list:
    """The protobuf records of a ``.wandb`` file (a LevelDB-style log after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    pos, block, buf, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        chunk = data[pos : pos + length]
        pos += length
        buf = chunk if kind in (1, 2) else buf + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
    return out


def _finished_records(run_folder: Path) -> list:
    """The records of an offline run, once its file holds the exit record.

    ``run.finish()`` returns when wandb-core has handled the exit; its writer closes the
    file a few milliseconds later (seen here: a 7-byte file right after finish, whole 10 ms on).
    """
    (wandb_file,) = run_folder.glob("run-*.wandb")

    def whole() -> list | None:
        records = _records(wandb_file)
        return records if any(r.WhichOneof("record_type") == "exit" for r in records) else None

    return wait_until(whole, f"the exit record in {wandb_file}", interval=0.01)


def _history(run_folder: Path) -> dict[int, dict[str, float]]:
    """``{step: {key: value}}`` logged to an offline run."""
    rows: dict[int, dict[str, float]] = {}
    for record in _finished_records(run_folder):
        if record.WhichOneof("record_type") != "history":
            continue
        items = {
            (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
            for item in record.history.item
        }
        rows.setdefault(items.pop("_step"), {}).update(
            {k: v for k, v in items.items() if not k.startswith("_")}
        )
    return rows


def _config(run_folder: Path) -> dict:
    runs = [r.run for r in _finished_records(run_folder) if r.WhichOneof("record_type") == "run"]
    return {u.key: json.loads(u.value_json) for u in runs[0].config.update}


def _play(subscribers: list, run_dir: Path, steps: int, eval_at: int | None = None) -> None:
    bus = EventBus()
    for fn in subscribers:
        bus.subscribe(fn)
    bus.publish(RunStarted(run_dir=str(run_dir), config={"learner": {"lr": 1e-6}}))
    for step in range(1, steps + 1):
        metrics = {"loss/total": 0.5 / step, "reward_mean": step / 10, "groups": 2}
        bus.publish(BatchTrained(step=step, version=step, metrics=metrics))
        if step == eval_at:
            bus.publish(EvalFinished(step=step, metrics={"reward_mean": 0.75}))
    bus.publish(RunFinished(step=steps, reason="completed"))
    bus.close()


def test_offline_run_writes_a_local_run_folder_with_the_history(tmp_path):
    logging_cfg = LoggingConfig(wandb={"mode": "offline"}, progress=False, trace=False)
    _play(subscribers_for(logging_cfg, tmp_path, max_steps=3), tmp_path, steps=3, eval_at=3)

    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    (folder,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")
    history = _history(folder)
    assert sorted(history) == [1, 2, 3]
    assert history[2]["loss/total"] == pytest.approx(0.25)
    assert history[3]["reward_mean"] == pytest.approx(0.3)
    assert history[3]["eval/reward_mean"] == pytest.approx(0.75)
    assert _config(folder)["learner"] == {"lr": 1e-6}


def test_log_every_thins_wandb_and_jsonl_and_keeps_the_last_step(tmp_path):
    logging_cfg = LoggingConfig(wandb=True, log_every=2, progress=False, trace=False)
    _play(subscribers_for(logging_cfg, tmp_path, max_steps=5), tmp_path, steps=5)

    (folder,) = (tmp_path / "wandb").glob("offline-run-*")
    assert sorted(_history(folder)) == [2, 4, 5]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert [r["step"] for r in rows if r["event"] == "BatchTrained"] == [2, 4, 5]


def test_wandb_config_shorthands():
    assert not LoggingConfig().wandb.enabled
    assert not LoggingConfig(wandb=False).wandb.enabled
    assert LoggingConfig(wandb=True).wandb == WandbConfig()  # offline, project agentrl
    on = config_from_dict({"logging": {"wandb": {"mode": "offline", "tags": ["demo"]}}})
    assert on.logging.wandb.enabled and on.logging.wandb.tags == ["demo"]
    # a run's saved config loads back the same
    again = config_from_dict(on.model_dump(mode="json")).logging.wandb
    assert again == on.logging.wandb
    with pytest.raises(ConfigError, match="did you mean 'project'"):
        config_from_dict({"logging": {"wandb": {"projct": "x"}}})


def test_missing_wandb_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(
        MissingExtra, match=r"^logging.wandb needs wandb: pip install 'agentrl\[wandb\]'$"
    ):
        subscribers_for(LoggingConfig(wandb=True), tmp_path, max_steps=1)
    # off: wandb is never imported
    subscribers = subscribers_for(LoggingConfig(progress=False), tmp_path, max_steps=1)
    assert [type(fn).__name__ for fn in subscribers] == ["JsonlMetrics", "TraceWriter"]
    for fn in subscribers:
        fn.close()


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path):
    from agentrl.run.wandb_writer import WandbWriter

    first = WandbWriter(WandbConfig(), tmp_path)
    first(RunStarted(run_dir=str(tmp_path), config={}))
    first(BatchTrained(step=1, version=1, metrics={"loss/total": 1.0}))
    first.close()  # interrupted: no RunFinished
    resumed = WandbWriter(WandbConfig(), tmp_path)
    resumed(RunStarted(run_dir=str(tmp_path), config={}, resumed_from_step=1))
    resumed(BatchTrained(step=2, version=2, metrics={"loss/total": 0.5}))
    resumed(RunFinished(step=2, reason="completed"))

    folders = sorted((tmp_path / "wandb").glob("offline-run-*"))
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    assert len(folders) == 2 and all(f"-{run_id}" in f.name for f in folders)
    assert [sorted(_history(f)) for f in folders] == [[1], [2]]  # `wandb sync` joins them
