"""The shape of a launch command: the program, its wrapper and SGLang's flags."""

from __future__ import annotations

import pytest

from autotune.config.command import (
    console_script,
    in_container,
    interpreter,
    own_network,
    program_end,
)


@pytest.mark.parametrize(
    ("argv", "end"),
    [
        (["python", "-m", "sglang.launch_server", "--tp", "8"], 3),
        (["numactl", "--interleave=all", "python", "-m", "sglang.launch_server", "--tp", "8"], 5),
        (["sglang", "serve", "--tp", "8"], 2),
        (["/opt/venv/bin/sglang", "serve", "--tp", "8"], 2),
        (["python", "/src/python/sglang/launch_server.py", "--tp", "8"], 2),
        (["/srv/serve-llm", "--tp", "8"], 1),
        (["python", "-m", "sglang.launch_server"], 3),
    ],
)
def test_the_program_ends_at_sglangs_entry_point(argv: list[str], end: int) -> None:
    assert program_end(argv) == end


@pytest.mark.parametrize(
    ("program", "python"),
    [
        (["/opt/venv/bin/python", "-m", "sglang.launch_server"], "/opt/venv/bin/python"),
        (["numactl", "--interleave=all", "python3", "-m", "sglang.launch_server"], "python3"),
        (["python3.11", "/src/sglang/launch_server.py"], "python3.11"),
        (["sglang", "serve"], None),
        (["docker", "run", "img", "python3", "-m", "sglang.launch_server"], None),
    ],
)
def test_the_python_the_program_names(program: list[str], python: str | None) -> None:
    assert interpreter(program) == python


def test_a_container_and_its_network() -> None:
    assert in_container(["podman", "run", "img"]) and not in_container(["docker", "exec", "c"])
    assert own_network(["docker", "run", "-p", "30000:30000", "img"])
    assert not own_network(["docker", "run", "--network", "host", "img"])
    assert not own_network(["docker", "run", "--net=host", "img"])
    assert not own_network(["python", "-m", "sglang.launch_server"])


def test_sglangs_console_script() -> None:
    assert console_script(["sglang", "serve"]) == "sglang"
    script = "/opt/venv/bin/sglang"
    assert console_script(["srun", "-n1", script, "serve"]) == script
    assert console_script(["python", "-m", "sglang.launch_server"]) is None
