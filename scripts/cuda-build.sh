#!/usr/bin/env bash
# Builds `whale` with `--features cuda` on a machine with no GPU and no CUDA toolkit. Opt-in; CI
# never runs it (30 minutes on 2 busy cores from a cold target directory, 1 to 3 minutes after a
# change to whale's own crates).
#
#   scripts/cuda-build.sh            # prints the binary's path on its last line
#   WHALE_CUDA_ARCH=80 scripts/cuda-build.sh
#
# The toolkit is CUDA 13.0 from PyPI wheels, in a venv outside the repository
# (${WHALE_CUDA_VENV:-~/.cache/whale-venvs/cuda}, about 1.3 GB): nvcc, cudafe++, ptxas, fatbinary
# (nvidia-cuda-nvcc), cicc (nvidia-nvvm, pinned too: nvcc 13.0 refuses the PTX a newer cicc
# writes), the headers (nvidia-cuda-crt, -cccl, -runtime), and the libraries the binary links
# (nvrtc, cuBLAS, cuRAND, cudart). Why 13.0: candle 0.11's cudarc 0.19 knows CUDA 11.4 to 13.4 (it
# refuses nvcc 13.5, the newest wheel), the CUDA 12 wheels have no nvcc, and candle loads its
# kernels as PTX, which a driver JIT-compiles only if it is at least as new as the PTX: 13.0's
# (ISA 9.0) loads on any CUDA 13 driver (r580 or newer).
# No wheel carries libcuda (the driver): the link is made against a stub built here from the
# names cudarc's driver bindings declare (each returns CUDA_ERROR_STUB_LIBRARY), with libcuda's
# soname, so that on a GPU machine the binary loads the driver's own libcuda.so.1.
# Kernels are compiled for compute capability ${WHALE_CUDA_ARCH:-90} (an H100 / H200), since no
# GPU is here to detect. The build goes to ${WHALE_CUDA_TARGET:-~/.cache/whale-cuda-target}, so the
# CPU build in target/ is not invalidated, under `nice -n 19`, one at a time (a lock file there).
# After the build the binary runs here against the stub: `whale --version`, and a run with
# device = "cuda" must be refused with the stub's error (CUDA_ERROR_STUB_LIBRARY), not crash.
# To run the binary elsewhere: LD_LIBRARY_PATH=$VENV/toolkit/lib64 (the wheels' libraries) beside
# the driver's libcuda.so.1. `scripts/cuda-build.sh --env` prints the build's environment for
# sourcing (`eval "$(scripts/cuda-build.sh --env)"`), without building.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${WHALE_CUDA_VENV:-$HOME/.cache/whale-venvs/cuda}
TARGET=${WHALE_CUDA_TARGET:-$HOME/.cache/whale-cuda-target}
ARCH=${WHALE_CUDA_ARCH:-90}
# One CUDA release, every wheel pinned to it (pip would otherwise pull the newest nvidia-nvvm).
WHEELS=(
    "nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.88" "nvidia-cuda-crt==13.0.88"
    "nvidia-cuda-cccl==13.0.85" "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-nvrtc==13.0.88"
    "nvidia-cublas==13.1.0.3" "nvidia-curand==10.4.0.35"
)
CUDARC_VERSION=13000

# The venv with the wheels, and $VENV/toolkit: lib64/ with the unversioned names the linker looks
# for, and lib64/stubs/ with the libcuda stub.
make_toolkit() {
    local marker="$VENV/toolkit/.wheels"
    if [ -x "$VENV/toolkit/lib64/stubs/libcuda.so" ] && [ "$(cat "$marker" 2>/dev/null)" = "${WHEELS[*]}" ]; then
        return 0
    fi
    [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"
    nice -n 19 "$VENV/bin/pip" install -q "${WHEELS[@]}" >&2
    local cu13
    cu13=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu13
    mkdir -p "$VENV/toolkit/lib64/stubs"
    ln -sfn "$cu13/bin" "$VENV/toolkit/bin"
    ln -sfn "$cu13/include" "$VENV/toolkit/include"
    ln -sfn "$cu13/nvvm" "$VENV/toolkit/nvvm"
    for lib in libcudart.so.13 libnvrtc.so.13 libnvrtc-builtins.so.13.0 libcublas.so.13 libcublasLt.so.13 \
        libcurand.so.10; do
        ln -sfn "$cu13/lib/$lib" "$VENV/toolkit/lib64/$lib"
        ln -sfn "$cu13/lib/$lib" "$VENV/toolkit/lib64/${lib%%.so*}.so"
    done
    # The driver's entry points as cudarc declares them (the version the build links against).
    (cd "$ROOT" && nice -n 19 cargo fetch -q)
    local version sys
    version=$(awk '/^name = "cudarc"/ { getline; gsub(/[^0-9.]/, ""); print }' "$ROOT/Cargo.lock")
    sys=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"cudarc-$version"/src/driver/sys/mod.rs | head -1)
    grep -oE '^pub unsafe fn cu[A-Za-z0-9_]+' "$sys" | sed 's/^pub unsafe fn //' | sort -u |
        awk '{ print "int " $1 "(void) { return 34; }" }' >"$VENV/toolkit/libcuda-stub.c"
    nice -n 19 gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$VENV/toolkit/lib64/stubs/libcuda.so" \
        "$VENV/toolkit/libcuda-stub.c"
    ln -sfn libcuda.so "$VENV/toolkit/lib64/stubs/libcuda.so.1"
    "$VENV/toolkit/bin/nvcc" --version | grep -q 'release 13.0' || {
        echo "cuda-build: $VENV/toolkit/bin/nvcc is not CUDA 13.0" >&2
        exit 1
    }
    echo "${WHEELS[*]}" >"$marker"
}

environment() {
    cat <<EOF
export CUDA_HOME=$VENV/toolkit
export NVCC=$VENV/toolkit/bin/nvcc
export PATH=$VENV/toolkit/bin:\$PATH
export CUDA_COMPUTE_CAP=$ARCH
export CUDARC_CUDA_VERSION=$CUDARC_VERSION
export CARGO_TARGET_DIR=$TARGET
EOF
}

make_toolkit
if [ "${1:-}" = "--env" ]; then
    environment
    exit 0
fi
eval "$(environment)"
mkdir -p "$TARGET"
exec 9>"$TARGET/.cuda-build.lock"
flock -n 9 || {
    echo "cuda-build: another cuda build holds $TARGET/.cuda-build.lock; waiting" >&2
    flock 9
}

cd "$ROOT"
start=$(date +%s)
nice -n 19 cargo build --release -p whale --features cuda >&2
seconds=$(($(date +%s) - start))
echo "cuda-build: built in ${seconds}s (sm_$ARCH, CUDA 13.0)" >&2

# The binary runs here against the stub: it starts, and a run on device = "cuda" is refused
# with the stub's error, naming the field, before any model is loaded or pretrained.
BIN=$TARGET/release/whale
export LD_LIBRARY_PATH=$VENV/toolkit/lib64:$VENV/toolkit/lib64/stubs
"$BIN" --version >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'name = "cuda-smoke"\n[model]\ndevice = "cuda"\n' >"$work/smoke.toml"
if refusal=$(WHALE_HOME=$work/home "$BIN" run --quiet --runs "$work/runs" "$work/smoke.toml" 2>&1) ||
    ! grep -q 'model.device = "cuda": cannot open CUDA device 0.*CUDA_ERROR_STUB_LIBRARY' <<<"$refusal"; then
    echo "cuda-build: a run on the stub driver should be refused naming model.device; it said: $refusal" >&2
    exit 1
fi
echo "cuda-build: against the stub driver, a cuda run is refused: ${refusal%%$'\n'*}" >&2
echo "$BIN"
