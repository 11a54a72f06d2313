"""Per-minute medians of a streaming query's phases and of its Spark job/task times, from an event log."""
import json, sys, collections, statistics as st
prog = []; jobs = {}; stage_job = {}; tasks = collections.defaultdict(list); stage_kind = {}
for l in open(sys.argv[1]):
    try: e = json.loads(l)
    except Exception: continue
    ev = e['Event']
    if ev.endswith('QueryProgressEvent'):
        p = e['progress']
        if sum(s.get('numInputRows', 0) for s in p.get('sources', [])):
            prog.append(p)
    elif ev == 'SparkListenerJobStart':
        jobs[e['Job ID']] = [e['Submission Time'], None]
        for s in e['Stage Infos']:
            stage_job[s['Stage ID']] = e['Job ID']
    elif ev == 'SparkListenerJobEnd':
        jobs[e['Job ID']][1] = e['Completion Time']
    elif ev == 'SparkListenerTaskEnd':
        ti = e['Task Info']; tasks[stage_job.get(e['Stage ID'])].append((ti['Finish Time'] - ti['Launch Time']))
from datetime import datetime
def ts(p): return datetime.fromisoformat(p['timestamp'].replace('Z', '+00:00')).timestamp()
t0 = ts(prog[0])
by = collections.defaultdict(list)
for p in prog: by[int((ts(p) - t0) // 60)].append(p)
jt = sorted((v[0] / 1e3, (v[1] - v[0]) / 1e3, sum(tasks.get(j, [])) / 1e3) for j, v in jobs.items() if v[1])
jby = collections.defaultdict(list)
for s, d, t in jt: jby[int((s - t0) // 60)].append((d, t))
keys = ['triggerExecution', 'latestOffset', 'queryPlanning', 'walCommit', 'addBatch', 'commitOffsets']
print('min  n  ' + ' '.join(f"{k[:10]:>10}" for k in keys) + '   job_s  tasks_s')
for m in sorted(by):
    ps = by[m]
    row = [st.median([p['durationMs'].get(k, 0) for p in ps]) / 1e3 for k in keys]
    j = jby.get(m, [(0, 0)])
    print(f"{m:3d} {len(ps):3d} " + ' '.join(f"{v:10.3f}" for v in row) + f"  {st.median(x[0] for x in j):6.3f} {st.median(x[1] for x in j):6.3f}")
