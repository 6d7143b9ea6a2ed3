"""mamba2ssd.tolerance and backward_tolerance: the table of src/testing/tolerance.h, read through the op
library."""

import pytest
import torch

import mamba2ssd


def test_tolerance_table():
    f64, f32, f16, bf16 = (mamba2ssd.tolerance(t) for t in (torch.float64, torch.float32, torch.float16,
                                                            torch.bfloat16))
    assert 0 < f64 < 1e-9 < f32 < f16 < bf16 < 0.1  # float64 is the oracle itself
    assert mamba2ssd.tolerance(torch.float32) == torch.ops.mamba2ssd.tolerance(torch.float32)


def test_backward_tolerance_table():
    bars = [mamba2ssd.backward_tolerance(t) for t in (torch.float64, torch.float32, torch.float16, torch.bfloat16)]
    assert 0 < bars[0] < 1e-9 < bars[1] < bars[2] < bars[3] < 0.1
    assert mamba2ssd.backward_tolerance(torch.bfloat16) == torch.ops.mamba2ssd.backward_tolerance(torch.bfloat16)
    for t in (torch.float32, torch.bfloat16):  # the sums' bar is the looser one
        assert mamba2ssd.backward_tolerance(t, sum=True) > mamba2ssd.backward_tolerance(t)


@pytest.mark.parametrize("dtype", [torch.int32, torch.complex64])
def test_tolerance_of_unsupported_dtype(dtype):
    for f in (mamba2ssd.tolerance, mamba2ssd.backward_tolerance):
        with pytest.raises(ValueError, match="tolerance: dtype must be float32, float16, bfloat16 or float64"):
            f(dtype)
