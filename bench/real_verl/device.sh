#!/usr/bin/env bash
# Run ON the GPU machine (device tool), from the repository root, with .whl and .verl_src
# carried (bench/real_verl/prepare.sh makes them here):
#
#   bash bench/real_verl/device.sh [CASES] [DEADLINE_S]
#
# CASES: comma-separated names from bench/real_verl/cases.py (default: all, in their order);
# DEADLINE_S: seconds for all cases (default 520); a case that would not fit is skipped.
# Results: $OUT/real_verl.tar.gz (rewritten after each case) and $OUT/device.log.
set -u
CASES=${1:-}
DEADLINE=${2:-520}
OUT=${OUT:-/tmp/verl_real_out}
mkdir -p "$OUT" /tmp/verl_real/runs
exec > >(tee -a "$OUT/device.log") 2>&1
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH RAY_USAGE_STATS_ENABLED=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 - <<'EOF'
import importlib
for m in ("ray", "hydra", "omegaconf", "tensordict", "torchdata", "datasets", "codetiming",
          "bcrypt", "pandas", "numpy", "prometheus_client", "pynvml", "psutil", "yaml", "torch",
          "transformers"):
    mod = importlib.import_module(m)
    print(m, getattr(mod, "__version__", "?"), end="; ")
print()
EOF
which py-spy && py-spy --version
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "install: $(( $(date +%s) - t0 )) s"
# only the model sizes the cases use (cases.py: Case.model)
MODELS=$(cd bench/real_verl && python3 -c "import cases, sys; print(cases.models(sys.argv[1]))" "$CASES")
python3 bench/real_verl/setup_job.py --out /tmp/verl_real --models "$MODELS" > /tmp/verl_real/runs/setup.log 2>&1 \
  || { tail -30 /tmp/verl_real/runs/setup.log; exit 1; }
tail -3 /tmp/verl_real/runs/setup.log
echo "setup: $(( $(date +%s) - t0 )) s"
left=$(( DEADLINE - ($(date +%s) - t0) ))
python3 bench/real_verl/run_cases.py --work /tmp/verl_real --out "$OUT" --deadline "$left" \
  ${CASES:+--cases "$CASES"}
echo "device.sh total: $(( $(date +%s) - t0 )) s"
