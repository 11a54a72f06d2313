"""Break a demo's micro-batches down from Spark's event log: per query and stage kind, median seconds."""
import json, sys, collections, statistics as st
events = []
for l in open(sys.argv[1]):
    try: events.append(json.loads(l))
    except Exception: pass
stage_job = {}; job_query = {}; job_time = {}; stage_sub = {}; stage_kind = {}
names = {}
for e in events:
    ev = e['Event']
    if ev.endswith('QueryStartedEvent'):
        names[e['id']] = e.get('name') or e['id'][:8]
    if ev == 'SparkListenerJobStart':
        q = e['Properties'].get('sql.streaming.queryId')
        job_query[e['Job ID']] = q
        job_time[e['Job ID']] = [e['Submission Time'], None]
        for s in e['Stage Infos']:
            stage_job[s['Stage ID']] = e['Job ID']
            rdds = [r['Name'] for r in s['RDD Info']]
            stage_kind[s['Stage ID']] = 'state+write' if 'StateStoreRDD' in rdds else 'read'
    if ev == 'SparkListenerJobEnd':
        job_time[e['Job ID']][1] = e['Completion Time']
    if ev == 'SparkListenerStageSubmitted':
        stage_sub[e['Stage Info']['Stage ID']] = e['Stage Info'].get('Submission Time')
rows = collections.defaultdict(lambda: collections.defaultdict(list))
accs = collections.defaultdict(lambda: collections.defaultdict(list))
for e in events:
    if e['Event'] == 'SparkListenerTaskEnd':
        sid = e['Stage ID']; q = job_query.get(stage_job.get(sid)); k = stage_kind.get(sid)
        ti, tm = e['Task Info'], e['Task Metrics']
        r = rows[q][k]
        r.append(dict(wait=(ti['Launch Time'] - stage_sub[sid]) / 1e3, task=(ti['Finish Time'] - ti['Launch Time']) / 1e3,
                      deser=tm['Executor Deserialize Time'] / 1e3, run=tm['Executor Run Time'] / 1e3,
                      cpu=tm['Executor CPU Time'] / 1e9, gc=tm['JVM GC Time'] / 1e3,
                      rows=tm.get('Input Metrics', {}).get('Records Read', 0)))
        for a in ti.get('Accumulables', []):
            if 'Name' in a and 'Update' in a:
                try: accs[(q, k)][a['Name']].append(float(a['Update']))
                except Exception: pass
for q, kinds in rows.items():
    jobs = [(t[1] - t[0]) / 1e3 for j, t in job_time.items() if job_query.get(j) == q and t[1]]
    print(f"query {names.get(q, q)}: {len(jobs)} jobs, median job {st.median(jobs):.3f}s")
    for k, r in kinds.items():
        print(f"  {k}: {len(r)} tasks; " + ", ".join(f"{f} {st.median([x[f] for x in r]):.3f}" for f in r[0]))
        for name, v in sorted(accs[(q, k)].items()):
            if any(w in name.lower() for w in ('time', 'duration')):
                print(f"      {name}: median {st.median(v):.1f} sum {sum(v):.0f}")
