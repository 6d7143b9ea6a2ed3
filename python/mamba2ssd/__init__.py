"""mamba2ssd: the Mamba-2 SSD forward (chunked state-space scan) as a PyTorch op, CPU and CUDA.

    from mamba2ssd import mamba_chunk_scan_combined
    y = mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=D, z=z, ...)

Same arguments, defaults and results as mamba_ssm 2.3.2.post1's function (forward only). The op is
torch.ops.mamba2ssd.chunk_scan_fwd; it works under torch.compile(fullgraph=True) and CUDA graphs.
"""

import torch  # noqa: F401  (libtorch must be loaded before the extension)

from ._ops import has_cuda_backend, mamba_chunk_scan_combined, tolerance

__all__ = ["mamba_chunk_scan_combined", "tolerance", "has_cuda_backend"]
__version__ = "0.1.0"
