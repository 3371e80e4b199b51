#!/usr/bin/env bash
# `make test`: run every stage of the test suite, even after one fails, print
# each stage's time and result as it ends and a summary at the end, and exit
# non-zero if any stage failed. A newcomer whose first stage fails still
# learns whether the others pass.
#
# The stages are make targets (see the Makefile): tools (the pinned code
# generators, built once into .bin: about 10 minutes the first time), lint,
# check-generated, unit (every go test with -race), cluster (the exactness
# tests on a ClickHouse cluster), deploy (the deployment files) and fuzz.
# STAGES (environment) picks some of them, for example STAGES="lint unit".
set -uo pipefail
cd "$(dirname "$0")/.."

stages=${STAGES:-tools lint check-generated unit cluster deploy fuzz}
names=() results=() times=()
failed=0 tools_failed=0
start_all=$SECONDS

for stage in $stages; do
  # Without the generators lint and check-generated cannot run: say so
  # rather than building them again inside each stage.
  if [[ $stage == lint || $stage == check-generated ]] && [ $tools_failed = 1 ]; then
    names+=("$stage") results+=("not run (tools failed)") times+=(0)
    failed=1
    continue
  fi
  printf '\n=== stage %s\n' "$stage"
  t0=$SECONDS
  make --no-print-directory "test-stage-$stage"
  rc=$?
  dt=$((SECONDS - t0))
  if [ $rc = 0 ]; then res=ok; else res="FAILED (exit $rc)"; failed=1; [ "$stage" = tools ] && tools_failed=1; fi
  names+=("$stage") results+=("$res") times+=("$dt")
  printf '=== stage %s: %s in %dm%02ds\n' "$stage" "$res" $((dt / 60)) $((dt % 60))
done

total=$((SECONDS - start_all))
printf '\n=== make test summary\n'
for i in "${!names[@]}"; do
  printf '  %-16s %-24s %3dm%02ds\n' "${names[$i]}" "${results[$i]}" $((times[i] / 60)) $((times[i] % 60))
done
printf '  %-16s %-24s %3dm%02ds\n' total "$([ $failed = 0 ] && echo ok || echo FAILED)" $((total / 60)) $((total % 60))
exit $failed
