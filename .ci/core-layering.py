#!/usr/bin/env python3
"""The layering of the AutoManager core (src/automanager): no two files import each other in a
cycle, and no file imports an item through a re-export.

A file A imports a file B when A names an item by a path (in a `use` or inline; `crate::`,
`super::` or `self::`) that resolves to B. A path that resolves to a file which does not define
the item named (a folder's `mod.rs` re-exporting it, say) is reported: it would hide the real
import. A folder's `pub use` re-exports are its face for code outside the core and are not
imports. Unit tests (`#[cfg(test)] mod tests`) are left out.

Run from the repository's root: `python3 .ci/core-layering.py`; it exits non-zero, naming the
files, when either rule is broken.
"""
import re, os, sys, collections

ROOT = 'src/automanager'
files = []
for d, _, fs in os.walk(ROOT):
    for f in fs:
        if f.endswith('.rs'):
            files.append(os.path.join(d, f))

def modpath(p):
    rel = os.path.relpath(p, 'src')[:-3].split('/')
    if rel[-1] == 'mod':
        rel = rel[:-1]
    return tuple(rel)

mods = {modpath(f): f for f in files}
texts = {}
for m, f in mods.items():
    s = open(f).read()
    # drop #[cfg(test)] mod tests { ... } at the end of files: unit tests are not structure
    i = s.find('#[cfg(test)]\nmod tests')
    if i >= 0:
        s = s[:i]
    s = re.sub(r'//[^\n]*', '', s)
    texts[m] = s

def defines(m, name):
    s = texts[m]
    return re.search(r'\b(struct|enum|fn|const|type|trait|static|mod|macro_rules!)\s+' + re.escape(name) + r'\b', s) is not None

def resolve(cur, segs, is_dir):
    base = list(cur) if is_dir else list(cur)  # a file's own module path
    segs = list(segs)
    if segs[0] == 'crate':
        base = []; segs = segs[1:]
    elif segs[0] == 'super':
        while segs and segs[0] == 'super':
            base = base[:-1]; segs = segs[1:]
    elif segs[0] == 'self':
        segs = segs[1:]
    else:
        return None, None
    full = base + segs
    for i in range(len(full), 0, -1):
        if tuple(full[:i]) in mods:
            rest = full[i:]
            return tuple(full[:i]), (rest[0] if rest else None)
    return None, None

def expand(path, group):
    out = []
    if group is None:
        return [path]
    # split a use group at top level commas
    depth = 0; cur = ''
    parts = []
    for ch in group:
        if ch == '{': depth += 1
        if ch == '}': depth -= 1
        if ch == ',' and depth == 0:
            parts.append(cur); cur = ''
        else:
            cur += ch
    parts.append(cur)
    for p in parts:
        p = p.strip()
        if not p:
            continue
        m = re.match(r'([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)(?:::\{(.*)\})?$', p.split(' as ')[0].strip(), re.S)
        if not m:
            continue
        sub = path + m.group(1).split('::')
        out += expand(sub, m.group(2))
    return out

edges = collections.defaultdict(set)
through = []
for m, f in mods.items():
    s = texts[m]
    is_face = f.endswith('mod.rs')
    for mt in re.finditer(r'(pub(?:\([a-z]+\))?\s+)?\buse\s+((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)*)(?:::\{(.*?)\})?\s*;', s, re.S):
        if mt.group(1) and is_face:
            continue  # a folder's re-exports are its face for outside users
        for p in expand(mt.group(2).split('::'), mt.group(3)):
            r, name = resolve(m, p, is_face)
            if r and r != m:
                edges[m].add(r)
                if name and name != 'self' and not defines(r, name) and r[:len(m)] != m:
                    through.append((f, '::'.join(p), mods[r]))
    body = re.sub(r'\buse\s+[^;]*;', '', s, flags=re.S)
    for mt in re.finditer(r'\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)', body):
        p = mt.group(1).split('::')
        r, name = resolve(m, p, is_face)
        if r and r != m:
            edges[m].add(r)
            if name and not defines(r, name) and r[:len(m)] != m:
                through.append((f, '::'.join(p), mods[r]))
# a folder's mod.rs declares its children: not an import
for m in list(edges):
    edges[m] = {r for r in edges[m] if not (len(r) == len(m) + 1 and r[:len(m)] == m and mods[m].endswith('mod.rs') and re.search(r'\bmod\s+' + r[-1] + r'\b', texts[m]) and r not in set())}

idx = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx:
            sc(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        s = []
        while True:
            w = st.pop(); on.discard(w); s.append(w)
            if w == v:
                break
        sccs.append(s)
for v in list(mods):
    if v not in idx:
        sc(v)
bad = 0
for s in sccs:
    if len(s) > 1:
        bad += 1
        ss = set(s)
        print(f'cycle of {len(s)} files:')
        for a in sorted(s):
            print('  ', mods[a], '->', sorted(mods[b] for b in edges[a] if b in ss))
for f, p, r in sorted(set(through)):
    print(f'{f}: {p} is re-exported by {r}, not defined there')
print(f'{len(mods)} files, {sum(len(v) for v in edges.values())} imports, {bad} cycles, {len(set(through))} imports through a re-export')
sys.exit(1 if bad or through else 0)
