#!/bin/bash
out=$1; : > $out
while [ -e /tmp/prof/sampling ]; do
  pid=$(pgrep -f "java.*pyspark" | head -1)
  if [ -n "$pid" ]; then
    { echo "T $(date +%s.%N)"; for t in /proc/$pid/task/*; do
        s=$(cat $t/stat 2>/dev/null) || continue
        c=$(cat $t/comm 2>/dev/null)
        rest=${s##*) }; set -- $rest
        echo "$(basename $t) ${12} ${13} $c"
      done; } > $out.tmp && mv $out.tmp $out
  fi
  sleep 1
done
