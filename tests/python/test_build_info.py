"""mamba2ssd.build_info and __version__: what the installed build says about itself."""

import pathlib
import re

import torch

import mamba2ssd

VERSION = (pathlib.Path(__file__).resolve().parents[2] / "VERSION").read_text().strip()


def test_version_is_the_version_file():
    assert mamba2ssd.__version__ == VERSION
    assert mamba2ssd.build_info()["version"] == VERSION


def test_build_info_fields():
    info = mamba2ssd.build_info()
    assert set(info) == {"version", "cuda", "cuda_version", "gpu_targets", "cuda_tile", "torch_version"}
    assert info["cuda"] == mamba2ssd.has_cuda_backend()
    if info["cuda"]:
        assert re.fullmatch(r"\d+\.\d+", info["cuda_version"])
        assert info["gpu_targets"] and all(re.fullmatch(r"(sm|compute)_\d+a?", t) for t in info["gpu_targets"])
    else:
        assert info["cuda_version"] is None and info["gpu_targets"] == [] and not info["cuda_tile"]
    # Compiled against the PyTorch that runs it (the wheel pins that minor version).
    assert info["torch_version"].split(".")[:2] == torch.__version__.split("+")[0].split(".")[:2]
    assert mamba2ssd.build_info() is not mamba2ssd.build_info()  # a fresh dict each call
