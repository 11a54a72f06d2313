#!/bin/sh
# The profiling runs of experiments/results/profiles/README.md, from the repository root:
#   experiments/results/profiles/run_all.sh sink    # ~5 min
#   experiments/results/profiles/run_all.sh pipe
set -e
P=experiments/results/profiles
export ALIGNER_RESULTS=$PWD/$P/json   # the benchmarks' JSON goes here, not to experiments/results/
mkdir -p $ALIGNER_RESULTS
SPY=".venv/bin/py-spy record -r 200 --subprocesses"
SINK="-m experiments.bench_sink --rounds 7 --records 300000"
PIPE="-m experiments.bench_pipeline --records 200000 --rounds 3"
run() { # output file, py-spy options, benchmark
  date -u +"%H:%M:%S $1 start"
  $SPY $2 -o $P/$1 -- .venv/bin/python $3 > $P/$1.log 2>&1
  date -u +"%H:%M:%S $1 done"
  for j in $ALIGNER_RESULTS/bench_*.json; do mv "$j" "$P/json/$1.$(basename $j)"; done
}
case "$1" in
  # wall time (--idle keeps samples of blocked threads), active time (py-spy's default), flame graph
  sink) run sink-wall.txt "--idle -f raw" "$SINK"; run sink-cpu.txt "-f raw" "$SINK"; run sink-cpu.svg "-f flamegraph" "$SINK" ;;
  pipe) run pipeline-wall.txt "--threads --idle -f raw" "$PIPE"; run pipeline-cpu.txt "--threads -f raw" "$PIPE"
        run pipeline-cpu.svg "-f flamegraph" "$PIPE" ;;
esac
