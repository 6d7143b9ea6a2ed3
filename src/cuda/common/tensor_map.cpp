#include "cuda/common/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

namespace mamba2ssd::cuda {
namespace {

// cuTensorMapEncodeTiled from the driver, looked up once (the runtime links no driver symbols;
// CUDA before 12.5 has only the unversioned lookup).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                             cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess) (void)cudaGetLastError();  // clears only the lookup's own error
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

}  // namespace

bool tensor_maps_available() { return tensor_map_encoder() != nullptr; }

bool tma_aligned(const void* ptr, const Strides4& s, DType t, int64_t batch, int64_t tokens, int64_t heads) {
  const int64_t e = static_cast<int64_t>(dtype_size(t));
  auto ok = [&](int64_t extent, int64_t stride) { return extent == 1 || (stride > 0 && (stride * e) % 16 == 0); };
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && ok(batch, s.s0) && ok(tokens, s.s1) && ok(heads, s.s2);
}

bool encode_row_tiles(CUtensorMap* map, const void* base, DType t, int64_t batch, int64_t tokens, int64_t heads,
                      int64_t cols, const Strides4& s, int64_t rows) {
  const auto encode = tensor_map_encoder();
  if (!encode || t == DType::kF64) return false;
  const int64_t e = static_cast<int64_t>(dtype_size(t));
  auto stride = [&](int64_t extent, int64_t elems) {  // a dimension of one element: any stride
    return static_cast<cuuint64_t>(extent == 1 ? 16 : elems * e);
  };
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(tokens), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {stride(heads, s.s2), stride(tokens, s.s1), stride(batch, s.s0)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(128 / e), 1, static_cast<cuuint32_t>(rows), 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = t == DType::kBF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : t == DType::kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  return encode(map, type, 4, const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace mamba2ssd::cuda
