"""mamba2ssd.tolerance: the table of src/testing/tolerance.h, read through the op library."""

import pytest
import torch

import mamba2ssd


def test_tolerance_table():
    f32, f16, bf16 = (mamba2ssd.tolerance(t) for t in (torch.float32, torch.float16, torch.bfloat16))
    assert 0 < f32 < f16 < bf16 < 0.1
    assert mamba2ssd.tolerance(torch.float32) == torch.ops.mamba2ssd.tolerance(torch.float32)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
def test_tolerance_of_unsupported_dtype(dtype):
    with pytest.raises(ValueError, match="tolerance: dtype must be float32, float16 or bfloat16"):
        mamba2ssd.tolerance(dtype)
