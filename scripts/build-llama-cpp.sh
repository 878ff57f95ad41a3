#!/usr/bin/env bash
# Builds llama.cpp's CPU tools (llama-bench, llama-quantize, llama-server, llama-perplexity) from the llama.cpp
# sources vendored in the pinned PyPI sdist of llama-cpp-python, for benchmarks to compare against.
# Nothing here is committed: the sdist, a venv holding cmake, the build tree and the binaries are
# cached in $RADIX_LLAMA_CACHE (default ~/.cache/radix-serve/llama.cpp).
#
#   scripts/build-llama-cpp.sh          build if needed; print the directory holding the binaries
#
# Idempotent: a finished build (bin-VARIANT/.stamp naming the sdist hash, every tool there) is reused. Takes ~15-30
# minutes on 2 cores the first time; run it niced on a shared machine. JOBS (default: nproc) sets -j.
#
# Not GGML_NATIVE: on Intel machines that report AMX while the OS grants no AMX tile state (the
# cloud machines we test on), -march=native builds ggml's AMX matmul and llama-server dies with
# SIGILL in `tilezero`. The instruction sets are named instead, from /proc/cpuinfo, AMX always
# off; the VARIANT (e.g. avx2-avx512-vnni) names the build, and bin-VARIANT/build-flags.txt
# records its cmake flags for the benchmark reports.
#
# RADIX_CPU_ISA (ours: portable, avx2, avxvnni, avx512) caps llama.cpp's instruction sets the
# same way, so that a benchmark forcing our lower path compares against llama.cpp built for it
# (avx2: AVX, AVX2, FMA, F16C, BMI2; avxvnni: those and AVX-VNNI; portable: none of them).
set -euo pipefail

version=0.3.36
sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
root="${RADIX_LLAMA_CACHE:-$HOME/.cache/radix-serve/llama.cpp}"
dir="$root/$version"
tools=(llama-bench llama-quantize llama-server llama-perplexity)

die() { echo "build-llama-cpp.sh: $*" >&2; exit 1; }

# ggml's option for each CPU flag this machine has (x86-64; elsewhere ggml's defaults stand).
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
isa=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
variant=""
case "$(echo "${RADIX_CPU_ISA:-}" | tr 'A-Z' 'a-z')" in
  portable | generic) allowed="" ;;
  avx2) allowed=" avx avx2 fma f16c bmi2 " ;;
  avxvnni | avx-vnni | vnni) allowed=" avx avx2 fma f16c bmi2 avx_vnni " ;;
  *) allowed="$cpu_flags" ;;
esac
for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
  avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
  flag=${pair%%:*} option=${pair#*:}
  if [[ "$cpu_flags" == *" $flag "* && "$allowed" == *" $flag "* ]]; then
    isa+=("-DGGML_$option=ON")
    variant+="${variant:+-}$(echo "$option" | tr 'A-Z_' 'a-z-')"
  else
    isa+=("-DGGML_$option=OFF")
  fi
done
variant=${variant:-generic}
bin="$dir/bin-$variant"

built() {
  [ "$(cat "$bin/.stamp" 2>/dev/null)" = "$sha" ] || return 1
  for t in "${tools[@]}"; do [ -x "$bin/$t" ] || return 1; done
}
if built; then
  echo "$bin"; exit 0
fi

mkdir -p "$dir"
# cmake (and scikit-build-core, which pip needs to read the sdist's metadata) come as wheels
# into a venv of our own, so the machine needs only python3 and a C++ compiler.
venv="$root/venv"
if [ ! -x "$venv/bin/cmake" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --only-binary=:all: cmake scikit-build-core >&2 \
    || die "pip install cmake failed"
fi

archive="$dir/llama_cpp_python-$version.tar.gz"
if [ ! -f "$archive" ] || [ "$(sha256sum "$archive" | cut -d' ' -f1)" != "$sha" ]; then
  tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  # --no-build-isolation: otherwise pip would build the sdist's build requirements just to read
  # its metadata; only llama-cpp-python itself is taken as source.
  "$venv/bin/pip" download --quiet --no-deps --no-build-isolation \
    --no-binary=llama-cpp-python -d "$tmp" "llama-cpp-python==$version" >&2 \
    || die "pip download llama-cpp-python==$version failed"
  got=$(sha256sum "$tmp/llama_cpp_python-$version.tar.gz" | cut -d' ' -f1)
  [ "$got" = "$sha" ] || die "sha256 mismatch for llama-cpp-python==$version: expected $sha, got $got"
  mv "$tmp/llama_cpp_python-$version.tar.gz" "$archive"
fi

src="$dir/src"
if [ ! -f "$src/CMakeLists.txt" ]; then
  rm -rf "$src" "$dir/.unpack"
  mkdir -p "$dir/.unpack"
  tar xzf "$archive" -C "$dir/.unpack" "llama_cpp_python-$version/vendor/llama.cpp"
  mv "$dir/.unpack/llama_cpp_python-$version/vendor/llama.cpp" "$src"
  rm -rf "$dir/.unpack"
fi

build="$dir/build-$variant"
"$venv/bin/cmake" -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF "${isa[@]}" \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >&2
# One tool at a time, the benchmark's first: llama-server is the slowest to compile.
for t in "${tools[@]}"; do
  "$venv/bin/cmake" --build "$build" --config Release -j "${JOBS:-$(nproc)}" --target "$t" >&2
done

mkdir -p "$bin"
for t in "${tools[@]}"; do
  [ -x "$build/bin/$t" ] || die "$t was not built"
  cp "$build/bin/$t" "$bin/$t"
done
echo "llama.cpp of llama-cpp-python==$version, CPU variant $variant: ${isa[*]}" >"$bin/build-flags.txt"
echo "$sha" >"$bin/.stamp"
echo "$bin"
