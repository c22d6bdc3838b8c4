"""Reading the operator's launch command: a command line and a systemd unit."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.bootstrap.sources import (
    launch_from_command,
    launch_from_unit,
    scalar,
    split_flags,
    unit_lines,
)
from autotune.errors import UsageError


def test_values_keep_their_exact_spelling() -> None:
    assert scalar("8") == 8 and scalar("0.88") == 0.88 and scalar("-1") == -1
    assert scalar("1e-5") == "1e-5" and scalar("007") == "007" and scalar("0.10") == "0.10"
    assert scalar("true") == "true"


def test_flags_bare_valued_lists_inline_and_repeated() -> None:
    flags, stray, repeated = split_flags(
        ["--tp", "8", "--trust-remote-code", "--cuda-graph-bs", "1", "2", "4",
         "--chunked-prefill-size", "-1", "--json-model-override-args={\"a\": 1}",
         "--tp", "4", "--", "extra"]
    )  # fmt: skip
    assert flags == [
        ("trust-remote-code", True),
        ("cuda-graph-bs", (1, 2, 4)),
        ("chunked-prefill-size", -1),
        ("json-model-override-args", '{"a": 1}'),
        ("tp", 4),
    ]
    assert repeated == ["tp"] and stray == ["--", "extra"]


def test_command_line_program_env_and_wrappers() -> None:
    launch = launch_from_command(
        "CUDA_VISIBLE_DEVICES=0,1 HF_TOKEN=hf_x /opt/venv/bin/python -m sglang.launch_server \\\n"
        "  --model-path /models/m --tp-size 2"
    )
    assert launch.command == ("/opt/venv/bin/python", "-m", "sglang.launch_server")
    assert launch.flags == (("model-path", "/models/m"), ("tp-size", 2))
    assert launch.env == (("CUDA_VISIBLE_DEVICES", "0,1"),)
    assert launch.secret_env == ("HF_TOKEN",)
    wrapped = launch_from_command(
        "bash -c 'exec env A=1 python3 -m sglang.launch_server --model-path m'"
    )
    assert wrapped.command == ("python3", "-m", "sglang.launch_server")
    assert wrapped.env == (("A", "1"),)
    assert launch_from_command("sglang serve --model-path m").command == ("sglang", "serve")


@pytest.mark.parametrize(
    ("cmd", "says"),
    [
        ("python -m sglang.launch_server", "has no --flags"),
        ("--model-path m", "no program"),
        ("python -m 'sglang.launch_server --tp 2", "quotes"),
        ("", "empty"),
    ],
)
def test_bad_command_lines_are_one_line_usage_errors(cmd: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        launch_from_command(cmd)


UNIT = r"""
[Unit]
Description=SGLang
ExecStart=/not/this

[Service]
Type=simple
User=sglang
Environment="CUDA_VISIBLE_DEVICES=0,1,2,3" SGLANG_LOG_MS=1
Environment=MODEL=/models/wrong
EnvironmentFile=-/nonexistent/optional.env
EnvironmentFile=%(env)s
ExecStart=
ExecStart=-@/opt/venv/bin/python sglang-kimi -m sglang.launch_server \
    --model-path ${MODEL} \
    # the draft model
    --speculative-algorithm EAGLE3 $EXTRA \
    --api-key ${API_KEY} --served-model-name $UNSET --port 30000
Restart=always
"""


def _unit(tmp_path: Path) -> Path:
    env = tmp_path / "server.env"
    env.write_text('# comment\nMODEL="/models/kimi"\nEXTRA=--enable-metrics --tp-size 4\n'
                   "API_KEY='sk-123'\n")  # fmt: skip
    unit = tmp_path / "sglang.service"
    unit.write_text(UNIT % {"env": env})
    return unit


def test_unit_lines_join_continuations_and_skip_comments(tmp_path: Path) -> None:
    lines = unit_lines(_unit(tmp_path).read_text())
    execs = [v for s, k, v in lines if s == "Service" and k == "ExecStart"]
    assert execs[0] == "" and "# the draft" not in execs[1] and "--port 30000" in execs[1]


def test_unit_exec_start_environment_and_prefixes(tmp_path: Path) -> None:
    launch = launch_from_unit(_unit(tmp_path))
    assert launch.command == ("/opt/venv/bin/python", "-m", "sglang.launch_server")
    assert launch.flags == (
        ("model-path", "/models/kimi"),  # EnvironmentFile= overrides Environment=
        ("speculative-algorithm", "EAGLE3"),
        ("enable-metrics", True),  # $EXTRA splits into words
        ("tp-size", 4),
        ("api-key", "sk-123"),
        ("served-model-name", "$UNSET"),
        ("port", 30000),
    )
    env = dict(launch.env)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and env["SGLANG_LOG_MS"] == "1"
    assert "API_KEY" in launch.secret_env and "API_KEY" not in env
    notes = " ".join(launch.notes)
    assert "$UNSET" in notes and "User=sglang" in notes
    assert "optional.env" not in notes  # a `-` EnvironmentFile may be missing


def test_a_unit_without_exec_start_is_a_usage_error(tmp_path: Path) -> None:
    unit = tmp_path / "x.service"
    unit.write_text("[Service]\nType=simple\n")
    with pytest.raises(UsageError, match="no ExecStart"):
        launch_from_unit(unit)
    with pytest.raises(UsageError, match="cannot read"):
        launch_from_unit(tmp_path / "missing.service")


@pytest.mark.parametrize(
    ("command", "program", "flags"),
    [
        (
            "numactl --interleave=all python -m sglang.launch_server --model-path m --tp 2",
            ("numactl", "--interleave=all", "python", "-m", "sglang.launch_server"),
            [("model-path", "m"), ("tp", 2)],
        ),
        (
            "srun --gres=gpu:8 --ntasks=1 sglang serve --model-path m --tp 8",
            ("srun", "--gres=gpu:8", "--ntasks=1", "sglang", "serve"),
            [("model-path", "m"), ("tp", 8)],
        ),
        (
            "docker run --gpus all --network host img python3 -m sglang.launch_server --tp 8",
            ("docker", "run", "--gpus", "all", "--network", "host", "img", "python3", "-m",
             "sglang.launch_server"),
            [("tp", 8)],
        ),
        (
            "python /opt/sglang/python/sglang/launch_server.py --model-path m",
            ("python", "/opt/sglang/python/sglang/launch_server.py"),
            [("model-path", "m")],
        ),
        ("/srv/bin/serve-llm --model-path m", ("/srv/bin/serve-llm",), [("model-path", "m")]),
    ],
)  # fmt: skip
def test_a_wrappers_own_flags_stay_with_the_program(
    command: str, program: tuple[str, ...], flags: list[tuple[str, object]]
) -> None:
    launch = launch_from_command(command)
    assert launch.command == program and list(launch.flags) == flags
    assert not any("container" in n for n in launch.notes)


@pytest.mark.parametrize("runner", ["docker", "podman"])
def test_a_container_with_a_network_of_its_own_is_named(runner: str) -> None:
    launch = launch_from_command(
        f"{runner} run --gpus all -p 30000:30000 img python3 -m sglang.launch_server --tp 8"
    )
    assert launch.command[-1] == "sglang.launch_server" and launch.flags == (("tp", 8),)
    assert any(f"({runner} run)" in n and "--network host" in n for n in launch.notes)
