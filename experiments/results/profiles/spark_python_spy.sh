#!/bin/bash
# attach one py-spy (with --subprocesses) to every Python process the Spark JVM starts
dir=$1; mkdir -p $dir; seen=" "
while [ -e /tmp/prof/spying ]; do
  jvm=$(pgrep -f "java.*pyspark" | head -1)
  if [ -n "$jvm" ]; then
    for c in $(pgrep -P $jvm); do
      case "$seen" in *" $c "*) continue;; esac
      seen="$seen$c "
      name=$(tr '\0' ' ' < /proc/$c/cmdline | awk '{print $NF}' | tr '/.' '__')
      (/work/main/.venv/bin/py-spy record --subprocesses --pid $c --rate 50 --format raw -o $dir/$c-$name.txt > $dir/$c.log 2>&1 &)
    done
  fi
  sleep 0.1
done
