"""mamba2ssd: the Mamba-2 SSD (chunked state-space scan) as a differentiable PyTorch op, CPU and CUDA.

    from mamba2ssd import mamba_chunk_scan_combined
    y = mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=D, z=z, ...)

Same arguments, defaults and results as mamba_ssm 2.3.2.post1's function, with its gradients. The ops
are torch.ops.mamba2ssd.chunk_scan_fwd and chunk_scan_bwd; they work under torch.compile(fullgraph=True)
and CUDA graphs. The decode step of serving, mamba_ssm's selective_state_update with engines' slot
indices:

    out = selective_state_update(state, x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=True,
                                 state_batch_indices=slots)

and the packed prefill of serving (vLLM's varlen layout, each request from and into its cache slot;
CPU and CUDA, the CUDA op on the current stream without a host sync, so it can be captured in a CUDA
graph):

    y = prefill(x, dt, A, B, C, chunk_size, cu_seqlens, state, slots, has_initial_state, D=D, z=z)

The Mamba-2 layer's training call, mamba_ssm's mamba_split_conv1d_scan_combined (the convolution, the
scan, the gated norm and the out-projection from one zxbcdt), on this scan and its backward:

    out = mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                           rmsnorm_weight=..., outproj_weight=..., headdim=P, ngroups=G)

build_info() says what this build holds (version, CUDA toolkit, GPU targets).
"""

import torch  # noqa: F401  (libtorch must be loaded before the extension)

from . import _C
from ._ops import backward_tolerance, has_cuda_backend, mamba_chunk_scan_combined, tolerance
from . import distributed  # noqa: F401  (mamba2ssd.distributed: the sequence sharded across ranks)
from .decode import decode_tolerance, selective_state_update
from .prefill import prefill, prefill_tolerance
from .layer import mamba_split_conv1d_scan_combined

__all__ = ["mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined", "selective_state_update", "prefill",
           "tolerance", "backward_tolerance",
           "decode_tolerance", "prefill_tolerance", "has_cuda_backend", "build_info"]


def build_info() -> dict:
    """What this build of the extension holds, recorded when it was compiled:

    version        "0.1.0", the project's version (its VERSION file)
    cuda           whether the CUDA backend is compiled in (a GPU may still be missing)
    cuda_version   the CUDA toolkit it was compiled with, "13.0"; None without the CUDA backend
    gpu_targets    the GPU code it carries, as nvcc names it: ["sm_80", "sm_90a"]; [] without CUDA
    cuda_tile      whether the CUDA Tile C++ backend (cuda_path "tile") is linked in
    torch_version  the PyTorch it was compiled against (the wheel requires that minor version)
    """
    return _C.build_info()


__version__ = build_info()["version"]
