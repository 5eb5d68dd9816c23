"""The in-cluster adapter server's command runs where only lorapool is installed (the image):
the PEFT writer's source travels in the command, so nothing of lorapool_dev is imported."""

from __future__ import annotations

import sys
from pathlib import Path

from lorapool_dev.testing import adapter_server
from lorapool_dev.testing.http import request
from lorapool_dev.testing.processes import free_port, start_process

# As in the image: lorapool importable, the dev wing not.
NO_DEV_WING = "import sys; sys.modules['lorapool_dev'] = None\n"


def test_the_command_writes_and_serves_real_adapters_without_the_dev_wing(tmp_path: Path) -> None:
    port = free_port()
    adapters = {"sql": 8, "chat": 16}
    program, flag, script = adapter_server.command(
        adapters, "meta-llama/Meta-Llama-3-8B-Instruct", root=str(tmp_path / "adapters"), host="127.0.0.1", port=port
    )
    assert (program, flag) == ("python", "-c") and "import lorapool_dev" not in script
    url = f"http://127.0.0.1:{port}"
    with start_process([sys.executable, "-c", NO_DEV_WING + script], f"{url}/sql/adapter_config.json", timeout=60):
        for name, rank in adapters.items():
            config = request(f"{url}/{name}/adapter_config.json").json()
            assert config["r"] == rank
            assert config["base_model_name_or_path"] == "meta-llama/Meta-Llama-3-8B-Instruct"
            assert request(f"{url}/{name}/adapter_model.safetensors").status == 200


def test_the_deployment_runs_that_command() -> None:
    (deployment, _service) = adapter_server.manifests("ns", "img", {"sql": 8}, "base")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == adapter_server.command({"sql": 8}, "base")
