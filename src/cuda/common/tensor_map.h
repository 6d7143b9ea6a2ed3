// TMA tensor maps (host side): the [batch, token, head, column] tensors of a call as maps for the
// row tiles of tile/tma.cuh. Encoding is a host computation (no allocation, no synchronization).
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

// True if the driver offers cuTensorMapEncodeTiled.
bool tensor_maps_available();

// TMA can move a [batch, token, head, column] tensor: a 16-byte aligned base and strides that are
// positive multiples of 16 bytes (a dimension of extent 1 has no stride that matters).
bool tma_aligned(const void* ptr, const Strides4& s, DType t, int64_t batch, int64_t tokens, int64_t heads);

// The map of a [batch, token, head or group, column] tensor (columns contiguous; bf16, fp16 or
// fp32) for boxes of 128 bytes of columns (64 16-bit, 32 fp32) x `rows` tokens with the 128-byte
// swizzle: one box is one column block of `rows` rows of a SwizzledTile, a tile of more rows takes
// several (tile/tma.cuh). Boxes past the last token or column read as zeros. False if the driver
// refuses the tensor.
bool encode_row_tiles(CUtensorMap* map, const void* base, DType t, int64_t batch, int64_t tokens, int64_t heads,
                      int64_t cols, const Strides4& s, int64_t rows);

}  // namespace mamba2ssd::cuda
