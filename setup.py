# Builds the PyTorch package `mamba2ssd`: the library's sources plus the op binding in python/csrc,
# compiled into one extension module, mamba2ssd._C.
#
#   pip install --no-build-isolation .
#
# The CUDA backend is built when this PyTorch has CUDA and the nvcc found (CUDA_HOME) has the same
# CUDA version as PyTorch; otherwise the extension is CPU-only (src/cuda/no_cuda.cpp stands in).
# MAMBA2SSD_BUILD_CUDA=1 or =0 overrides the detection. MAX_JOBS caps the parallel compiles.
#
# A wheel to hand to another machine (no compiler needed there; docs/packaging.md):
#
#   pip wheel --no-build-isolation --no-deps -w dist .      (or: python -m build --wheel --no-isolation)
#
# The version is the repository's VERSION file (CMake reads the same one); the wheel requires the
# PyTorch minor version it was compiled against, and mamba2ssd.build_info() reports the version, the
# CUDA toolkit and the GPU targets compiled in.
#
# MAMBA2SSD_TILE_OBJECTS=DIR links in the CUDA Tile C++ backend (cuda_path "tile"), which PyTorch's
# nvcc cannot compile (it needs 13.3+): DIR holds its objects built by a tile-capable nvcc, e.g.
# CMake's build-tile/src/cuda_tile/CMakeFiles/mamba2ssd_tile.dir (docs/tile-cpp.md).
import glob
import os
import re
import subprocess
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))

# -g0 undoes the -g of Python's own CFLAGS: debug info for PyTorch's headers costs a third of the
# compile time of the binding and 30x its object size.
# C++17, PyTorch's own standard (the library sources need nothing newer). Error messages are built
# without iostreams (src/common/text.h): on the H200 machine an ostringstream inside the extension
# crashed the interpreter.
CXX_FLAGS = ["-O3", "-std=c++17", "-g0"]
# The GPU code: the same list as CMake's MAMBA2SSD_CUDA_GENCODE (SASS for sm_80, sm_90a, sm_100 and
# sm_103; compute_80 PTX, JIT-compiled by the driver on any newer GPU). The environment variable of
# that name (-gencode flags separated by spaces or semicolons) replaces the list: sm_90a alone, say,
# compiles one GPU target instead of five for a build that only an H100/H200 will run.
DEFAULT_GENCODE = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_80,code=compute_80",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_100,code=sm_100",
    "-gencode=arch=compute_100,code=sm_103",
]


def gencode_flags():
    """DEFAULT_GENCODE, or the flags in MAMBA2SSD_CUDA_GENCODE (each must be a -gencode=arch=...,code=...)."""
    text = os.environ.get("MAMBA2SSD_CUDA_GENCODE", "").strip()
    if not text:
        return DEFAULT_GENCODE
    flags = [f for f in re.split(r"[;\s]+", text) if f]
    for f in flags:
        if not re.fullmatch(r"-gencode=arch=compute_\d+[af]?,code=\[?[\w,]+\]?", f):
            sys.exit(f"mamba2ssd setup: MAMBA2SSD_CUDA_GENCODE holds {f!r}, not a -gencode=arch=compute_XY,code=sm_XY flag")
    return flags


NVCC_FLAGS = gencode_flags() + [
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-O3",
    # PyTorch's extension builder defines these four to hide the implicit conversions and
    # operators of __half and __nv_bfloat16; the kernels are written for plain CUDA (as CMake
    # builds them), so undefine them again.
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
]


def read_version():
    """MAJOR.MINOR.PATCH from VERSION, the project's one version number."""
    with open(os.path.join(ROOT, "VERSION")) as f:
        version = f.readline().strip()
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        sys.exit(f"mamba2ssd setup: VERSION must hold MAJOR.MINOR.PATCH, got {version!r}")
    return version


def gpu_targets(nvcc_flags):
    """The GPU code the -gencode flags produce, as nvcc names it: ["sm_80", "sm_90a"] (compute_XY: PTX)."""
    targets = []
    for flag in nvcc_flags:
        for codes in re.findall(r",code=([^ ]+)", flag):
            for code in re.sub(r"[\[\]\"']", "", codes).split(","):
                if code not in targets:
                    targets.append(code)
    return targets


def configure_file(template, output, values):
    """CMake's configure_file(@ONLY) for the two generated headers: @NAME@ -> values[NAME]. The file is
    rewritten only when its text changes, so that a rebuild recompiles nothing it does not have to."""
    with open(os.path.join(ROOT, template)) as f:
        text = re.sub(r"@(\w+)@", lambda m: values[m.group(1)], f.read())
    os.makedirs(os.path.dirname(output), exist_ok=True)
    if os.path.exists(output):
        with open(output) as f:
            if f.read() == text:
                return
    with open(output, "w") as f:
        f.write(text)


def generate_headers(folder, version, targets):
    """<mamba2ssd/version.h> and api/build_config.h under folder (include/ and src/), as CMake writes them."""
    major, minor, patch = version.split(".")
    configure_file("include/mamba2ssd/version.h.in", os.path.join(folder, "include", "mamba2ssd", "version.h"),
                   {"MAMBA2SSD_VERSION_MAJOR": major, "MAMBA2SSD_VERSION_MINOR": minor,
                    "MAMBA2SSD_VERSION_PATCH": patch})
    configure_file("src/api/build_config.h.in", os.path.join(folder, "src", "api", "build_config.h"),
                   {"MAMBA2SSD_GPU_TARGETS": " ".join(targets)})
    return [os.path.join(folder, "include"), os.path.join(folder, "src")]


def log(msg):
    print(f"mamba2ssd setup: {msg}", file=sys.stderr, flush=True)


def sources(*patterns):
    # Relative to the repository root, sorted, so the build is the same on every machine.
    found = []
    for pattern in patterns:
        found += sorted(glob.glob(pattern, root_dir=ROOT))
    return found


def nvcc_version(cuda_home):
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def build_cuda():
    """Whether to build the CUDA backend, and why (printed, so a build log says what it did)."""
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    forced = os.environ.get("MAMBA2SSD_BUILD_CUDA")
    if forced not in (None, "", "0", "1"):
        sys.exit(f"mamba2ssd setup: MAMBA2SSD_BUILD_CUDA must be 0 or 1, got {forced!r}")
    if forced == "0":
        return False, "MAMBA2SSD_BUILD_CUDA=0"
    torch_cuda = torch.version.cuda
    nvcc = nvcc_version(CUDA_HOME) if CUDA_HOME else None
    if forced == "1":
        if torch_cuda is None or nvcc is None:
            sys.exit("mamba2ssd setup: MAMBA2SSD_BUILD_CUDA=1 but "
                     + ("this PyTorch has no CUDA" if torch_cuda is None else "nvcc was not found (set CUDA_HOME)"))
        return True, f"MAMBA2SSD_BUILD_CUDA=1 (PyTorch CUDA {torch_cuda}, nvcc {nvcc})"
    if torch_cuda is None:
        return False, f"PyTorch {torch.__version__} has no CUDA"
    if nvcc is None:
        return False, "nvcc was not found (CUDA_HOME unset or without bin/nvcc)"
    if nvcc != torch_cuda:
        return False, f"nvcc {nvcc} differs from PyTorch's CUDA {torch_cuda}"
    return True, f"PyTorch CUDA {torch_cuda} matches nvcc {nvcc}"


TILE_OBJECTS = ["forward_cuda_tile", "launch_tile_bf16", "launch_tile_f16", "launch_tile_f32"]


def tile_objects():
    """The tile backend's object files from MAMBA2SSD_TILE_OBJECTS, or [] when it is not set."""
    folder = os.environ.get("MAMBA2SSD_TILE_OBJECTS")
    if not folder:
        return []
    found = []
    for name in TILE_OBJECTS:
        path = next((p for p in (os.path.join(folder, name + ext) for ext in (".cu.o", ".o")) if os.path.exists(p)),
                    None)
        if path is None:
            sys.exit(f"mamba2ssd setup: MAMBA2SSD_TILE_OBJECTS={folder} has no {name}.cu.o or {name}.o")
        found.append(os.path.abspath(path))
    return found


def extension(with_cuda, tile, generated):
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    srcs = sources("src/api/*.cpp", "src/reference/*.cpp", "src/cpu/*.cpp", "python/csrc/*.cpp")
    if with_cuda:
        srcs += sources("src/cuda/common/*.cpp", "src/cuda/fwd/*.cpp", "src/cuda/fwd/*.cu",
                        "src/cuda/bwd/*.cpp", "src/cuda/bwd/*.cu", "src/cuda/decode/*.cpp", "src/cuda/decode/*.cu",
                        "src/cuda/prefill/*.cu", "src/cuda/conv/*.cu", "src/cuda/norm/*.cu", "python/csrc/cuda/*.cpp")
    else:
        srcs += ["src/cuda/no_cuda.cpp"]

    kwargs = dict(
        name="mamba2ssd._C",
        sources=srcs,
        include_dirs=[os.path.join(ROOT, "include"), os.path.join(ROOT, "src"), os.path.join(ROOT, "python", "csrc")]
        + generated,
        extra_compile_args={"cxx": CXX_FLAGS},
    )
    if with_cuda:
        kwargs["extra_compile_args"]["nvcc"] = NVCC_FLAGS
        kwargs["define_macros"] = [("MAMBA2SSD_HAVE_CUDA", "1")]
        if any("sm_90a" in f for f in NVCC_FLAGS):  # the wgmma kernels have real code (hopper path)
            kwargs["define_macros"].append(("MAMBA2SSD_SM90A_CODE", "1"))
        if tile:
            log(f"linking the CUDA Tile C++ backend from {os.environ['MAMBA2SSD_TILE_OBJECTS']}")
            kwargs["extra_objects"] = tile
            kwargs["define_macros"].append(("MAMBA2SSD_HAVE_TILE", "1"))  # cuda_tile/forward_cuda_tile.h: under src/
        return CUDAExtension(**kwargs)
    if tile:
        sys.exit("mamba2ssd setup: MAMBA2SSD_TILE_OBJECTS needs the CUDA backend (MAMBA2SSD_BUILD_CUDA=1)")
    return CppExtension(**kwargs)


def main():
    import torch
    from torch.utils.cpp_extension import BuildExtension

    version = read_version()
    with_cuda, why = build_cuda()
    tile = tile_objects()
    targets = gpu_targets(NVCC_FLAGS) if with_cuda else []
    log(f"mamba2ssd {version}, "
        + (f"building the CUDA backend for {' '.join(targets)}: " if with_cuda else "building the CPU-only extension: ")
        + why)
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    # Build outputs under /build-py/ (git-ignored, away from CMake's build/), one folder per
    # flavour so that switching between them rebuilds nothing.
    build_base = os.path.join("build-py", ("cuda-tile" if tile else "cuda") if with_cuda else "cpu")
    generated = generate_headers(os.path.join(ROOT, build_base, "generated"), version, targets)
    # The extension links against this PyTorch's C++ API, which changes between minor versions.
    torch_minor = tuple(int(v) for v in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    setup(
        version=version,
        install_requires=[f"torch>={torch_minor[0]}.{torch_minor[1]},<{torch_minor[0]}.{torch_minor[1] + 1}"],
        packages=["mamba2ssd"],
        package_dir={"": "python"},
        ext_modules=[extension(with_cuda, tile, generated)],
        cmdclass={"build_ext": BuildExtension},
        options={"build": {"build_base": build_base}},
    )


if __name__ == "__main__":
    main()
