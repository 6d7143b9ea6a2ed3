// Hopper's bulk copies (src/cuda/tile/tma.cuh) on their own, sm_90 only:
//   - load_swizzled_tile of a strided [batch, token, head, col] tensor (bf16 and fp16) into a
//     SwizzledTile, read back through SwizzledTile::offset: tiles of one and two boxes per column
//     block, a column offset (col0), boxes partly and wholly past the last token and a column block
//     partly past the last column (those elements must arrive as zeros); align_1024;
//   - store_4d: a box loaded by TMA stored back at the same place (round trip), and a tile written by
//     the threads at SwizzledTile::offset stored at a box that sticks out past the last token and
//     column (clipped: nothing outside the tensor changes), with wait_stores_read between the two;
//   - load_bytes: two bulk copies completing one mbarrier phase;
//   - the mbarrier phases over several reuses: a two-stage producer / consumer pipeline (full
//     barriers with expected bytes, empty barriers with one arrival per warp) over seven tiles.
// Maps come from the library's encode_row_tiles (src/cuda/common/tensor_map.h: boxes of 64 columns x
// `rows` tokens, 128-byte swizzle). Data are non-zero multiples of 1/8, so a zero can only come from
// the zero fill; shared tiles and destinations are poisoned with NaN first, and results are compared
// bit for bit over the whole allocation (the padding between heads and tokens and a guard area after
// the tensor included).
#include <cuda.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/common/tensor_map.h"
#include "device_array.h"
#include "cuda/tile/tma.cuh"

namespace mamba2ssd::tile {
namespace {

// ---- host helpers ---------------------------------------------------------------------------------

using testing::DeviceArray;
using testing::launched;

template <typename T>
uint16_t bits(T v) {
  static_assert(sizeof(T) == 2);
  uint16_t u;
  std::memcpy(&u, &v, 2);
  return u;
}
constexpr uint16_t kPoison = 0xFFFF;  // NaN in bf16 and fp16

template <typename T>
constexpr DType kDType = std::is_same_v<T, __nv_bfloat16> ? DType::kBF16 : DType::kF16;

// Whether this binary has sm_90a code (the kernels below are empty without it).
__global__ void sm90a_code_kernel(int* built) {
#ifdef MAMBA2SSD_WGMMA
  *built = 1;
#else
  *built = 0;
#endif
}

// Why the TMA tests cannot run here; empty if they can.
std::string tma_refusal() {
  int dev = 0, major = 0, minor = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0) return "TMA needs sm_90a; device is sm_" + std::to_string(major) + std::to_string(minor);
  DeviceArray<int> built(1);
  sm90a_code_kernel<<<1, 1>>>(built.p);
  launched();
  if (built.host()[0] != 1) return "this binary has no sm_90a code";
  if (!mamba2ssd::cuda::tensor_maps_available()) return "the driver has no cuTensorMapEncodeTiled";
  return "";
}
#define SKIP_WITHOUT_TMA()                                                 \
  if (const std::string why = tma_refusal(); !why.empty()) GTEST_SKIP() << why

// A [batch, token, head, col] tensor of non-zero multiples of 1/8 with padded strides (heads 128
// columns apart, tokens and batch rows with extra room), a guard area after it, all of it data.
template <typename T>
struct Tensor {
  static constexpr int64_t kBatch = 2, kTokens = 200, kHeads = 3, kCols = 96, kGuard = 8192;
  Strides4 s{kTokens * (kHeads * 128 + 64) + 128, kHeads * 128 + 64, 128, 1};
  std::vector<T> host;
  DeviceArray<T> dev;
  CUtensorMap map{};

  explicit Tensor(uint32_t seed) : host(size()), dev(size()) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> mag(1, 64), sign(0, 1);
    for (auto& x : host) x = T((sign(rng) ? -1 : 1) * mag(rng) / 8.0f);
    CUDA_OK(cudaMemcpy(dev.p, host.data(), size() * sizeof(T), cudaMemcpyHostToDevice));
    encode();
  }
  // A store destination: device memory poisoned, no host copy.
  explicit Tensor(std::nullptr_t) : dev(size()) {
    dev.poison();
    encode();
  }
  void encode() {
    if (!mamba2ssd::cuda::encode_row_tiles(&map, dev.p, kDType<T>, kBatch, kTokens, kHeads, kCols, s,
                                           tma::kBoxRows))
      throw std::runtime_error("encode_row_tiles refused the test tensor");
  }
  size_t size() const { return static_cast<size_t>(kBatch * s.s0 + kGuard); }
  size_t index(int64_t b, int64_t t, int64_t h, int64_t c) const { return b * s.s0 + t * s.s1 + h * s.s2 + c; }
  // The element as TMA reads it: zero past the last token or column.
  uint16_t read(int64_t b, int64_t t, int64_t h, int64_t c) const {
    return t < kTokens && c < kCols ? bits(host[index(b, t, h, c)]) : 0;
  }
};

// A box of a map: column, head, token, batch (the coordinates of load_4d / store_4d).
struct Box {
  int col, head, token, batch;
};

// ---- device helpers -------------------------------------------------------------------------------

#ifdef MAMBA2SSD_WGMMA
__device__ unsigned char* dynamic_smem() {
  extern __shared__ unsigned char smem[];
  return smem;
}
#endif

template <typename T>
__device__ void poison_tile(T* tile, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = from_float<T>(__int_as_float(0x7FFFFFFF));
}

// ---- load_swizzled_tile --------------------------------------------------------------------------------

// A kRows x kCols tile at `box` (box.col is col0) through load_swizzled_tile; out[r][c] is the
// tile's element (r, c) per SwizzledTile::offset. where[0]: the tile's shared address mod 1024,
// where[1]: its distance from the start of dynamic shared memory.
template <typename T, int kRows, int kCols>
__global__ void load_tile_kernel(const __grid_constant__ CUtensorMap map, Box box, T* out, int* where) {
#ifdef MAMBA2SSD_WGMMA
  using Tile = wg::SwizzledTile<kRows, kCols>;
  __shared__ uint64_t bar;
  T* tile = tma::align_1024<T>(dynamic_smem());
  poison_tile(tile, Tile::kElems);
  wg::proxy_fence();  // the poison before the async proxy's writes
  if (threadIdx.x == 0) {
    tma::barrier_init(&bar, 1);
    tma::barrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    tma::arrive_expect_bytes(&bar, Tile::kElems * sizeof(T));
    tma::load_swizzled_tile<kRows, kCols>(tile, &map, box.token, box.head, box.batch, &bar, box.col);
  }
  tma::wait(&bar, 0);
  for (int i = threadIdx.x; i < kRows * kCols; i += blockDim.x) out[i] = tile[Tile::offset(i / kCols, i % kCols)];
  if (threadIdx.x == 0) {
    where[0] = static_cast<int>(smem_addr(tile) % 1024);
    where[1] = static_cast<int>(reinterpret_cast<unsigned char*>(tile) - dynamic_smem());
  }
#endif
}

template <typename T, int kRows, int kCols>
void check_load(const Tensor<T>& x, Box box) {
  DeviceArray<T> out(kRows * kCols);
  DeviceArray<int> where(2);
  out.poison(), where.poison();
  load_tile_kernel<T, kRows, kCols><<<1, 128, kRows * kCols * sizeof(T) + 1024>>>(x.map, box, out.p, where.p);
  launched();
  const std::vector<int> w = where.host();
  EXPECT_EQ(w[0], 0) << "align_1024: not 1024-byte aligned";
  EXPECT_TRUE(w[1] >= 0 && w[1] < 1024) << "align_1024 moved the tile by " << w[1] << " bytes";
  const std::vector<T> got = out.host();
  int bad = 0, zeros = 0;
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) {
      const uint16_t want = x.read(box.batch, box.token + r, box.head, box.col + c), have = bits(got[r * kCols + c]);
      zeros += want == 0;
      if (have != want && bad++ < 5) std::printf("  tile (%d, %d) = %#06x, want %#06x\n", r, c, have, want);
    }
  EXPECT_EQ(bad, 0) << kRows << " x " << kCols << " tile at token " << box.token << ", head " << box.head
                    << ", batch " << box.batch << ", column " << box.col << " (" << zeros << " zero-filled)";
}

TEST(TileTma, LoadSwizzledTile) {
  SKIP_WITHOUT_TMA();
  const Tensor<__nv_bfloat16> x(1);
  check_load<__nv_bfloat16, 128, 128>(x, {0, 1, 64, 1});    // inside; columns 96 .. 127 past the last
  check_load<__nv_bfloat16, 128, 128>(x, {0, 2, 100, 0});   // second box partly past the last token
  check_load<__nv_bfloat16, 128, 128>(x, {0, 0, 192, 1});   // first box partly, second wholly past
  check_load<__nv_bfloat16, 64, 64>(x, {0, 2, 0, 1});       // one box
  check_load<__nv_bfloat16, 64, 128>(x, {0, 1, 136, 0});    // one box per column block
}

TEST(TileTma, LoadSwizzledTileColumnOffsetFp16) {
  SKIP_WITHOUT_TMA();
  const Tensor<__half> x(2);
  check_load<__half, 64, 64>(x, {64, 0, 150, 1});   // col0 = 64: the second column block, partly past
  check_load<__half, 128, 64>(x, {64, 2, 8, 0});
  check_load<__half, 128, 128>(x, {0, 1, 72, 1});
}

// ---- store_4d -------------------------------------------------------------------------------------------

// Round trip: box `a` of src -> shared (load_swizzled_tile) -> box `a` of dst (store_4d). Then, after
// wait_stores_read, the threads overwrite the tile with `pattern` (row-major 64 x 64, placed at
// SwizzledTile::offset) and store it at box `b` of dst.
template <typename T>
__global__ void store_kernel(const __grid_constant__ CUtensorMap src, const __grid_constant__ CUtensorMap dst, Box a,
                             Box b, const T* pattern) {
#ifdef MAMBA2SSD_WGMMA
  using Tile = wg::SwizzledTile<64, 64>;
  __shared__ uint64_t bar;
  T* tile = tma::align_1024<T>(dynamic_smem());
  if (threadIdx.x == 0) {
    tma::barrier_init(&bar, 1);
    tma::barrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    tma::arrive_expect_bytes(&bar, Tile::kElems * sizeof(T));
    tma::load_swizzled_tile<64, 64>(tile, &src, a.token, a.head, a.batch, &bar, a.col);
    tma::wait(&bar, 0);
    tma::store_4d(&dst, a.col, a.head, a.token, a.batch, tile);
    tma::wait_stores_read();  // the tile may be written again
  }
  __syncthreads();
  for (int i = threadIdx.x; i < Tile::kElems; i += blockDim.x) tile[Tile::offset(i / 64, i % 64)] = pattern[i];
  wg::proxy_fence();  // the threads' writes before the async proxy's read
  __syncthreads();
  if (threadIdx.x == 0) {
    tma::store_4d(&dst, b.col, b.head, b.token, b.batch, tile);
    tma::wait_stores();
  }
#endif
}

template <typename T>
void check_store(Box a, Box b) {
  const Tensor<T> src(3);
  Tensor<T> dst(nullptr);
  std::vector<T> pattern(64 * 64);
  std::mt19937 rng(4);
  std::uniform_int_distribution<int> mag(1, 64);
  for (auto& p : pattern) p = T(-mag(rng) / 8.0f);
  DeviceArray<T> d_pattern(pattern);
  store_kernel<T><<<1, 128, 64 * 64 * sizeof(T) + 1024>>>(src.map, dst.map, a, b, d_pattern.p);
  launched();

  // Expected: poison everywhere but the two boxes, clipped to the tensor.
  std::vector<uint16_t> want(dst.size(), kPoison);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 64; ++c) {
      if (a.token + r < dst.kTokens && a.col + c < dst.kCols)
        want[dst.index(a.batch, a.token + r, a.head, a.col + c)] = src.read(a.batch, a.token + r, a.head, a.col + c);
      if (b.token + r < dst.kTokens && b.col + c < dst.kCols)
        want[dst.index(b.batch, b.token + r, b.head, b.col + c)] = bits(pattern[r * 64 + c]);
    }
  const std::vector<T> got = dst.dev.host();
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (bits(got[i]) != want[i] && bad++ < 5)
      std::printf("  dst element %zu = %#06x, want %#06x%s\n", i, bits(got[i]), want[i],
                  i >= static_cast<size_t>(dst.kBatch * dst.s.s0) ? " (guard area)" : "");
  EXPECT_EQ(bad, 0) << "of " << got.size() << " elements of the destination";
}

// Box b: the last head of the last batch row, past the last token and column, so an unclipped store
// would reach the padding and the guard area.
TEST(TileTma, Store4dBf16) {
  SKIP_WITHOUT_TMA();
  check_store<__nv_bfloat16>({0, 1, 64, 0}, {64, 2, 180, 1});
}
TEST(TileTma, Store4dFp16) {
  SKIP_WITHOUT_TMA();
  check_store<__half>({0, 0, 136, 1}, {64, 2, 190, 1});
}

// ---- load_bytes --------------------------------------------------------------------------------------------

constexpr uint32_t kBytes1 = 4096, kBytes2 = 48, kOffset1 = 16, kOffset2 = 8192 + 32;

// Two bulk copies, src + kOffset1 (kBytes1) and src + kOffset2 (kBytes2), one after the other into
// shared memory, on one barrier phase.
__global__ void load_bytes_kernel(const unsigned char* src, unsigned char* out) {
#ifdef MAMBA2SSD_WGMMA
  __shared__ __align__(16) unsigned char buf[kBytes1 + kBytes2];
  __shared__ uint64_t bar;
  for (uint32_t i = threadIdx.x; i < kBytes1 + kBytes2; i += blockDim.x) buf[i] = 0xFF;
  wg::proxy_fence();
  if (threadIdx.x == 0) {
    tma::barrier_init(&bar, 1);
    tma::barrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    tma::arrive_expect_bytes(&bar, kBytes1 + kBytes2);
    tma::load_bytes(buf, src + kOffset1, kBytes1, &bar);
    tma::load_bytes(buf + kBytes1, src + kOffset2, kBytes2, &bar);
  }
  tma::wait(&bar, 0);
  for (uint32_t i = threadIdx.x; i < kBytes1 + kBytes2; i += blockDim.x) out[i] = buf[i];
#endif
}

TEST(TileTma, LoadBytes) {
  SKIP_WITHOUT_TMA();
  std::vector<unsigned char> src(16384);
  std::mt19937 rng(5);
  for (auto& b : src) b = static_cast<unsigned char>(rng() % 255);  // never 0xFF, the poison
  DeviceArray<unsigned char> d_src(src), d_out(kBytes1 + kBytes2);
  d_out.poison();
  load_bytes_kernel<<<1, 128>>>(d_src.p, d_out.p);
  launched();
  const std::vector<unsigned char> out = d_out.host();
  int bad = 0;
  for (uint32_t i = 0; i < kBytes1 + kBytes2; ++i) {
    const unsigned char want = i < kBytes1 ? src[kOffset1 + i] : src[kOffset2 + i - kBytes1];
    if (out[i] != want && bad++ < 5) std::printf("  byte %u = %#04x, want %#04x\n", i, out[i], want);
  }
  EXPECT_EQ(bad, 0) << "of " << kBytes1 + kBytes2 << " bytes";
}

// ---- mbarrier phases -----------------------------------------------------------------------------------

constexpr int kStages = 2, kIters = 7;

// The tile of iteration i: heads, batch rows and tokens change each time; the last ones lie partly
// and wholly past the last token.
__host__ __device__ Box phase_box(int i) { return {0, i % 3, 40 * i, i % 2}; }

// A two-stage pipeline: thread 0 produces (waits for stage s to be empty, then loads tile i into it
// and announces its bytes on full[s]); every warp consumes (waits for full[s] with the parity of the
// stage's use, copies the tile out, arrives on empty[s] once per warp). Each barrier goes through
// several phases, so a wrong parity shows as stale or missing data (or a hang).
template <typename T>
__global__ void phases_kernel(const __grid_constant__ CUtensorMap map, T* out) {
#ifdef MAMBA2SSD_WGMMA
  using Tile = wg::SwizzledTile<64, 64>;
  __shared__ uint64_t full[kStages], empty[kStages];
  T* tiles = tma::align_1024<T>(dynamic_smem());
  poison_tile(tiles, kStages * Tile::kElems);
  wg::proxy_fence();
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) tma::barrier_init(&full[s], 1), tma::barrier_init(&empty[s], blockDim.x / 32);
    tma::barrier_init_fence();
  }
  __syncthreads();
  for (int i = 0; i < kIters; ++i) {
    const int s = i % kStages, use = i / kStages;
    T* tile = tiles + s * Tile::kElems;
    if (threadIdx.x == 0) {
      if (use > 0) tma::wait(&empty[s], (use - 1) & 1);
      const Box box = phase_box(i);
      tma::arrive_expect_bytes(&full[s], Tile::kElems * sizeof(T));
      tma::load_swizzled_tile<64, 64>(tile, &map, box.token, box.head, box.batch, &full[s], box.col);
    }
    tma::wait(&full[s], use & 1);
    for (int e = threadIdx.x; e < Tile::kElems; e += blockDim.x)
      out[i * Tile::kElems + e] = tile[Tile::offset(e / 64, e % 64)];
    __syncwarp();
    if (lane_id() == 0) tma::arrive(&empty[s]);
  }
#endif
}

TEST(TileTma, BarrierPhasesOverReuses) {
  SKIP_WITHOUT_TMA();
  const Tensor<__nv_bfloat16> x(6);
  DeviceArray<__nv_bfloat16> out(kIters * 64 * 64);
  out.poison();
  phases_kernel<__nv_bfloat16><<<1, 128, kStages * 64 * 64 * 2 + 1024>>>(x.map, out.p);
  launched();
  const std::vector<__nv_bfloat16> got = out.host();
  for (int i = 0; i < kIters; ++i) {
    const Box box = phase_box(i);
    int bad = 0;
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < 64; ++c) {
        const uint16_t want = x.read(box.batch, box.token + r, box.head, box.col + c);
        const uint16_t have = bits(got[(i * 64 + r) * 64 + c]);
        if (have != want && bad++ < 3) std::printf("  iteration %d: (%d, %d) = %#06x, want %#06x\n", i, r, c, have, want);
      }
    EXPECT_EQ(bad, 0) << "iteration " << i << " (stage " << i % kStages << ", use " << i / kStages << ")";
  }
}

}  // namespace
}  // namespace mamba2ssd::tile
