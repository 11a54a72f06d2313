#!/bin/bash
cd /work/main
ALIGNER_RESULTS=/tmp/prof timeout 1500 .venv/bin/python -m experiments.bench_spark_hop --minutes 7 > /tmp/hop26-ps.log 2>&1 &
for w in 70 130 370 430; do
  sleep $(( w - ${prev:-0} )); prev=$w
  ps -eo pid=,times=,rss=,args= | awk -v t=$w '{printf "%s %s %s %s", t, $1, $2, $3; for(i=4;i<=NF && i<8;i++) printf " %s", substr($i,1,70); print ""}' > /tmp/prof/hopps-$w.txt
done
wait
echo DONE >> /tmp/hop26-ps.log
