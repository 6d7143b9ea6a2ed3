// mamba2ssd: the Mamba-2 SSD forward (chunked state-space scan) and its backward, torch-free C++ API.
//
// The function computed is written down in docs/contract.md (the semantics of mamba_ssm's
// mamba_chunk_scan_combined). One call is described by a ForwardParams: plain pointers, sizes and
// element strides. Entry points validate everything first and throw mamba2ssd::Error with a message
// naming the parameter and the bad value; nothing runs on bad input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mamba2ssd {

// Element type of x, B, C, z and y (and, separately, of dt). kF64 is the oracle's own type, taken by
// the reference backend only (forward_reference, backward_reference; validate() refuses it for the
// others): an fp64 call is fp64 throughout, so dtype and dt_dtype are both kF64 and every tensor
// declared `float*` below (A, D, dt_bias, the states, and the backward's fp32 cotangents and
// gradients) holds doubles instead, 8-byte aligned. It makes exact gradient checks possible
// (torch.autograd.gradcheck on the PyTorch op).
enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3 };

// How D (the skip connection) is shaped.
enum class DLayout : int { kNone = 0, kPerHead = 1, kPerHeadDim = 2 };  // none, [H], [H, P]

// Which implementation runs a call.
enum class Backend : int { kAuto = 0, kReference = 1, kCpu = 2, kCuda = 3 };

// Which kernels the CUDA backend runs. kFused keeps the state on chip (state size up to 128; the
// head dim runs as blocks of 64 columns); kHopper is the fused path on Hopper's TMA and wgmma
// instructions (state size up to 256, for bf16 and fp16 on an sm_90 GPU, with x, B, C and y 16-byte aligned); kThreeKernel is the seed's design and covers everything; kAuto takes the
// first of hopper, fused, three-kernel that runs the call (decided from the shape, alignment,
// device and driver; explain_cuda says which and why). A path asked for by name that cannot run
// the call throws Error with the reason. kTile runs the seed's three kernels written in CUDA Tile
// C++: only in a build configured with MAMBA2SSD_TILE=ON, without varlen_states, and with
// cu_seqlens only next to seq_idx; kAuto never picks it.
enum class CudaPath : int { kAuto = 0, kThreeKernel = 1, kFused = 2, kTile = 3, kHopper = 4 };

// How the CUDA forward multiplies fp32 operands on the tensor cores (ForwardParams::fp32_math).
//   kTf32: each operand rounded to TF32 (10-bit mantissa), the products accumulated in fp32: the
//          accuracy class of mamba_ssm's Triton kernels (tf32 dots), and the fastest. The default.
//          (The hopper path's wgmma reads B and C from shared memory as they landed, so there they
//          are truncated to TF32, not rounded; x, the state and the register operands are rounded.)
//   kAccurate: 3xTF32. Each operand a is split as big = tf32(a), small = tf32(a - big), and a b is
//          taken as big_a big_b + big_a small_b + small_a big_b (the small_a small_b term, 2^-22 of
//          the product, is dropped), accumulated in fp32: close to fp32 FMA accuracy, at three
//          tensor-core products for one. An infinite operand gives NaN there (inf - inf in the
//          split) where TF32 may give inf: non-finite inputs still give non-finite outputs.
// Only fp32 calls (dtype kF32) on the CUDA forward read it: bf16 and fp16 operands are exact on the
// tensor cores and ignore it, and so do the host backends (fp32 or fp64 arithmetic, no TF32). The
// hopper path takes fp32 with kTf32 only (TF32 on wgmma, state size up to 128: kAccurate runs on
// the fused path); the tile path (kTile) refuses kAccurate (Error: its products are TF32 only). The
// backward ignores it: its fp32 products are TF32.
enum class Fp32Math : int { kTf32 = 0, kAccurate = 1 };

const char* to_string(DType t);
const char* to_string(Backend b);
const char* to_string(CudaPath c);
const char* to_string(Fp32Math m);  // "tf32", "accurate
std::size_t dtype_size(DType t);

// Bad input. what() names the parameter and the offending value.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A failure of the CUDA runtime (launch error, no device, ...). what() carries CUDA's message.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What this build of the library holds (`mamba2ssd --version` prints it).
struct BuildInfo {
  const char* version;      // "0.1.0": the library's version (the headers' is MAMBA2SSD_VERSION_STRING
                            // in <mamba2ssd/version.h>)
  bool cuda;                // the CUDA backend is compiled in (a GPU may still be missing)
  int cuda_version;         // the CUDA toolkit it was compiled with, as CUDART_VERSION: 13000 for
                            // 13.0; 0 without the CUDA backend
  const char* gpu_targets;  // the GPU code it carries, as nvcc names it: "sm_80 compute_80 sm_90a
                            // sm_100 sm_103" (compute_XY: PTX); "" without the CUDA backend
  bool cuda_tile;           // the CUDA Tile C++ backend (cuda_path tile) is compiled in
};
BuildInfo build_info();

// A 4-d strided view: element strides for dims [0..3]; the last stride must be 1. Strides are
// non-negative and a view's last element must lie within 2^63 bytes of its first.
struct Strides4 {
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 1;
};
struct Strides3 {
  int64_t s0 = 0, s1 = 0, s2 = 1;
};
struct Strides2 {
  int64_t s0 = 0, s1 = 1;
};

// Contiguous (row-major) strides for the given sizes. Throws Error if a stride passes 2^63 - 1.
Strides4 contiguous_strides(int64_t d0, int64_t d1, int64_t d2, int64_t d3);
Strides3 contiguous_strides(int64_t d0, int64_t d1, int64_t d2);
Strides2 contiguous_strides(int64_t d0, int64_t d1);

// One forward call. Sizes: b batch, L tokens, H heads, P head dim, G groups, N state size,
// S packed sequences. All pointers of one call live in the same memory space (host or one GPU).
//
// Limits, checked by validate() before anything is read: each tensor's element count (b L H P,
// b L G N, b H P N, S H P N) is at most 2^56, whatever its strides.
// Alignment: every pointer is a multiple of its element's size: 2 bytes for fp16 and bf16 tensors,
// 4 for fp32 and int32 (A, D, dt_bias, the states, seq_idx), 8 for cu_seqlens. (A tensor taken from
// a PyTorch tensor always is.) A CUDA path that needs more (the hopper path: 16 bytes) refuses the
// call, and auto takes the next (explain_cuda).
struct ForwardParams {
  int64_t batch = 0;     // b
  int64_t seqlen = 0;    // L
  int64_t nheads = 0;    // H
  int64_t headdim = 0;   // P: a multiple of 16 in [16, 128]
  int64_t ngroups = 1;   // G: divides H; head h reads group h / (H / G)
  int64_t dstate = 0;    // N: a multiple of 16 in [16, 256]
  // The peer's chunk length, any >= 1 (the packed prefill: 64, 128 or 256). Chunking organizes the
  // scan, it does not change the function: backends tile their own way (the CUDA kernels run chunks
  // of 64 or 128).
  int64_t chunk_size = 128;
  CudaPath cuda_path = CudaPath::kAuto;
  // fp32 calls on the CUDA forward: TF32 products (the default) or 3xTF32 (see Fp32Math). Ignored
  // for bf16 and fp16, and by the host backends.
  Fp32Math fp32_math = Fp32Math::kTf32;

  DType dtype = DType::kBF16;    // x, B, C, z, y
  DType dt_dtype = DType::kF32;  // dt

  // Inputs.
  const void* x = nullptr;   Strides4 x_stride;   // [b, L, H, P]
  const void* dt = nullptr;  Strides3 dt_stride;  // [b, L, H]
  const float* A = nullptr;                       // [H], contiguous
  const void* B = nullptr;   Strides4 B_stride;   // [b, L, G, N]
  const void* C = nullptr;   Strides4 C_stride;   // [b, L, G, N]

  // Optional inputs (nullptr: absent).
  DLayout D_layout = DLayout::kNone;
  const float* D = nullptr;                       // [H] or [H, P], contiguous
  const void* z = nullptr;   Strides4 z_stride;   // [b, L, H, P], dtype
  const float* dt_bias = nullptr;                 // [H], contiguous
  bool dt_softplus = false;
  // dt_limit = (dt_min, dt_max): dt_min finite and >= 0, dt_max >= dt_min and not NaN (+inf: no
  // upper bound).
  float dt_min = 0.0f;
  float dt_max = std::numeric_limits<float>::infinity();
  const float* initial_states = nullptr;  Strides4 initial_states_stride;  // [b, H, P, N]
  const int32_t* seq_idx = nullptr;       Strides2 seq_idx_stride;         // [b, L]
  // Packed sequences (b == 1): S + 1 non-decreasing offsets, cu_seqlens[0] == 0, cu_seqlens[S] == L.
  // Without seq_idx, the state resets at every sequence start (seq_idx derived from cu_seqlens).
  // Contents: the host backends refuse bad cu_seqlens (Error); forward_cuda does not read device
  // contents on the host (no sync), and its kernels stay inside every buffer whatever seq_idx and
  // cu_seqlens hold: ids are only compared, and the offsets a varlen state reads are clamped to
  // [0, L] (an empty or inverted sequence gets a zero state). Bad contents give unspecified
  // results, never an out-of-bounds access (docs/reliability.md). On the GPU, seq_idx must also not
  // return to an id it left (ids are compared, not counted): keep it non-decreasing.
  const int64_t* cu_seqlens = nullptr;
  int64_t nseqs = 0;                              // S

  // Checked mode (opt-in): the contents of cu_seqlens and seq_idx are validated: cu_seqlens as
  // above, seq_idx non-decreasing along each row. The host backends throw Error naming the first
  // bad entry. forward_cuda cannot throw for them without a host sync: it launches a small check
  // kernel first (on the same stream, graph-capturable) that records the first bad entry in
  // input_status, a device int64_t[kInputStatusWords] the caller zeroes once (cudaMemset) and reads
  // after any later synchronization; check_input_status() turns it into the Error. The status is
  // sticky: it keeps the first failure until the caller zeroes it again. The forward itself still
  // runs (safely: the kernels clamp, docs/reliability.md), its outputs unspecified.
  bool check_inputs = false;
  int64_t* input_status = nullptr;  // forward_cuda, backward_cuda with check_inputs: required; 8-byte aligned

  // Outputs.
  void* y = nullptr;  Strides4 y_stride;                          // [b, L, H, P], dtype
  float* final_states = nullptr;  Strides4 final_states_stride;   // [b, H, P, N], optional
  float* varlen_states = nullptr; Strides4 varlen_states_stride;  // [S, H, P, N], needs cu_seqlens
  // The states the backward needs (optional; docs/backward.md, "What the backward needs from the
  // forward"): the state entering every chunk of kSavedStatesChunk tokens of each row and head,
  // rounded to dtype, as [b, ceil(L / 64), H, P, N] contiguous (saved_states_elements), 16-byte
  // aligned. forward_cuda writes it on every path: the hopper path's walk as it goes (bf16 or fp16,
  // head dim 64, no varlen_states: the calls the backward's Hopper kernels take), elsewhere a walk
  // of their own after the path (the backward's, moved; explain_cuda says which). The host backends
  // refuse it. Given to backward_cuda (BackwardParams::fwd.saved_states), it is read instead of
  // recomputing the states, and must hold what forward_cuda wrote for the same inputs.
  void* saved_states = nullptr;
};

// The chunk length of ForwardParams::saved_states (the CUDA backward's chunk), the chunks of a
// sequence of `seqlen` tokens there (no overflow at any seqlen), and its element count (it calls
// validate_sizes(p) first and throws its Error: past the API's limits the product could wrap).
constexpr int64_t kSavedStatesChunk = 64;
constexpr int64_t saved_states_chunks(int64_t seqlen) {
  return seqlen / kSavedStatesChunk + (seqlen % kSavedStatesChunk > 0 ? 1 : 0);
}
int64_t saved_states_elements(const ForwardParams& p);

// Throws Error if p does not describe a valid call. Checks sizes, strides, pointers (null, alignment),
// options and output/input overlap; the contents of cu_seqlens are checked by the host backends only.
// Contents of the tensors are not checked: NaN and inf propagate (docs/reliability.md). fp64 is
// refused here (only the reference backend takes it, and validates it itself).
void validate(const ForwardParams& p);

// The part of validate() that reads no pointer and no stride: sizes (each in range, every tensor's
// element count within 2^56), dtypes and the scalar options (dt_limit, D_layout, cuda_path,
// fp32_math, nseqs).
// For sizing buffers before allocating them: every product of a call's sizes that passes fits in
// 64 bits, in elements and in bytes.
void validate_sizes(const ForwardParams& p);

// dt_limit's rules (validate()'s) on bounds a caller holds as doubles, before it narrows them to
// the float fields dt_min and dt_max (ForwardParams', DecodeParams'): judged as given, a bound that
// float would round across a rule is refused by its own value (-1e-50 becomes -0, which would pass
// as >= 0; a lower bound of 1e39 becomes inf, which would be named as inf). The lower bound must
// also fit float (at most 3.40282e+38). Throws Error with validate()'s messages.
void validate_dt_limit(double dt_min, double dt_max);

// The bounds, judged by validate_dt_limit, narrowed to the float fields: an upper bound past float's
// range becomes +inf (no bound: float dt clamps the same), where a plain conversion would be
// undefined. What a caller holding doubles (the PyTorch ops, the CLI) stores in dt_min and dt_max.
std::pair<float, float> float_dt_limit(double dt_min, double dt_max);

// The device status of checked mode (ForwardParams::check_inputs), as the caller copied it to the
// host: {0, ...} all entries were good; else {rule, row, index, value} of the first bad entry.
// check_input_status throws Error naming it ("cu_seqlens[2] = 100 is less than the entry before
// it: cu_seqlens must be non-decreasing"), and returns if the status is clean.
constexpr int kInputStatusWords = 4;
void check_input_status(const int64_t host_status[kInputStatusWords]);

// The fp64 oracle run as a backend: exact recurrence, outputs rounded to their dtype. Host memory.
void forward_reference(const ForwardParams& p);

// The fast CPU forward: chunked, multithreaded over (batch, head), fp32 state. Host memory.
// num_threads <= 0 uses every hardware thread; at most four per hardware thread run, whatever it asks.
void forward_cpu(const ForwardParams& p, int num_threads = 0);

// The CUDA forward. Device memory; launches on `stream` (a cudaStream_t) and never synchronizes or
// allocates: the caller provides `workspace` of at least cuda_workspace_bytes(p) bytes (any
// 256-byte-aligned device memory). Throws Error for bad input, CudaError if a launch fails.
std::size_t cuda_workspace_bytes(const ForwardParams& p);
void forward_cuda(const ForwardParams& p, void* workspace, std::size_t workspace_bytes,
                  void* stream);

// Which CUDA path runs p and why each other path does not, in auto's order (the registry of
// src/cuda/fwd/dispatch.cpp), for the current device; nothing runs. Throws Error for bad input,
// CudaError without a GPU.
struct CudaPathVerdict {
  CudaPath path;
  std::string refusal;  // empty: the path runs the call
};
struct CudaExplanation {
  CudaPath requested = CudaPath::kAuto;
  CudaPath chosen = CudaPath::kAuto;  // kAuto: no path runs the call (forward_cuda throws Error)
  std::string device;                 // e.g. "sm_90, 132 SMs"
  std::string plan;                   // how the chosen path runs it: chunk, segments, workspace
  std::string products;               // the tensor-core products of the call: "TF32" or "3xTF32" for
                                      // fp32 (fp32_math), "bf16" or "fp16" else
  std::size_t workspace_bytes = 0;    // cuda_workspace_bytes(p)
  std::vector<CudaPathVerdict> paths;
  std::string to_string() const;      // a line for the choice, then one per path
};
CudaExplanation explain_cuda(const ForwardParams& p);

// True if this build has the CUDA backend and a GPU is visible.
bool cuda_available();

// True if ptr is device memory (false for host memory or when CUDA is unavailable).
bool is_device_pointer(const void* ptr);

// Runs one call on `backend`; kAuto picks CUDA when the pointers are on a GPU, else CPU. For CUDA it
// allocates its workspace (use forward_cuda in graph capture or hot loops) and synchronizes `stream`.
Backend forward(const ForwardParams& p, Backend backend = Backend::kAuto, void* stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Backward: the gradients of one forward call (../shared/docs/ssd-backward.md), with respect to every
// input, given the gradient of its outputs.

// One backward call: the gradients of the forward call `fwd` given dout (and dfinal_states,
// dvarlen_states). Shapes use fwd's sizes; all pointers live in host memory for the host backends.
// Checked mode is fwd's, with the forward's rules: with fwd.check_inputs the host backends throw
// Error naming the first bad entry of cu_seqlens or seq_idx, and backward_cuda runs the forward's
// check kernel before its own into fwd.input_status (required there; no sync, no allocation).
struct BackwardParams {
  // The forward's inputs and options; its outputs (y, final_states, varlen_states) are not read, but
  // saved_states, if given, is (the states the forward saved there).
  ForwardParams fwd;
  const void* dout = nullptr;  Strides4 dout_stride;                       // [b, L, H, P], dtype
  const float* dfinal_states = nullptr;  Strides4 dfinal_states_stride;    // [b, H, P, N], optional
  const float* dvarlen_states = nullptr; Strides4 dvarlen_states_stride;   // [S, H, P, N], optional, needs cu_seqlens
  // Gradients. dx, ddt, dA, dB, dC are required; dD, dz, ddt_bias, dinitial_states are given exactly
  // when D, z, dt_bias, initial_states are.
  void* dx = nullptr;   Strides4 dx_stride;   // x's shape and dtype
  void* ddt = nullptr;  Strides3 ddt_stride;  // dt's shape and dt_dtype: w.r.t. the raw dt
  float* dA = nullptr;                        // [H]
  void* dB = nullptr;   Strides4 dB_stride;   // B's shape and dtype (summed over the heads of a group)
  void* dC = nullptr;   Strides4 dC_stride;
  float* dD = nullptr;                        // D's shape ([H] or [H, P]), contiguous
  void* dz = nullptr;   Strides4 dz_stride;   // z's shape and dtype
  float* ddt_bias = nullptr;                  // [H]
  float* dinitial_states = nullptr; Strides4 dinitial_states_stride;  // [b, H, P, N]
};

// Throws Error if p does not describe a valid backward call: fwd's sizes, options and inputs by the
// forward's rules (its outputs are ignored), then the cotangents and gradients: required ones given,
// each optional gradient present exactly when its input is, strides, and no gradient overlapping
// another gradient or any input. The contents of dout are not checked: NaN and inf propagate. fp64:
// as the forward's validate.
void validate(const BackwardParams& p);

// The fp64 oracle of the backward as a backend: the exact reverse recurrence, each gradient rounded
// to its dtype. Host memory.
void backward_reference(const BackwardParams& p);

// The fast CPU backward: fp32, multithreaded over (batch, head), deterministic (the same bits for
// any thread count). Host memory. num_threads <= 0 uses every hardware thread.
void backward_cpu(const BackwardParams& p, int num_threads = 0);

// The CUDA backward. Device memory; launches on `stream` (a cudaStream_t) and never synchronizes or
// allocates: the caller provides `workspace` of at least cuda_backward_workspace_bytes(p) bytes (any
// 256-byte-aligned device memory). It recomputes what it needs of the forward (the state entering
// each chunk) in that workspace, unless fwd.saved_states holds them. Deterministic: no
// floating-point atomics, the same bits every run.
// Throws Error for bad input or for a call the CUDA backward does not take (the message says which
// backend does), CudaError if a launch fails. With fwd.check_inputs it first launches the forward's
// check, which records the first bad entry of cu_seqlens or seq_idx in fwd.input_status (sticky, as
// the forward's; read it with check_input_status after a synchronization).
std::size_t cuda_backward_workspace_bytes(const BackwardParams& p);
void backward_cuda(const BackwardParams& p, void* workspace, std::size_t workspace_bytes, void* stream);

// How backward_cuda runs p on the current device: its plan, and for each kernel that has a Hopper
// form (TMA and wgmma) whether that form runs or why not (then the portable form runs); nothing
// runs. Throws Error for bad input or a call backward_cuda refuses, CudaError without a GPU.
struct CudaBackwardKernel {
  std::string name;     // "walks", "chunk_grads", "chunk_dbc"
  std::string refusal;  // empty: the Hopper form runs; else why the portable form runs instead
};
struct CudaBackwardExplanation {
  std::string device;               // e.g. "sm_90, 132 SMs"
  std::string plan;                 // chunk, the walks' segments, workspace
  std::size_t workspace_bytes = 0;  // cuda_backward_workspace_bytes(p)
  bool chained = false;             // its launches chained by programmatic dependent launch
  std::vector<CudaBackwardKernel> kernels;
  std::string to_string() const;    // a line for the plan, then one per kernel
};
CudaBackwardExplanation explain_cuda_backward(const BackwardParams& p);

// Runs one backward call on `backend`; kAuto picks CUDA when the pointers are on a GPU, else CPU.
// For CUDA it allocates its workspace and synchronizes `stream` (use backward_cuda in graph capture or
// hot loops); checked (fwd.check_inputs), it reads the status itself and throws the Error, as forward()
// does. Returns the backend that ran.
Backend backward(const BackwardParams& p, Backend backend = Backend::kAuto, void* stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Decode: the state update of serving (mamba_ssm's selective_state_update for Mamba-2, with the
// slot indexing of inference engines; docs/serving.md). Per request b, head h, token t:
//   d = preprocess(dt[b,t,h])                        (dt_bias, softplus, dt_limit: as the forward)
//   S = exp(A[h] d) S + d outer(x[b,t,h], B[b,t,g])  g = h / (H / G), S [P, N] in fp32
//   out[b,t,h] = (S C[b,t,g] + D x[b,t,h]) * silu(z[b,t,h])
// S starts as cache slot state_batch_indices[b] and stays in fp32 across the request's tokens; it
// is rounded to state_dtype only where it is stored.
//
// Slots. An entry equal to pad_slot_id is a pad: a pad read slot skips the request (its out rows
// are zeros, no state is stored); a pad destination skips that store. The state after token t goes
// to slot dst_state_batch_indices[b, t]; without dst_state_batch_indices, the state after the last
// token goes back to the read slot (in place) and no other token's is stored. Speculative
// decoding: T tokens, one destination slot per token (pad for the states not wanted); the engine
// picks the next call's read slot (where the state after the last accepted token went).
// Bad slots: an entry outside [0, nslots) that is not pad_slot_id. The host backends throw Error
// naming the entry. The CUDA backend cannot read the indices without a synchronization, so it
// treats such an entry as a pad (the request is skipped, or the store dropped): never an
// out-of-bounds access (docs/reliability.md).
// Aliasing: two requests storing to one slot, or a request storing to a slot that another request
// reads. The host backends throw Error naming both entries; on the CUDA backend the contents of
// that slot, and the out rows of the request reading it, are undefined (as in the engines'
// kernels), and nothing outside the slots named is touched. Allowed: several requests reading one
// slot (a forked prefix), a request storing to its own read slot (in place), several tokens of one
// request storing to one slot (the last one wins).
struct DecodeParams {
  int64_t batch = 0;    // b: requests
  int64_t ntokens = 1;  // T: tokens per request (> 1: speculative decoding)
  int64_t nheads = 0;   // H
  int64_t headdim = 0;  // P: a multiple of 16 in [16, 128]
  int64_t ngroups = 1;  // G: divides H
  int64_t dstate = 0;   // N: a multiple of 16 in [16, 256]
  int64_t nslots = 0;   // slots of the state cache

  DType dtype = DType::kBF16;       // x, B, C, z, out
  DType dt_dtype = DType::kF32;     // dt
  DType state_dtype = DType::kF32;  // the cache (the arithmetic is fp32 whatever it is)

  // The cache, read and written in place: [nslots, H, P, N] of state_dtype.
  void* state = nullptr;  Strides4 state_stride;
  // Inputs.
  const void* x = nullptr;   Strides4 x_stride;   // [b, T, H, P]
  const void* dt = nullptr;  Strides3 dt_stride;  // [b, T, H]
  const float* A = nullptr;                       // [H], contiguous
  const void* B = nullptr;   Strides4 B_stride;   // [b, T, G, N]
  const void* C = nullptr;   Strides4 C_stride;   // [b, T, G, N]
  // Optional inputs (nullptr: absent).
  DLayout D_layout = DLayout::kNone;
  const float* D = nullptr;                       // [H] or [H, P], contiguous
  const void* z = nullptr;   Strides4 z_stride;   // [b, T, H, P], dtype
  const float* dt_bias = nullptr;                 // [H], contiguous
  bool dt_softplus = false;
  float dt_min = 0.0f;                            // dt_limit, as in ForwardParams
  float dt_max = std::numeric_limits<float>::infinity();
  // Slots, in the same memory as the rest (device memory for the CUDA backend).
  // [b], contiguous: read slots; null: request b reads slot b (nslots >= b), pad_slot_id or not (a
  // pad marks index entries only, as in mamba_ssm).
  const int32_t* state_batch_indices = nullptr;
  const int32_t* dst_state_batch_indices = nullptr;  Strides2 dst_state_batch_indices_stride;  // [b, T]
  int32_t pad_slot_id = -1;
  // Output.
  void* out = nullptr;  Strides4 out_stride;      // [b, T, H, P], dtype
};

// Throws Error if p does not describe a valid decode call: sizes (each tensor at most 2^56
// elements), dtypes, strides (the last one 1), pointers (null, aligned to the element size),
// dt_limit, and overlaps (out with the cache or an input, the cache with an input). The contents of
// the slot indices are checked by the host backends only (see above).
void validate(const DecodeParams& p);

// The part of validate(DecodeParams) that reads no pointer and no stride: sizes (each in range,
// batch and nslots below 2^31, every tensor's element count within 2^56), dtypes and dt_limit. For
// sizing buffers (out) before allocating them, as validate_sizes(ForwardParams).
void validate_sizes(const DecodeParams& p);

// The fp64 oracle as a backend: the recurrence above in double, out and the stored states rounded
// to their dtypes. Host memory; checks the slots (Error).
void decode_reference(const DecodeParams& p);

// The CPU decode: fp32, multithreaded over (request, head). Host memory; checks the slots (Error).
// num_threads <= 0 uses every hardware thread.
void decode_cpu(const DecodeParams& p, int num_threads = 0);

// The CUDA decode. Device memory; launches on `stream` (a cudaStream_t): no allocation, no
// synchronization, no workspace; safe to capture in a CUDA graph. Bad slot entries are skipped
// (see above). Throws Error for bad input, CudaError if the launch fails.
void decode_cuda(const DecodeParams& p, void* stream);

// Runs one decode call on `backend`; kAuto picks CUDA when the cache is on a GPU, else CPU. For
// CUDA it synchronizes `stream` afterwards (use decode_cuda in graph capture or hot loops). Returns
// the backend that ran.
Backend decode(const DecodeParams& p, Backend backend = Backend::kAuto, void* stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Packed prefill: the prefill of serving (vLLM's mamba_chunk_scan_combined_varlen; docs/serving.md,
// "Packed prefill"). S requests packed into one row of tokens (cu_seqlens), each starting from its
// cache slot's state (or from zero, a new request) and storing its state after its last token back
// into that slot. Per request s (tokens [cu_seqlens[s], cu_seqlens[s+1])) and head h:
//   state = has_initial_state[s] ? cache[slots[s], h] : 0        (in fp32 or better)
//   for each token t of the request: the forward's recurrence (docs/contract.md), y[t] written
//   cache[slots[s], h] = state after the request's last token, rounded to state_dtype
// A request of no tokens stores its starting state (zero for a new one; an unchanged slot else).
//
// Intermediate states (a prefix cache keeping a state every k tokens; docs/serving.md). With
// state_every = k > 0 (a multiple of fwd.chunk_size), for request s of len_s tokens (counted from its
// first token in this call) and m = 1, 2, ... with m*k <= len_s and m <= max_intermediate:
//   cache[intermediate_slots[s * max_intermediate + m-1], h] = the state after the request's
//                                (m*k)-th token (that token included), rounded to state_dtype
// An entry equal to pad_slot_id skips that store; boundaries past max_intermediate are not stored
// anywhere; a pad request (slots[s] == pad_slot_id) stores nothing, intermediate states included.
// When len_s is a multiple of k, the last boundary's state is the final state: it is stored twice,
// to its intermediate slot and to slots[s] (the same bits; that entry may name slots[s] itself).
//
// Slots. slots[s] == pad_slot_id: the request's state is neither read nor written; its y is still
// computed, from a zero state. Bad slots: an entry outside [0, nslots) that is not pad_slot_id, or
// two requests naming one slot (their stores would race); an intermediate entry, stored or not,
// outside [0, nslots) that is not pad_slot_id, or a stored one naming a request's slot (a state that
// request reads or stores; the last boundary in the request's own slot, above, excepted) or another
// stored entry's slot. The host backends throw Error naming the entries. The CUDA backend does not
// read the indices on the host (no sync): as decode_cuda does, it treats an out-of-range entry as
// pad_slot_id (that request's state is neither read nor stored; an intermediate store is skipped),
// and leaves a slot that two stores name undefined, never touching memory outside the slots named.
// It does not read seq_idx (cu_seqlens marks the requests); bad cu_seqlens give unspecified results,
// never an access outside the buffers (as in the forward: docs/reliability.md).
struct PrefillParams {
  // The packed call: batch 1, cu_seqlens with S = nseqs requests (seq_idx optional, as in the
  // forward: the host backends check that its ids change exactly where a request starts), x, dt, A,
  // B, C, D, z, dt_bias, dt_softplus, dt_limit and y as in the forward. fwd.initial_states,
  // fwd.final_states and fwd.varlen_states must be null: the cache replaces them.
  ForwardParams fwd;
  // The cache, read and written in place: [nslots, H, P, N] of state_dtype (fp32, bf16 or fp16; the
  // arithmetic is fp32 or better whatever it is).
  void* state = nullptr;  Strides4 state_stride;
  DType state_dtype = DType::kF32;
  int64_t nslots = 0;
  // Slots, in the same memory as the rest, contiguous.
  const int32_t* slots = nullptr;              // [S]: request s's slot
  const uint8_t* has_initial_state = nullptr;  // [S] or null (every request reads its slot); 0: start from zero, else read
  int32_t pad_slot_id = -1;
  // Intermediate states (see above); state_every 0: none, and intermediate_slots must be null.
  int64_t state_every = 0;                      // k: 0, or a multiple of fwd.chunk_size
  const int32_t* intermediate_slots = nullptr;  // [S, max_intermediate], contiguous rows
  int64_t max_intermediate = 0;                 // >= 1 with state_every > 0
};

// Throws Error if p does not describe a valid prefill call: fwd by the forward's rules (validate),
// the refused fwd fields, sizes (each tensor at most 2^56 elements), dtypes, strides, pointers
// (null, aligned to the element size), overlaps (the cache with an input or y, the slot arrays
// with y), and state_every, intermediate_slots and max_intermediate together. The contents of the
// slot arrays are checked by the host backends only (see above).
void validate(const PrefillParams& p);

// The part of validate(PrefillParams) that reads no pointer and no stride: fwd's sizes, dtypes and
// dt_limit (validate_sizes(ForwardParams), its messages prefixed "fwd: " as validate's), batch 1,
// chunk_size 64, 128 or 256, state_dtype, and the cache's sizes (nslots in [1, 2^31), its element
// count within 2^56). For sizing buffers (y, [T, H, P]) before allocating them, as
// validate_sizes(ForwardParams).
void validate_sizes(const PrefillParams& p);

// The fp64 oracle as a backend: the forward's oracle run on each request from its starting state,
// y and the stored states (final and intermediate) rounded to their dtypes. Host memory; checks the slots (Error).
void prefill_reference(const PrefillParams& p);

// The CPU prefill: forward_cpu's scan, each request's state loaded from and stored to its slot
// (and its intermediate states stored to theirs).
// Multithreaded over (head, 32 head dims); host memory; checks the slots (Error). num_threads <= 0
// uses every hardware thread.
void prefill_cpu(const PrefillParams& p, int num_threads = 0);

// The CUDA packed prefill. Device memory; launches on `stream` (a cudaStream_t) and never
// synchronizes or allocates: the caller provides `workspace` of at least
// cuda_prefill_workspace_bytes(p) bytes (256-byte aligned), sized from the token and request counts
// alone, so one workspace serves every call of those sizes (CUDA-graph safe). The requests run
// chunk-aligned: each starts a chunk of its own, its last chunk padded, so that the state at the end
// of each chunk is one request's (docs/serving.md, "The CUDA packed prefill"). fwd.cuda_path: auto
// (the hopper walk for 16-bit inputs whose x, B, C and y TMA can move on an sm_90 GPU, else the
// three-kernel path), hopper or three_kernel; another path throws Error naming it. fwd.fp32_math
// and fwd.check_inputs as in the forward. Throws Error for bad input, CudaError if a
// launch fails.
std::size_t cuda_prefill_workspace_bytes(const PrefillParams& p);
void prefill_cuda(const PrefillParams& p, void* workspace, std::size_t workspace_bytes, void* stream);

// Runs one prefill call on `backend`; kAuto picks CUDA when the cache is on a GPU, else CPU. For
// CUDA it allocates its workspace (use prefill_cuda in graph capture or hot loops) and synchronizes
// `stream`. Returns the backend that ran.
Backend prefill(const PrefillParams& p, Backend backend = Backend::kAuto, void* stream = nullptr);

// Exact prefill (docs/serving.md, "Consistency"). A decode call with ntokens = a prompt's length
// is a prefill of it from the request's slot. With an fp32 cache, on one backend (decode_cpu or
// decode_cuda), its out and stored state are bit for bit those of prefilling the prompt in pieces
// (each call continuing from the slot) or of prefilling fewer tokens and decoding the rest one at a
// time: each token's arithmetic does not depend on its position in the call. (A bf16 or fp16 cache
// rounds the state at every store, so there the ways agree within the tolerance only; so do the
// forward's prefills, chunked on tensor cores.) It costs fp32 arithmetic token after token in
// place of the forward's chunked matmuls.

// ---------------------------------------------------------------------------------------------
// The Mamba-2 layer's causal convolution (what mamba_ssm's layer runs on xBC before the scan, the
// semantics of its causal_conv1d): depthwise over the tokens, width W, for every channel c:
//   pre[b, t, c] = bias[c] + sum_{k < W} weight[c, k] x[b, t - (W - 1) + k, c]
//   out[b, t, c] = silu(pre) (silu true) or pre
// where a tap before token 0, or (with seq_idx) on a token of another sequence than t's
// (seq_idx[b, s] != seq_idx[b, t]), reads 0. fp32 arithmetic whatever the dtype; out rounded to it.
// The layer call (python/mamba2ssd/layer.py) is its user; the scan's API above does not need it.
struct Conv1dParams {
  int64_t batch = 0;     // b
  int64_t seqlen = 0;    // L
  int64_t channels = 0;  // C
  int64_t width = 4;     // W: 2, 3 or 4 (causal_conv1d's widths)
  DType dtype = DType::kBF16;  // x and out (and the backward's dout and dx): fp32, fp16 or bf16
  const void* x = nullptr;  Strides3 x_stride;    // [b, L, C]
  const float* weight = nullptr;                  // [C, W], contiguous
  const float* bias = nullptr;                    // [C], contiguous; null: no bias
  const int32_t* seq_idx = nullptr;  Strides2 seq_idx_stride;  // [b, L]; null: one sequence a row
  bool silu = true;
  void* out = nullptr;  Strides3 out_stride;      // [b, L, C]; the backward ignores it
};

// The gradients of sum(dout * out) for Conv1dParams `fwd` (whose out is not read): dx in dtype,
// dweight and dbias in fp32 (the caller rounds them to its weights' dtype). With silu the backward
// computes pre again from x.
struct Conv1dBackwardParams {
  Conv1dParams fwd;
  const void* dout = nullptr;  Strides3 dout_stride;  // [b, L, C], dtype
  void* dx = nullptr;  Strides3 dx_stride;            // [b, L, C], dtype
  float* dweight = nullptr;                           // [C, W], contiguous
  float* dbias = nullptr;                             // [C], contiguous; null: not wanted
};

// Throw Error naming the parameter and the value: sizes (each tensor at most 2^56 elements), width,
// dtype (fp64 refused), pointers (null, alignment), strides (the last one 1), and overlaps (an
// output with an input or another output).
void validate(const Conv1dParams& p);
void validate(const Conv1dBackwardParams& p);

// The fp64 oracle as a backend: the formula above in double, outputs rounded to their dtypes. Host
// memory, single-threaded (the tests' reference, not a fast path).
void conv1d_reference(const Conv1dParams& p);
void conv1d_backward_reference(const Conv1dBackwardParams& p);

// The CUDA convolution and its backward. Device memory; launch on `stream` (a cudaStream_t): no
// allocation, no synchronization; safe in a CUDA graph. The backward sums dweight and dbias in a
// fixed order through a caller's workspace of cuda_conv1d_backward_workspace_bytes(p) bytes (256-byte
// aligned), so reruns give the same bits. Throw Error for bad input, CudaError if a launch fails.
void conv1d_cuda(const Conv1dParams& p, void* stream);
std::size_t cuda_conv1d_backward_workspace_bytes(const Conv1dBackwardParams& p);
void conv1d_backward_cuda(const Conv1dBackwardParams& p, void* workspace, std::size_t workspace_bytes, void* stream);

// ---------------------------------------------------------------------------------------------
// The Mamba-2 layer's gated RMSNorm (mamba_ssm's RMSNormGated, between the scan and the
// out-projection): for each row r and each group of group_size features of it,
//   v = y (norm_before_gate, or without z) or y silu(z)
//   n = v / sqrt(mean over the group of v^2 + eps)
//   out = n weight silu(z) (norm_before_gate, with z) or n weight
// fp32 arithmetic whatever the dtype; out rounded to it. The layer call is its user.
struct GatedRmsNormParams {
  int64_t rows = 0;        // every token of every batch row
  int64_t dim = 0;         // features a row
  int64_t group_size = 0;  // divides dim; at most kMaxRmsNormGroup
  DType dtype = DType::kBF16;  // y, z and out (and the backward's dout, dy, dz): fp32, fp16 or bf16
  float eps = 1e-6f;
  bool norm_before_gate = true;
  const void* y = nullptr;  Strides2 y_stride;  // [rows, dim]
  const void* z = nullptr;  Strides2 z_stride;  // [rows, dim]; null: no gate
  const float* weight = nullptr;                // [dim], contiguous
  void* out = nullptr;  Strides2 out_stride;    // [rows, dim]; in the backward, optional (below)
};
inline constexpr int64_t kMaxRmsNormGroup = 8192;

// The gradients of sum(dout * out) for `fwd`: dy and dz in dtype, dweight in fp32 (the caller
// rounds it to its weight's dtype). fwd.out is never read: null, or where the backward writes the
// forward's output again on the way (mamba_ssm's recompute_output: the layer's out-projection
// needs it for its weight's gradient, and this costs one write instead of another forward); on
// CUDA it can differ from the forward's in the last bits, where the two kernels split a group over
// their threads differently and so add its squares in another order (groups above 4096 features at
// 16 bits, 2048 at fp32, 512 where rows are not 16-byte aligned).
struct GatedRmsNormBackwardParams {
  GatedRmsNormParams fwd;
  const void* dout = nullptr;  Strides2 dout_stride;  // [rows, dim], dtype
  void* dy = nullptr;  Strides2 dy_stride;            // [rows, dim], dtype
  void* dz = nullptr;  Strides2 dz_stride;            // [rows, dim], dtype; with z only (null without)
  float* dweight = nullptr;                           // [dim], contiguous
};

// Throw Error naming the parameter and the value, as validate(Conv1dParams).
void validate(const GatedRmsNormParams& p);
void validate(const GatedRmsNormBackwardParams& p);

// The fp64 oracle as a backend (host memory, single-threaded), outputs rounded to their dtypes.
void gated_rmsnorm_reference(const GatedRmsNormParams& p);
void gated_rmsnorm_backward_reference(const GatedRmsNormBackwardParams& p);

// The CUDA norm and its backward (device memory; on `stream`; no allocation, no synchronization).
// The backward sums dweight over the rows in a fixed order through a caller's workspace of
// cuda_gated_rmsnorm_backward_workspace_bytes(p) bytes (256-byte aligned).
void gated_rmsnorm_cuda(const GatedRmsNormParams& p, void* stream);
std::size_t cuda_gated_rmsnorm_backward_workspace_bytes(const GatedRmsNormBackwardParams& p);
void gated_rmsnorm_backward_cuda(const GatedRmsNormBackwardParams& p, void* workspace, std::size_t workspace_bytes,
                                 void* stream);

}  // namespace mamba2ssd
