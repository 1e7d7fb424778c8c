"""`agentrl serve --tinker CONFIG` as a user runs it: prints the URL, answers the SDK, and
stops on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

tinker = pytest.importorskip("tinker")


@pytest.mark.slow  # a fresh interpreter loads torch and the model: ~20 s on 2 shared cores
def test_serve_tinker_answers_the_sdk_and_stops_on_ctrl_c(tiny_folder: Path, tmp_path: Path):
    config = tmp_path / "tinker.yaml"
    config.write_text(f"model:\n  name: {tiny_folder}\n  dtype: float32\nlearner:\n  device: cpu\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentrl.cli",
            "serve",
            "--tinker",
            str(config),
            "--port",
            "0",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        url = None
        lines = []
        while url is None:  # a hang is bounded by pytest's timeout; the log says where
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if m := re.search(r"at (http://[\d.]+:\d+)", line):
                url = m.group(1)
        assert url, "".join(lines)
        service = tinker.ServiceClient(base_url=url, api_key="tml-cli-test")
        models = service.get_server_capabilities().supported_models
        assert [m.model_name for m in models] == [str(tiny_folder)]
        client = service.create_lora_training_client(base_model=str(tiny_folder), rank=2).result()
        path = client.save_state("cli").result().path
        assert (tmp_path / "state" / client.model_id / "weights" / "cli" / "lora.json").is_file()
        assert path.endswith("/weights/cli")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0


def test_serve_tinker_with_a_bad_config_is_one_line(tmp_path: Path):
    config = tmp_path / "bad.yaml"
    config.write_text("model:\n  nmae: tiny-llama\n")
    done = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "serve", "--tinker", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "nmae" in done.stderr
