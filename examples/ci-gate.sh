#!/usr/bin/env bash
# Steady as a CI gate: submit a study spec, wait for its runs, and pass or fail the job on its verdicts.
#
#   examples/ci-gate.sh SPEC [OUT_DIR]
#
# The server and token come from STEADY_SERVER / STEADY_TOKEN (or `steady login`). Set STEADY_AGAINST=SUITE
# to also compare the study with that suite's baseline. Writes OUT_DIR/junit.xml (for the CI's test report)
# and OUT_DIR/summary.md. Exit code: 0 passed, 1 a check failed, 2 inconclusive (too few runs to claim
# anything), 3 could not judge (a missing or invalid spec, a wrong study id, the server unreachable or
# refusing the token, the study cancelled: no verdict and no report files); set STEADY_INCONCLUSIVE_OK=1
# to let an inconclusive study pass the job (never one that could not be judged).
set -u

spec=${1:?usage: ci-gate.sh SPEC [OUT_DIR]}
out=${2:-steady-results}
mkdir -p "$out"

args=(check "$spec" --junit "$out/junit.xml" --markdown "$out/summary.md")
if [ -n "${STEADY_AGAINST:-}" ]; then
    args+=(--against "$STEADY_AGAINST")
fi

steady "${args[@]}"
status=$?

case $status in
    0) echo "steady gate: passed" ;;
    1) echo "steady gate: FAILED (see $out/junit.xml)" ;;
    2) echo "steady gate: inconclusive: more runs are needed for a verdict (see $out/summary.md)"
       if [ "${STEADY_INCONCLUSIVE_OK:-0}" = 1 ]; then
           status=0
       fi ;;
    3) echo "steady gate: could not judge the study: no verdict (see the error above: spec, study id, server" \
            "or token)" ;;
    *) echo "steady gate: steady check stopped (exit $status)" ;;
esac
exit "$status"
