#!/usr/bin/env bash
# Replays the seed corpus under the naive, lazy and eager (4 workers)
# policies: every input must run cleanly and give the same digest of values
# and errors under all three.
set -euo pipefail
replay=$1
[[ $replay == */* ]] || replay=./$replay
corpus=$2
files=("$corpus"/*)
LAZYDAG_ENGINE=naive "$replay" "${files[@]}" > naive.txt
LAZYDAG_ENGINE=lazy "$replay" "${files[@]}" > lazy.txt
LAZYDAG_ENGINE=eager LAZYDAG_NUM_THREADS=4 "$replay" "${files[@]}" > eager.txt
diff naive.txt lazy.txt
diff naive.txt eager.txt
echo "fuzz corpus: ${#files[@]} programs, 3 policies, 0 mismatches"
