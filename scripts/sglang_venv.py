"""Make (or find) a venv holding the real SGLang package without its GPU dependencies.

The test suite uses SGLang's own code as the oracle for flags, log formats and response shapes.
SGLang's parser imports torch, so the venv gets the CPU build of torch, SGLang itself with
`--no-deps`, the few packages `import sglang.srt.server_args` needs, and the HTTP stack SGLang's
response code imports (for the `/server_info` and `/generate` shape oracles). The venv is cached
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

HTTP_NEEDS = (
    "uvicorn", "uvloop", "fastapi", "python-multipart", "huggingface_hub", "transformers==5.19.0",
    "tokenizers==0.23.2", "setproctitle", "zstandard", "dill", "sentencepiece", "gguf",
    "compressed-tensors==0.18.0", "partial_json_parser", "einops", "jsonschema", "xgrammar==0.2.7",
    "soundfile==0.13.1", "apache-tvm-ffi==0.1.11",
)  # fmt: skip
"""What SGLang's HTTP server, scheduler and tokenizer manager import at module level (the code
that shapes `/server_info` and `/generate`, which the shape oracles run), pinned where SGLang
0.5.23 pins them. torchvision is not among them: its wheels are built for CUDA torch, and the
oracle stands in an empty module for the VLM configs that import it."""

PROBE = (
    "import argparse, importlib.metadata as m; from sglang.srt.server_args import ServerArgs; "
    "ServerArgs.add_cli_args(argparse.ArgumentParser()); print(m.version('sglang'))"
)
HTTP_PROBE = (
    "import fastapi, uvicorn, transformers, tvm_ffi, xgrammar, dill, soundfile; print('ok')"
)
"""The HTTP stack present (the shape oracle's probe, with its torchvision stand-in, imports the
modules themselves)."""


def venv_dir() -> Path:
    given = os.environ.get("AUTOTUNE_SGLANG_VENV")
    if given:
        return Path(given)
    return Path.home() / ".cache" / "autotune" / f"sglang-{VERSION}"


def python_of(folder: Path) -> Path:
    return folder / "bin" / "python"


def _runs(python: Path, code: str, expect: str) -> bool:
    done = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    return done.returncode == 0 and done.stdout.strip() == expect


def ready(folder: Path) -> bool:
    """SGLang's parser imports, and so does the HTTP stack its response code needs."""
    python = python_of(folder)
    return python.exists() and _runs(python, PROBE, VERSION) and _runs(python, HTTP_PROBE, "ok")


def _pip(folder: Path) -> list[str]:
    return [str(python_of(folder)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]


def add_http(folder: Path) -> None:
    """Install the HTTP stack into a venv whose parser already imports (a cache made before the
    stack was part of it is completed, not rebuilt); torch stays the CPU build it has."""
    pin = folder / "torch-pin.txt"
    pin.write_text(f"{TORCH}\n", encoding="utf-8")
    subprocess.run([*_pip(folder), "-c", str(pin), *HTTP_NEEDS], check=True)


def make(folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    pip = _pip(folder)
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, "--no-deps", f"sglang=={VERSION}"], check=True)
    subprocess.run([*pip, *NEEDS], check=True)
    add_http(folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="do not build; exit 1 if not ready")
    args = parser.parse_args()
    folder = venv_dir()
    if not ready(folder):
        if args.check:
            return 1
        python = python_of(folder)
        if python.exists() and _runs(python, PROBE, VERSION):
            add_http(folder)
        else:
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
