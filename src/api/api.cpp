// The API's small pieces: names, sizes, strides, the host checks and the backend choice.

#include <initializer_list>
#include <string>

#include "api/internal.h"
#include "common/input_rules.h"

namespace mamba2ssd {

const char* to_string(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
    case DType::kF64: return "fp64";
  }
  return "unknown";
}

const char* to_string(Backend b) {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kReference: return "reference";
    case Backend::kCpu: return "cpu";
    case Backend::kCuda: return "cuda";
  }
  return "unknown";
}

const char* to_string(CudaPath c) {
  switch (c) {
    case CudaPath::kAuto: return "auto";
    case CudaPath::kThreeKernel: return "three-kernel";
    case CudaPath::kFused: return "fused";
    case CudaPath::kTile: return "tile";
    case CudaPath::kHopper: return "hopper";
  }
  return "unknown";
}

const char* to_string(Fp32Math m) {
  switch (m) {
    case Fp32Math::kTf32: return "tf32";
    case Fp32Math::kAccurate: return "accurate";
  }
  return "unknown";
}

int64_t saved_states_elements(const ForwardParams& p) {
  validate_sizes(p);  // every size within the limits: the product below stays under 2^63
  return p.batch * saved_states_chunks(p.seqlen) * p.nheads * p.headdim * p.dstate;
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kF64: return 8;
  }
  return 0;
}

namespace {
[[noreturn]] void stride_overflow(std::initializer_list<int64_t> sizes) {
  std::string s = "[";
  for (int64_t v : sizes) s += (s.size() > 1 ? ", " : "") + std::to_string(v);
  throw Error("contiguous_strides: sizes " + s + "] give a stride past 2^63 - 1");
}
}  // namespace

Strides4 contiguous_strides(int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  int64_t s1 = 0, s0 = 0;
  if (__builtin_mul_overflow(d2, d3, &s1) || __builtin_mul_overflow(d1, s1, &s0)) stride_overflow({d0, d1, d2, d3});
  return {s0, s1, d3, 1};
}
Strides3 contiguous_strides(int64_t d0, int64_t d1, int64_t d2) {
  int64_t s0 = 0;
  if (__builtin_mul_overflow(d1, d2, &s0)) stride_overflow({d0, d1, d2});
  return {s0, d2, 1};
}
Strides2 contiguous_strides(int64_t d0, int64_t d1) {
  (void)d0;
  return {d1, 1};
}

namespace detail {

void validate_cu_seqlens_host(const ForwardParams& p) {
  if (!p.cu_seqlens) return;
  auto bad = [&](const std::string& what) { throw Error("cu_seqlens " + what); };
  if (p.cu_seqlens[0] != 0) bad("[0] must be 0, got " + std::to_string(p.cu_seqlens[0]));
  for (int64_t s = 0; s < p.nseqs; ++s)
    if (p.cu_seqlens[s + 1] < p.cu_seqlens[s])
      bad(std::string("must be non-decreasing, got [") + std::to_string(s) + "] = " + std::to_string(p.cu_seqlens[s]) +
          " > [" + std::to_string(s + 1) + "] = " + std::to_string(p.cu_seqlens[s + 1]));
  if (p.cu_seqlens[p.nseqs] != p.seqlen)
    bad(std::string("[") + std::to_string(p.nseqs) + "] must equal seqlen " + std::to_string(p.seqlen) + ", got " +
        std::to_string(p.cu_seqlens[p.nseqs]));
}

void refuse_f64(const ForwardParams& p, const char* backend) {
  if (p.dtype == DType::kF64 || p.dt_dtype == DType::kF64)
    throw Error(std::string("dtype fp64: backend ") + backend +
                " takes fp32, fp16 and bf16; fp64 runs on the reference backend only (the fp64 oracle)");
}

void validate_contents_host(const ForwardParams& p) {
  validate_cu_seqlens_host(p);
  if (!p.check_inputs || !p.seq_idx) return;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 1; t < p.seqlen; ++t) {
      const int32_t* row = p.seq_idx + b * p.seq_idx_stride.s0;
      if (row[t * p.seq_idx_stride.s1] < row[(t - 1) * p.seq_idx_stride.s1])
        throw Error(input_rule_message(kSeqIdxDecreasing, b, t, row[t * p.seq_idx_stride.s1]));
    }
}

void require_input_status(const ForwardParams& p) {
  if (p.check_inputs && !p.input_status)
    throw Error("check_inputs on the GPU needs input_status (a zeroed device int64_t[kInputStatusWords]): "
                "the bad entry can only be reported through it, without a host sync");
}

void require_host_pointers(std::initializer_list<std::pair<const char*, const void*>> ptrs, const char* backend) {
  for (auto [name, ptr] : ptrs)
    if (ptr && is_device_pointer(ptr))
      throw Error(std::string(name) + " is device memory, but backend " + backend + " needs host memory");
}

void require_host_pointers(const ForwardParams& p, const char* backend) {
  if (p.saved_states)
    throw Error(std::string("saved_states: backend ") + backend +
                " neither saves nor reads the states for the backward (backend cuda does); leave it null");
  require_host_pointers({{"x", p.x}, {"dt", p.dt}, {"A", p.A}, {"B", p.B}, {"C", p.C}, {"D", p.D}, {"z", p.z},
                         {"dt_bias", p.dt_bias}, {"initial_states", p.initial_states}, {"seq_idx", p.seq_idx},
                         {"cu_seqlens", p.cu_seqlens}, {"y", p.y}, {"final_states", p.final_states},
                         {"varlen_states", p.varlen_states}},
                        backend);
}

void require_host_pointers(const BackwardParams& p, const char* backend) {
  require_host_pointers(p.fwd, backend);
  const std::pair<const char*, const void*> ptrs[] = {
      {"dout", p.dout}, {"dfinal_states", p.dfinal_states}, {"dvarlen_states", p.dvarlen_states},
      {"dx", p.dx}, {"ddt", p.ddt}, {"dA", p.dA}, {"dB", p.dB}, {"dC", p.dC}, {"dD", p.dD}, {"dz", p.dz},
      {"ddt_bias", p.ddt_bias}, {"dinitial_states", p.dinitial_states}};
  for (auto [name, ptr] : ptrs)
    if (ptr && is_device_pointer(ptr))
      throw Error(std::string(name) + " is device memory, but backend " + backend + " needs host memory");
}

}  // namespace detail

void check_input_status(const int64_t host_status[kInputStatusWords]) {
  if (host_status[0] != detail::kInputsGood)
    throw Error(detail::input_rule_message(host_status[0], host_status[1], host_status[2], host_status[3]));
}

Backend forward(const ForwardParams& p, Backend backend, void* stream) {
  if (backend == Backend::kAuto) backend = is_device_pointer(p.x) ? Backend::kCuda : Backend::kCpu;
  if (backend == Backend::kReference) {
    detail::validate_reference(p);  // the one backend that takes fp64
  } else {
    detail::refuse_f64(p, to_string(backend));  // first, so that the message names the backend
    validate(p);
  }
  switch (backend) {
    case Backend::kReference: forward_reference(p); break;
    case Backend::kCpu: forward_cpu(p); break;
    case Backend::kCuda: detail::forward_cuda_blocking(p, stream); break;
    default: throw Error("backend: unknown value " + std::to_string(static_cast<int>(backend)));
  }
  return backend;
}

Backend backward(const BackwardParams& p, Backend backend, void* stream) {
  if (backend == Backend::kAuto) backend = is_device_pointer(p.fwd.x) ? Backend::kCuda : Backend::kCpu;
  if (backend == Backend::kReference) {
    detail::validate_reference(p);
  } else {
    detail::refuse_f64(p.fwd, to_string(backend));
    validate(p);
  }
  switch (backend) {
    case Backend::kReference: backward_reference(p); break;
    case Backend::kCpu: backward_cpu(p); break;
    case Backend::kCuda: detail::backward_cuda_blocking(p, stream); break;
    default: throw Error("backend: unknown value " + std::to_string(static_cast<int>(backend)));
  }
  return backend;
}

}  // namespace mamba2ssd
