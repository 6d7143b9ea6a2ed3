#!/usr/bin/env bash
# The GPU run of prefill-tma-states.patch (README.md here). Expects bins.tar.xz beside it holding
# bins_main/ and bins_new/ (each: mamba2ssd and mamba2ssd_gpu_tests, built for sm_90a from main and
# from main with the patch). Modes: tests (the branch's prefill, intermediates, consistency and
# forward GPU tests), san (racecheck and memcheck on three prefill calls), timing (CLI prefill
# main | new | new | main on five mixes and one with intermediate states), all (the three).
set -u
exec > >(tee -a $OUT/log.txt) 2>&1
D=$(dirname "$0")
[ -d $D/bins_new ] || (cd $D && tar xJf bins.tar.xz)
M=$D/bins_main; N=$D/bins_new
. $D/mixes.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mode=${1:-all}
if [ "$mode" = all ] || [ "$mode" = tests ]; then
  echo "== branch gpu tests (prefill, intermediates, consistency, forward)"
  start=$(date +%s)
  $N/mamba2ssd_gpu_tests --gtest_filter='*Prefill*:*Intermediates*:*Consistency*:*ForwardCuda*:-*ForwardCudaLong*' \
    --gtest_brief=1 2>&1 | grep -v "^  prefill\|^  consist" | tail -20
  echo "tests took $(( $(date +%s) - start )) s"
fi
if [ "$mode" = all ] || [ "$mode" = san ]; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  for tool in racecheck memcheck; do
    for args in "--state-dtype fp32 --state-every 128 --seqlens 300,129,0,640,17 --heads 4 --dstate 80" \
                "--headdim 128 --dstate 256 --state-dtype bf16 --seqlens 200,64,1,333 --heads 2 --pads 1 --state-every 128" \
                "--headdim 32 --dstate 48 --dtype fp16 --state-dtype fp16 --seqlens 900,700,500 --heads 3 --segments 3 --state-every 128"; do
      echo "-- $tool $args"
      timeout 60 $CS --tool $tool $N/mamba2ssd prefill --impl cuda --repeats 1 $args < /dev/null 2>&1 |
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|result" | head -4
    done
  done
fi
if [ "$mode" = all ] || [ "$mode" = timing ]; then
  echo "== CLI prefill, main | new | new | main (median of 20)"
  for row in "chat32K_P128N256 fp32" "chat32K_P128N256 bf16" "chat16K fp32" "chat64K fp32" "doc64K bf16" \
             "chat16K fp32 --state-every 256"; do
    set -- $row; mix=$1; cache=$2; shift 2
    eval "shape=\$MIX_$mix"
    line="$mix $cache $*:"
    for b in $M $N $N $M; do
      t=$($b/mamba2ssd prefill --impl cuda --no-check --repeats 20 --state-dtype $cache $shape "$@" < /dev/null 2>&1 |
          grep -E "^  time" | head -1)
      line="$line | $(echo $t | grep -oE '[0-9.]+ (us|ms)' | head -1)"
    done
    echo "$line"
  done
fi
