#!/usr/bin/env bash
# The builder's device checks in one run of at most 10 minutes on one GPU (a lent GPU comes with 15 minutes in all):
#   1. the group-size sweep in fp32, TF32 and bf16 (`bench_builders.py --sweep`), with the `paper` preset's
#      GPU-hours per task at the best rate of each;
#   2. bf16 proven on the device: the `mini` zoo built in fp32 and in bf16, the same runs' test accuracies compared;
#   3. a whole `wide` zoo built on the device, timed.
# Usage: bash benchmarks/gpu_checks.sh [OUT]      (OUT defaults to $OUT or ./gpu-checks; DEVICE=cuda by default)
# On a CPU (to check the script): DEVICE=cpu bash benchmarks/gpu_checks.sh runs the same steps cut down.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-checks}}
device=${DEVICE:-cuda}
mkdir -p "$out"
if [ "$device" = cpu ]; then
    sizes="2 4"; small=tiny; large=tiny; repeats=1
else
    sizes="256 1024 4096"; small=mini; large=wide; repeats=1
fi
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU')"
echo "== 1. group-size sweep"
python benchmarks/bench_builders.py --device "$device" --sweep --repeats "$repeats" --group-sizes $sizes \
    --precisions fp32 tf32 bf16 2>&1 | tee "$out/sweep.txt"
echo "== 2. bf16 against fp32 on the same runs ($small)"
for precision in fp32 bf16; do
    /usr/bin/time -f "$precision build: %e s wall, %M KiB peak host RSS" stz build --task mnist --preset "$small" \
        --out "$out/$precision" --device "$device" --precision "$precision" --no-progress > "$out/build-$small-$precision.log"
done
python benchmarks/compare_precisions.py "$out/fp32" "$out/bf16" --config "mnist-$small" | tee "$out/precisions.txt"
echo "== 3. a whole $large zoo on $device"
/usr/bin/time -f "$large build: %e s wall, %M KiB peak host RSS" stz build --task mnist --preset "$large" \
    --out "$out/zoos" --device "$device" --no-progress > "$out/build-$large.log"
tail -1 "$out/build-$large.log"
