#!/usr/bin/env bash
# Libra device check: one prepared script for a single CUDA GPU, at most ~8 minutes, one table at the end.
#
#   bash bench/device_check.sh              # on the GPU node (DEVICE=cuda)
#   DEVICE=cpu bash bench/device_check.sh   # dry run of every python part on CPU (no gpu tests)
#
# Steps (each with its own time limit; the limits add up to 470 s):
#   1. model    build a small Qwen-style model in memory and save it     (python -m engine.runtime.devcheck model)
#   2. gpu      the `gpu`-marked tests                                   (pytest -m gpu)
#   3. rollout  rollout speed on the device                              (python -m bench.rollout if it takes
#               --device, else python -m engine.runtime.devcheck rollout: bench.rollout has been CPU-only)
#   4. trainer  trainer speed on the device                              (same rule for bench.trainer)
#   5. run      a real 2-step run with 2 worker ranks on the one GPU: --system static keeps training on
#               one rank (FSDP/TP need one rank per GPU); the two ranks' weight sync goes over gloo
#   6. export   the run's policy as a Hugging Face directory, loaded back
# Env knobs: PYTHON (default .venv/bin/python, else python3), DEVICE (cuda), WORK (a temp dir).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
DEVICE=${DEVICE:-cuda}
WORK=${WORK:-$(mktemp -d /tmp/libra-device-check.XXXXXX)}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo} TOKENIZERS_PARALLELISM=false
mkdir -p "$WORK/logs"
ROWS=()
START=$SECONDS

# run NAME LIMIT_S CMD...: run a step under a time limit, keep its log, add a table row (status, seconds, headline)
run() {
  local name=$1 limit=$2; shift 2
  local log="$WORK/logs/$name.log" t0=$SECONDS rc status
  echo "[device_check] $name: $*" >&2
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status="TIMEOUT(${limit}s)" ;;
    *) status="FAIL(rc=$rc)" ;;
  esac
  local headline
  headline=$(grep -E '^[a-z_]+: [-0-9.eE+na]+$|passed|failed|skipped|error' "$log" | tail -1)
  ROWS+=("$name|$status|$((SECONDS - t0))|${headline:0:70}")
  [ "$status" = ok ] || tail -20 "$log" >&2
  return $rc
}

# whether a bench module declares --device: read from its source (asking its --help imports torch: ~2 s each)
takes_device() { grep -q -- 'add_argument("--device"' "$(echo "$1" | tr . /).py" 2>/dev/null; }

echo "[device_check] python $PY, device $DEVICE, work dir $WORK" >&2
"$PY" - "$DEVICE" <<'EOF' >&2
import sys, torch
want = sys.argv[1]
print(f"[device_check] torch {torch.__version__}, cuda available: {torch.cuda.is_available()}"
      + (f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
if want == "cuda" and not torch.cuda.is_available():
    sys.exit("[device_check] DEVICE=cuda but torch sees no CUDA device; install a CUDA torch, or DEVICE=cpu for a dry run")
EOF
[ $? -eq 0 ] || exit 1

MODEL="$WORK/small-qwen"
run model 20 "$PY" -m engine.runtime.devcheck model --out "$MODEL"

if [ "$DEVICE" = cpu ]; then
  ROWS+=("gpu|skip|0|dry run on CPU: the gpu-marked tests need CUDA")
else
  run gpu 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests
fi

if takes_device bench.rollout; then
  run rollout 60 "$PY" -m bench.rollout --device "$DEVICE" --model "$MODEL" --rounds 1
else
  run rollout 60 "$PY" -m engine.runtime.devcheck rollout --device "$DEVICE" --model "$MODEL"
fi
if takes_device bench.trainer; then
  run trainer 60 "$PY" -m bench.trainer --device "$DEVICE" --models "$MODEL"
else
  run trainer 60 "$PY" -m engine.runtime.devcheck trainer --device "$DEVICE" --model "$MODEL"
fi

RUN="$WORK/run"
run run 150 "$PY" libra.py --model "$MODEL" --device "$DEVICE" --nproc 2 --system static --bench toy --steps 2 \
  --num-tasks 8 --rollout.max-new-tokens-per-turn 32 --rollout.max-turns 2 --out "$RUN"
if [ -f "$RUN/summary.json" ]; then
  "$PY" - "$RUN/summary.json" >>"$WORK/logs/run.log" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"run_tokens_per_s: {s['tokens_per_s']:.1f}")
EOF
  ROWS[${#ROWS[@]}-1]=$(echo "${ROWS[${#ROWS[@]}-1]}" | cut -d'|' -f1-3)"|$(tail -1 "$WORK/logs/run.log")"
  run export 30 "$PY" -c "
import sys, libra
from transformers import AutoModelForCausalLM
assert libra.main(['export', '$RUN', '--to', '$WORK/export']) == 0
m = AutoModelForCausalLM.from_pretrained('$WORK/export')
print('export_params:', sum(p.numel() for p in m.parameters()))"
else
  ROWS+=("export|skip|0|no summary.json from the run")
fi

echo
printf '%-8s %-16s %6s  %s\n' check status sec result
printf '%-8s %-16s %6s  %s\n' -------- ---------------- ------ ----------------------------------------------------------------------
for row in "${ROWS[@]}"; do
  IFS='|' read -r name status sec headline <<<"$row"
  printf '%-8s %-16s %6s  %s\n' "$name" "$status" "$sec" "$headline"
done
echo "total $((SECONDS - START)) s on $DEVICE; logs in $WORK/logs"
failed=$(printf '%s\n' "${ROWS[@]}" | cut -d'|' -f2 | grep -vc -E '^(ok|skip)$')
echo "device_check_failed: $failed"
[ "$failed" -eq 0 ]
