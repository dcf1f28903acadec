#!/bin/bash
# Where the tensor-core decode kernel's instructions go, in one device call: build bench_decode_attn,
# dump the SASS of the decode kernels it profiles (cuobjdump), and run Nsight Compute over one launch
# of each case with the sections that say what binds (speed of light, pipes, scheduler, warp states,
# instruction mix) plus the executed count of every SASS opcode; then the batch-1 rows with their
# launch floor. From the repository root on the GPU machine:
#
#   bench/cuda/ncu_decode_device_run.sh ASSETS OUT
#
# ASSETS holds xxhash/{include,lib} (a machine without the package). OUT gets r.tgz: the build log,
# sass_<kernel>.txt, ncu_<case>.txt (details) and ncu_<case>_ops.txt (per-opcode counts), b1.json.
# CASES (default "int8:32768:16 q4_0:32768:16 k8v4:32768:16 int8:32768:1") picks the profiled
# format:context:batch cases; BUILD reuses a configured tree.
set -u
A=$(cd "${1:?usage: bench/cuda/ncu_decode_device_run.sh ASSETS OUT}" && pwd)
OUT=${2:?usage: bench/cuda/ncu_decode_device_run.sh ASSETS OUT}
mkdir -p "$OUT/r"; R=$(cd "$OUT/r" && pwd)
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0))s]"; }
XX=("-DCMAKE_CXX_FLAGS=-I$A/xxhash/include -DXXH_INLINE_ALL" "-DCMAKE_EXE_LINKER_FLAGS=-L$A/xxhash/lib")
B=${BUILD:-build-ncu}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; ncu --version | tail -1; } | tee "$R/device.txt"
echo "== build bench_decode_attn $(el)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real -DKVGATE_BUILD_BENCH=ON "${XX[@]}" \
  > "$R/build.log" 2>&1 && ninja -C $B -j16 bench_decode_attn >> "$R/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A3 "$R/build.log" | head -40; cd "$OUT" && tar czf r.tgz r; exit 1; }
BD=$(find $B/bench -name bench_decode_attn -type f | head -1)

echo "== SASS of the profiled decode kernels $(el)"
# decode_mma_kernel<K, V, 128>: int8 = 3, q4_0 = 7 (kvgate/format_list.hpp order); every object of
# the binary, the kernels picked by their mangled names.
cuobjdump -sass "$BD" > "$R/sass_all.txt" 2>&1
python3 - "$R/sass_all.txt" "$R" <<'EOF'
import re, sys
txt = open(sys.argv[1]).read()
for part in re.split(r"\n(?=\s*Function : )", txt):
    m = re.match(r"\s*Function : (\S+)", part)
    if not m or "decode_mma_kernel" not in m.group(1) or "Li128E" not in m.group(1):
        continue
    k = re.search(r"HalfFormatE(\d+)ELS3_(\d+)ELi128", m.group(1))
    if k and (k.group(1), k.group(2)) in {("3", "3"), ("7", "7"), ("3", "7"), ("6", "6")}:
        open(f"{sys.argv[2]}/sass_{k.group(1)}_{k.group(2)}.txt", "w").write(part)
EOF
rm -f "$R/sass_all.txt"; ls "$R"/sass_* 2>/dev/null

for c in ${CASES:-int8:32768:16 q4_0:32768:16 k8v4:32768:16 int8:32768:1}; do
  IFS=: read -r f ctx bt <<< "$c"
  echo "== ncu $f ${ctx}x$bt $(el)"
  timeout 240 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
    --section WarpStateStats --section InstructionStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --metrics smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_short_scoreboard,smsp__pcsamp_warps_issue_stalled_wait,smsp__pcsamp_warps_issue_stalled_math_pipe_throttle,smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_membar,smsp__pcsamp_warps_issue_stalled_mio_throttle,smsp__pcsamp_warps_issue_stalled_lg_throttle,smsp__pcsamp_warps_issue_stalled_not_selected,smsp__pcsamp_warps_issue_stalled_selected,smsp__pcsamp_warps_issue_stalled_dispatch_stall,smsp__pcsamp_warps_issue_stalled_no_instructions,smsp__pcsamp_warps_issue_stalled_branch_resolving \
    -k regex:"decode_(mma|fast)" --launch-skip 3 --launch-count 1 \
    "$BD" --formats "$f" --contexts "$ctx" --batches "$bt" --reps 1 --out /tmp/ncu_bench.json > "$R/ncu_${f}_${ctx}x$bt.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|highest-utilized|No Eligible|Achieved Occupancy|Executed Instructions  " "$R/ncu_${f}_${ctx}x$bt.txt" | head -12
  timeout 180 ncu --clock-control none --metrics sass__inst_executed_per_opcode,smsp__inst_executed.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_fmaheavy.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_pipe_tensor.sum,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_adu.sum,smsp__inst_executed_pipe_cbu.sum,smsp__inst_executed_pipe_uniform.sum \
    --print-metric-instances details -k regex:"decode_(mma|fast)" --launch-skip 3 --launch-count 1 \
    "$BD" --formats "$f" --contexts "$ctx" --batches "$bt" --reps 1 --out /tmp/ncu_bench.json > "$R/ncu_${f}_${ctx}x${bt}_ops.txt" 2>&1
  grep -E "inst_executed" "$R/ncu_${f}_${ctx}x${bt}_ops.txt" | cut -c1-400 | head -14
done

echo "== batch 1 with the launch floor $(el)"
timeout 150 "$BD" --formats int8,fp8,q4_0,k8v4,bf16 --contexts 4096,32768,131072 --batches 1 --reps 200 --out "$R/b1.json" \
  > "$R/b1.txt" 2>&1
grep -v store "$R/b1.txt" | tail -18
echo "== done $(el)"
cd "$OUT" && tar czf r.tgz r && rm -rf r
