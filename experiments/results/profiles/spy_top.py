import collections, sys
f = sys.argv[1]; k = int(sys.argv[2]) if len(sys.argv) > 2 else 40
inc = collections.Counter(); selfc = collections.Counter(); tot = 0
for l in open(f):
    s, n = l.rsplit(' ', 1); n = int(n); fr = s.split(';')
    fr = [x for x in fr if not x.startswith(('process ', 'thread '))]
    tot += n
    if fr: selfc[fr[-1]] += n
    for x in set(fr): inc[x] += n
print('total', tot/50, 's')
print('-- inclusive')
for x, v in inc.most_common(k): print(f"{v/50:6.2f} {100*v/tot:5.1f}% {x[:150]}")
print('-- self')
for x, v in selfc.most_common(25): print(f"{v/50:6.2f} {100*v/tot:5.1f}% {x[:150]}")
