#!/bin/bash
# Everything a machine with a CUDA device should check, in one go (a lent GPU is short-lived):
#
#     bash benchmarks/gpu_check.sh OUTDIR [MOLECULE]        # MOLECULE: an xyz stem, default water20
#     STEPS=34 bash benchmarks/gpu_check.sh OUTDIR          # only steps 3 and 4 (default 1234)
#
# 1. the tests of tests/test_device.py (the CUDA-marked ones run here);
# 2. the whole suite with the GPU visible (device="auto" takes it), with pytest-xdist when present;
# 3. benchmarks/gpu.py on MOLECULE: the MP2 step on the device, on the host and by PySCF;
# 4. the host path's MP2 step on 2, 4, 8 and all cores (one SCF, restarted from a chkfile), to
#    show how far the host pair step scales (on 16 cores of an H200 machine it ran at 0.24 TFLOP/s);
# 5. (only when asked: STEPS=5) the whole job on the host's cores, the GPU hidden: the end-to-end
#    harness (benchmarks/run.py --e2e, dfmp2 run against PySCF's DF-SCF + DF-MP2 with its
#    OpenBLAS on Haswell kernels, fp64 and mixed SCF, 3 repetitions) on each of E2E (default
#    "water16 C20H42"), one molecule per harness call, all into OUTDIR/e2e-host.{md,json};
# 6. (only when asked: STEPS=6) the SCF's J/K build by thread count, its lanes against its one
#    pass (benchmarks/jk_threads.py on E2E's molecules, into OUTDIR/jk-threads.{md,json}).
#
# Needs dfmp2 installed with its test extras and PySCF. The lent machines' image has torch
# (CUDA), numpy, scipy, h5py, click, pytest, pytest-xdist and matplotlib, not PySCF nor
# qcelemental, and cannot download: carry them as wheels in .whl/ (git-ignored), fetched here
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#         -d .whl pyscf==2.14.0 qcelemental==0.51.4 qcengine==0.52.0 pydantic==2.13.4 \
#         pydantic_core==2.46.4 pydantic-settings==2.14.1 python-dotenv==1.2.2 Pint==0.25.3 \
#         flexcache==0.3 flexparser==0.4 platformdirs==4.14.7 annotated-types==0.7.0 \
#         typing-inspection==0.4.2
# (55 MB), and start the call (carry: .whl) with
#     python3 -m pip install -q --no-index --no-deps .whl/*.whl &&
#     python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
# The whole script keeps to BUDGET seconds (default 540, to fit a 10-minute call); each step has
# its own limit within what is left, so one slow step does not take the others' time. Logs,
# results and a summary go to OUTDIR. Stop 43 ran it in 476 s on an H200 machine: step 1 92 s,
# step 2 cut at its 240 s (the suite under xdist needs about 250 s on 16 cores, its slowest
# test 168 s), step 3 about 60 s, step 4 the rest (16 and 8 threads).
set -u
out=${1:?usage: bash benchmarks/gpu_check.sh OUTDIR [MOLECULE]}
molecule=${2:-water20}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
cores=$(python3 -c "import os; print(len(os.sched_getaffinity(0)))")
steps=${STEPS:-1234}
step() { [[ $steps == *$1* ]]; }
deadline=$((SECONDS + ${BUDGET:-540}))
# run_for S CMD...: CMD for at most S seconds and what is left of the budget; skipped (status
# 124, as a timeout) when under 20 s are left
run_for() {
    local left=$((deadline - SECONDS)) cap=$1
    shift
    if ((left < 20)); then echo "skipped: the budget is spent: $*"; return 124; fi
    timeout "$((left < cap ? left : cap))" "$@"
}

if step 1; then
echo "== 1. device tests"
run_for 120 python3 -m pytest -q -p no:cacheprovider -rs tests/test_device.py \
    > "$out/device_tests.log" 2>&1
echo "rc $?: $(tail -1 "$out/device_tests.log")"
fi

if step 2; then
echo "== 2. the suite with the GPU visible"
workers=()
python3 -c "import xdist" 2>/dev/null && workers=(-n "$((cores > 2 ? cores - 1 : 1))")
run_for 300 env OMP_NUM_THREADS=1 python3 -m pytest -q -p no:cacheprovider -rf \
    ${workers[@]+"${workers[@]}"} \
    > "$out/suite.log" 2>&1
echo "rc $?: $(tail -1 "$out/suite.log")"
grep '^FAILED' "$out/suite.log" | head -40
fi

if step 3; then
echo "== 3. benchmarks/gpu.py --molecules $molecule"
run_for 150 python3 benchmarks/gpu.py --molecules "$molecule" --max-memory 32000 \
    --name "gpu-check-$molecule" > "$out/gpu.log" 2>&1
echo "rc $?"
cp "benchmarks/results/gpu-check-$molecule".{json,md} "$out/" 2>/dev/null && \
    rm -f "benchmarks/results/gpu-check-$molecule".{json,md}
tail -8 "$out/gpu.log"
fi

if step 4; then
echo "== 4. the host's MP2 step by thread count"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
xyz=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from run import find_xyz, \
molecule_dirs; print(find_xyz('$molecule', molecule_dirs()))")
counts=$(printf '%s\n' "$cores" 8 4 2 | awk -v c="$cores" '$1 <= c && !seen[$1]++')
for threads in $counts; do  # all cores first: its run converges the SCF for the others
    run_for 120 env OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" \
        MKL_NUM_THREADS="$threads" python3 -m dfmp2 run "$xyz" --device cpu \
        --chkfile "$scratch/scf.chk" --json "$out/host-$threads.json" -q \
        > "$out/host-$threads.log" 2>&1 \
        || echo "threads $threads: rc $? ($(tail -1 "$out/host-$threads.log"))"
done
python3 - "$out" "$cores" <<'EOF'
import json, sys
from pathlib import Path

out, cores = Path(sys.argv[1]), int(sys.argv[2])
print("| threads | transform s | fit s | pair s | pair GFLOP/s | BLAS |")
print("|---|---|---|---|---|---|")
for threads in sorted(t for t in {cores, 8, 4, 2} if t <= cores):
    path = out / f"host-{threads}.json"
    if not path.exists():
        continue
    extras = json.loads(path.read_text())["extras"]
    t, s = extras["timings"], extras["sizes"]
    flops = s["nocc"] * (s["nocc"] + 1) * s["nvir"] ** 2 * s["naux"]  # o(o+1)/2 * 2 v^2 X
    print(f"| {threads} | {t['transform']:.2f} | {t['fit']:.2f} | {t['pair_energy']:.2f} | "
          f"{flops / t['pair_energy'] / 1e9:.0f} | {extras['backend']['cpu_blas']['choice']} |")
EOF
fi

if step 5; then
echo "== 5. the whole job on the host's cores against PySCF, the GPU hidden"
for name in ${E2E:-water16 C20H42}; do  # one harness call each: a cut one keeps the others
    append=()
    [[ -f $out/e2e-host.json ]] && append=(--append)
    run_for 240 env CUDA_VISIBLE_DEVICES= python3 benchmarks/run.py --no-ladder --e2e "$name" \
        --e2e-scf-precisions fp64,mixed --coretypes pyscf-Haswell --repeat 3 --timeout 200 \
        --name e2e-host --out-dir "$out" ${append[@]+"${append[@]}"} > "$out/e2e-$name.log" 2>&1
    echo "$name: rc $?"
done
[[ -f $out/e2e-host.md ]] && grep -A8 -i "end to end" "$out/e2e-host.md" | head -30
fi

if step 6; then
echo "== 6. the SCF's J/K build by thread count"
mols=${E2E:-water16 C20H42}
run_for 300 env CUDA_VISIBLE_DEVICES= python3 benchmarks/jk_threads.py --molecules "${mols// /,}" \
    --name jk-threads --out-dir "$out" > "$out/jk-threads.log" 2>&1
echo "rc $?"
grep "^|" "$out/jk-threads.md" 2>/dev/null
fi
