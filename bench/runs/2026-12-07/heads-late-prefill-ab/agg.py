import json, glob, sys, math, collections
d = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + '/*.json')):
    v, L, i = f.split('/')[-1][:-5].split('-')
    for r in json.load(open(f))['rows']:
        d[(r['row'], L, v)].append(r)
for k in sorted(d):
    rs = d[k]
    m = sum(r['method_wall_s'] for r in rs); t = sum(r['target_only_wall_s'] for r in rs)
    sp = [r['speedup'] for r in rs]
    print(k, 'n', len(rs), 'sum-ratio %.3f' % (t / m), 'median %.3f' % sorted(sp)[len(sp)//2],
          'min %.3f max %.3f' % (min(sp), max(sp)), 'probes', [r['auto']['probes'] for r in rs],
          'drafted', [r['auto']['rounds_drafted'] for r in rs], 'ident', sum(r['identical'] for r in rs))
