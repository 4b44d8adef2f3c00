#!/bin/sh
# dist.rank_death: runs rank_death.py on 2 ranks and passes when the job
# fails promptly (mpirun aborts the ranks left waiting once one dies)
# instead of hanging or completing. Arguments: the mpirun command line up
# to and including the python interpreter; the script path is appended.
out=$(timeout 120 "$@" "$(dirname "$0")/rank_death.py" 2>&1)
rc=$?
echo "$out" | tail -5
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "FAIL: the job hung after a rank died"; exit 1; fi
if [ $rc -eq 0 ]; then echo "FAIL: the job succeeded without a rank"; exit 1; fi
case "$out" in *"allreduce returned"*) echo "FAIL: the allreduce completed without rank 1"; exit 1 ;; esac
echo "ok: the job ended with status $rc after a rank died"
