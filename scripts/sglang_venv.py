"""Make (or find) a venv holding the real SGLang package without its GPU dependencies.

The test suite uses SGLang's own code as the oracle for flags, log formats and response shapes.
SGLang's parser imports torch, so the venv gets the CPU build of torch, SGLang itself with
`--no-deps`, and the few packages `import sglang.srt.server_args` needs. The venv is cached
outside the checkout (default `~/.cache/autotune/sglang-VERSION`, or $AUTOTUNE_SGLANG_VENV) and
reused while its SGLang imports; it prints the venv's Python.

    python scripts/sglang_venv.py            # make it if needed, print its python
    python scripts/sglang_venv.py --check    # print it only when it is ready (exit 1 if not)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import venv
from pathlib import Path

VERSION = "0.5.23"
TORCH = "torch==2.13.0"
NEEDS = (
    "triton", "numpy", "pydantic", "orjson", "psutil", "pybase64", "requests", "packaging",
    "pillow", "starlette", "msgspec", "pyzmq", "tqdm", "IPython", "aiohttp", "openai",
)  # fmt: skip
"""What `import sglang.srt.server_args` needs besides torch (SGLang itself is --no-deps), and
`openai`, which `sglang.srt.entrypoints.openai.protocol` imports (the stream chunk models)."""

PROBE = (
    "import argparse, importlib.metadata as m; from sglang.srt.server_args import ServerArgs; "
    "ServerArgs.add_cli_args(argparse.ArgumentParser()); print(m.version('sglang'))"
)


def venv_dir() -> Path:
    given = os.environ.get("AUTOTUNE_SGLANG_VENV")
    if given:
        return Path(given)
    return Path.home() / ".cache" / "autotune" / f"sglang-{VERSION}"


def python_of(folder: Path) -> Path:
    return folder / "bin" / "python"


def ready(folder: Path) -> bool:
    python = python_of(folder)
    if not python.exists():
        return False
    done = subprocess.run(
        [str(python), "-c", PROBE], capture_output=True, text=True, timeout=300, check=False
    )
    return done.returncode == 0 and done.stdout.strip() == VERSION


def make(folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    pip = [str(python_of(folder)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, "--no-deps", f"sglang=={VERSION}"], check=True)
    subprocess.run([*pip, *NEEDS], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="do not build; exit 1 if not ready")
    args = parser.parse_args()
    folder = venv_dir()
    if not ready(folder):
        if args.check:
            return 1
        make(folder)
        if not ready(folder):
            sys.stderr.write(
                f"sglang_venv: {folder} was built but SGLang {VERSION} does not import\n"
            )
            return 1
    print(python_of(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
