#!/usr/bin/env python3
"""Detect module import cycles inside a crate's `src/` tree (python3 stdlib only).

Usage:
    scripts/check-module-cycles.py [CRATE ...]      # default: datapath rdmap
    scripts/check-module-cycles.py --self-test

A CRATE is a workspace member name (resolved against the repository root, the parent of this
script's directory, or --root) or a path to a crate directory (one holding `src/lib.rs`).

Model
-----
* Modules are found by following `mod x;` declarations from `src/lib.rs` (or `src/main.rs`):
  `src/lib.rs` = the crate root (`crate`), `src/foo.rs` / `src/foo/mod.rs` = `foo`,
  `src/foo/bar.rs` = `foo::bar`. Inline `mod x { ... }` blocks are folded into their file's
  module (paths inside them, `super::` included, are resolved relative to the inline module).
* References: every `use` item (grouped / nested / multi-line forms included) and every path in
  code that starts with `crate::`, `$crate::`, `self::`, `super::` or the name of a child module
  (2018 relative paths). Comments (incl. doc comments), string/char literals, attributes and
  every item marked `#[cfg(test)]` (e.g. `mod tests { ... }`) are ignored.
* A reference resolves to the deepest module in the file map (`crate::engine::xdp::Wake` ->
  `engine::xdp`); if the next segment is a name that module imports with `use` (e.g. a
  `pub use m::Name` re-export, in lib.rs or in any mod.rs), it is followed to the module that
  defines it. Names pointing outside the crate give no edge.
* Edges: module -> module for each reference (self-loops dropped). A parent's `mod child;`
  declaration and `pub use child::X` count as parent -> child (use --ignore-mod-decls to drop the
  bare declarations); the crate root's `mod` declarations and `pub use` re-exports are NOT edges,
  but other code in lib.rs is, and `crate::Foo` with `Foo` defined in lib.rs is an edge to the
  root.
* Cycles = strongly connected components of size > 1 (Tarjan). Exit 1 if any crate has one.
"""

import argparse
import bisect
import os
import re
import shutil
import sys
import tempfile
from collections import defaultdict

ROOT_NAME = "crate"
IDENT_START = re.compile(r"[A-Za-z_]")
IDENT_CHAR = re.compile(r"[A-Za-z0-9_]")


# ----------------------------------------------------------------------------------------------
# Lexing: blank out comments and literals (keeping newlines, so line numbers stay right).
# ----------------------------------------------------------------------------------------------

def _is_ident_char(c):
    return c.isalnum() or c == "_"


def strip_comments_and_literals(src):
    out = []
    i, n = 0, len(src)

    def blank(a, b, placeholder=""):
        chunk = src[a:b]
        s = re.sub(r"[^\n]", " ", chunk)
        if placeholder and s:
            s = placeholder + s[len(placeholder):]
        out.append(s)

    while i < n:
        c = src[i]
        nxt = src[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
            continue
        if c == "/" and nxt == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth += 1
                    j += 2
                elif src.startswith("*/", j):
                    depth -= 1
                    j += 2
                else:
                    j += 1
            blank(i, j)
            i = j
            continue
        prev_ident = i > 0 and _is_ident_char(src[i - 1])
        # raw strings: r"..", r#".."#, br"..", cr#".."#
        if not prev_ident:
            m = re.match(r"(?:b|c)?r(#*)\"", src[i:i + 300])
            if m:
                hashes = m.group(1)
                end = src.find('"' + hashes, i + m.end())
                j = n if end < 0 else end + 1 + len(hashes)
                blank(i, j, "0")
                i = j
                continue
            if c in "bc" and nxt == '"':
                i += 1
                c, nxt = '"', src[i + 1] if i + 1 < n else ""
                out.append(" ")
        if c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            blank(i, j, "0")
            i = j
            continue
        if c == "'" or (c == "b" and nxt == "'" and not prev_ident):
            k = i + 1 if c == "'" else i + 2
            if k < n and src[k] == "\\":  # escaped char literal
                j = k + 1
                while j < n and src[j] != "'" and src[j] != "\n":
                    j += 1
                j = min(j + 1, n)
                blank(i, j, "0")
                i = j
                continue
            if k + 1 < n and src[k + 1] == "'" and src[k] != "\n":  # 'x'
                blank(i, k + 2, "0")
                i = k + 2
                continue
            # lifetime or label: leave as is
        out.append(c)
        i += 1
    return "".join(out)


TOKEN_RE = re.compile(r"r#[A-Za-z_][A-Za-z0-9_]*|\$crate|[A-Za-z_][A-Za-z0-9_]*|::|'[A-Za-z_][A-Za-z0-9_]*|\d[\w.]*|\S")


def tokenize(src):
    clean = strip_comments_and_literals(src)
    line_starts = [0] + [m.end() for m in re.finditer("\n", clean)]
    toks = []
    for m in TOKEN_RE.finditer(clean):
        t = m.group(0)
        if t.startswith("r#"):
            t = t[2:]
        toks.append((t, bisect.bisect_right(line_starts, m.start())))
    return toks


def is_ident(t):
    return bool(t) and (IDENT_START.match(t) is not None or t == "$crate")


# ----------------------------------------------------------------------------------------------
# Parsing one file
# ----------------------------------------------------------------------------------------------

class UseEntry:
    __slots__ = ("segs", "alias", "glob", "line", "ctx", "is_pub", "module_level")

    def __init__(self, segs, alias, glob, line, ctx, is_pub, module_level):
        self.segs, self.alias, self.glob, self.line = segs, alias, glob, line
        self.ctx, self.is_pub, self.module_level = ctx, is_pub, module_level


class FileInfo:
    def __init__(self, modpath, path):
        self.modpath = modpath          # tuple, () for the crate root
        self.path = path
        self.uses = []                  # [UseEntry]
        self.code_refs = []             # [(segs, ctx, line)]
        self.mod_decls = []             # [(name, line)] file-module children (`mod x;`)
        self.inline_mods = set()        # tuples of inline module paths
        self.test_mod_decls = set()     # `#[cfg(test)] mod x;` names


def _matching(toks, i, open_t, close_t):
    """Index just past the token closing the group opened at toks[i]."""
    depth = 0
    n = len(toks)
    while i < n:
        t = toks[i][0]
        if t == open_t:
            depth += 1
        elif t == close_t:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def _is_cfg_test(attr):
    """attr: token strings inside #[ ... ]."""
    if len(attr) < 4 or attr[0] != "cfg" or attr[1] != "(":
        return False
    if attr[2] == "test" and attr[3] == ")":
        return True
    if attr[2] == "all" and attr[3] == "(":
        depth = 0
        for j, t in enumerate(attr[1:], 1):
            if t == "(":
                depth += 1
            elif t == ")":
                depth -= 1
            elif t == "test" and depth == 2 and attr[j - 1] in ("(", ","):
                return True
    return False


def _skip_item(toks, i):
    """Skip an item starting at toks[i] (after its attributes): to its `;` or its `{...}`."""
    n = len(toks)
    depth = 0
    while i < n:
        t = toks[i][0]
        if t == "#" and i + 1 < n and toks[i + 1][0] == "[" and depth == 0:
            i = _matching(toks, i + 1, "[", "]")
            continue
        if t in "([":
            depth += 1
        elif t in ")]":
            depth -= 1
        elif depth <= 0 and t == ";":
            return i + 1
        elif depth <= 0 and t == "{":
            return _matching(toks, i, "{", "}")
        elif depth <= 0 and t == "}":  # end of enclosing block: stop before it
            return i
        i += 1
    return n


def _parse_use_tree(toks, i, prefix, out):
    """Parse a use tree at toks[i]; append (segs, alias, glob, line) to out; return next index."""
    n = len(toks)
    segs = list(prefix)
    line = toks[i][1] if i < n else 0
    if i < n and toks[i][0] == "::":  # `use ::extern_crate::...`
        segs.append("::")
        i += 1
    while i < n:
        t, line_t = toks[i]
        if t == "{":
            j = i + 1
            while j < n and toks[j][0] != "}":
                if toks[j][0] == ",":
                    j += 1
                    continue
                j = _parse_use_tree(toks, j, segs, out)
            return j + 1
        if t == "*":
            out.append((segs, None, True, line_t))
            return i + 1
        if is_ident(t):
            if t == "self" and prefix and len(segs) == len(prefix):
                # `a::{self, ...}` -> import of the module `a` itself
                alias = segs[-1]
                i += 1
                if i + 1 < n and toks[i][0] == "as":
                    alias = toks[i + 1][0]
                    i += 2
                out.append((segs, alias, False, line_t))
                return i
            segs = segs + [t]
            line = line_t
            i += 1
            if i < n and toks[i][0] == "::":
                i += 1
                continue
            alias = segs[-1]
            if i + 1 < n and toks[i][0] == "as":
                alias = toks[i + 1][0]
                i += 2
            out.append((segs, alias, False, line))
            return i
        # anything else: malformed; stop here
        return i + 1 if t not in (",", "}", ";") else i
    return i


def parse_file(modpath, path, text):
    fi = FileInfo(modpath, path)
    toks = tokenize(text)
    n = len(toks)
    stack = []               # entries: name for inline mod, None for other blocks
    pending_mod = None       # name of an inline `mod x {` whose `{` comes next
    i = 0

    def ctx():
        return modpath + tuple(s for s in stack if s is not None)

    def module_level():
        return all(s is not None for s in stack)

    while i < n:
        t, line = toks[i]
        if t == "#":
            inner = i + 1 < n and toks[i + 1][0] == "!"
            j = i + 2 if inner else i + 1
            if j < n and toks[j][0] == "[":
                end = _matching(toks, j, "[", "]")
                attr = [x[0] for x in toks[j + 1:end - 1]]
                if _is_cfg_test(attr):
                    if inner:  # whole file / block is test-only
                        if not stack:
                            return fi
                        i = end
                        continue
                    k = end
                    # the item: note `mod x;` test files
                    m = k
                    while m < n and toks[m][0] == "#" and m + 1 < n and toks[m + 1][0] == "[":
                        m = _matching(toks, m + 1, "[", "]")
                    while m < n and toks[m][0] in ("pub",):
                        m += 1
                        if m < n and toks[m][0] == "(":
                            m = _matching(toks, m, "(", ")")
                    if m + 2 < n and toks[m][0] == "mod" and toks[m + 2][0] == ";":
                        fi.test_mod_decls.add(toks[m + 1][0])
                    i = _skip_item(toks, k)
                    continue
                i = end
                continue
        if t == "pub" and i + 1 < n and toks[i + 1][0] == "(":
            # skip `pub(crate)`, `pub(in crate::a)`; not a reference
            i = _matching(toks, i + 1, "(", ")")
            continue
        if t == "{":
            stack.append(pending_mod)
            if pending_mod is not None:
                fi.inline_mods.add(ctx())
            pending_mod = None
            i += 1
            continue
        if t == "}":
            if stack:
                stack.pop()
            i += 1
            continue
        if t == "mod" and i + 2 < n and is_ident(toks[i + 1][0]):
            name, after = toks[i + 1][0], toks[i + 2][0]
            if after == ";":
                if module_level() and not stack:
                    fi.mod_decls.append((name, line))
                i += 3
                continue
            if after == "{":
                pending_mod = name
                i += 2
                continue
        if t == "use" and (i == 0 or toks[i - 1][0] not in ("::", ".")):
            # visibility: `pub use` or `pub(...) use`
            is_pub = False
            if i > 0 and toks[i - 1][0] == "pub":
                is_pub = True
            elif i > 0 and toks[i - 1][0] == ")":
                depth, k = 0, i - 1
                while k >= 0:
                    if toks[k][0] == ")":
                        depth += 1
                    elif toks[k][0] == "(":
                        depth -= 1
                        if depth == 0:
                            break
                    k -= 1
                is_pub = k > 0 and toks[k - 1][0] == "pub"
            entries = []
            j = _parse_use_tree(toks, i + 1, [], entries)
            while j < n and toks[j][0] != ";":
                j += 1
            c, ml = ctx(), module_level()
            for segs, alias, glob, ln in entries:
                fi.uses.append(UseEntry(tuple(segs), alias, glob, ln, c, is_pub, ml))
            i = j + 1
            continue
        if is_ident(t) and i + 1 < n and toks[i + 1][0] == "::" and (i == 0 or toks[i - 1][0] not in ("::", ".")):
            segs = [t]
            j = i + 1
            while j + 1 < n and toks[j][0] == "::" and is_ident(toks[j + 1][0]):
                segs.append(toks[j + 1][0])
                j += 2
            fi.code_refs.append((tuple(segs), ctx(), line))
            i = j
            continue
        i += 1
    return fi


# ----------------------------------------------------------------------------------------------
# Crate model
# ----------------------------------------------------------------------------------------------

def modname(mp):
    return "::".join(mp) if mp else ROOT_NAME


class Crate:
    def __init__(self, crate_dir, display_base=None, ignore_mod_decls=False):
        self.dir = crate_dir
        self.src = os.path.join(crate_dir, "src")
        self.display_base = display_base or os.path.dirname(os.path.abspath(crate_dir))
        self.ignore_mod_decls = ignore_mod_decls
        self.files = {}       # modpath -> FileInfo
        self.children = defaultdict(set)   # ctx tuple -> child names (file and inline modules)
        self.uses_by_ctx = defaultdict(dict)  # ctx -> {alias: UseEntry} (module-level uses)
        self.warnings = []
        self._load()

    def rel(self, path):
        return os.path.relpath(path, self.display_base)

    def _load(self):
        root = None
        for cand in ("lib.rs", "main.rs"):
            p = os.path.join(self.src, cand)
            if os.path.isfile(p):
                root = p
                break
        if root is None:
            raise FileNotFoundError(f"no src/lib.rs or src/main.rs in {self.dir}")
        # (modpath, file path, directory holding this module's child files)
        todo = [((), root, self.src)]
        while todo:
            mp, path, child_dir = todo.pop()
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            fi = parse_file(mp, path, text)
            self.files[mp] = fi
            for name, line in fi.mod_decls:
                cands = [os.path.join(child_dir, name + ".rs"),
                         os.path.join(child_dir, name, "mod.rs")]
                found = next((c for c in cands if os.path.isfile(c)), None)
                if found is None:
                    self.warnings.append(f"{self.rel(path)}:{line}: no file for `mod {name};`")
                    continue
                cdir = os.path.dirname(found) if found.endswith("mod.rs") else os.path.join(child_dir, name)
                todo.append((mp + (name,), found, cdir))
        for mp, fi in self.files.items():
            if mp:
                self.children[mp[:-1]].add(mp[-1])
            for im in fi.inline_mods:
                self.children[im[:-1]].add(im[-1])
            for u in fi.uses:
                if u.module_level and not u.glob and u.alias and u.alias != "_":
                    self.uses_by_ctx[u.ctx].setdefault(u.alias, u)

    # -- path resolution ------------------------------------------------------------------------

    def to_abs(self, segs, ctx, depth=0):
        """Absolute crate-relative segments for a path used in ctx, or None if not in this crate."""
        if not segs or depth > 16:
            return None
        s0 = segs[0]
        if s0 == "::":
            return None
        if s0 in ("crate", "$crate"):
            return tuple(segs[1:])
        if s0 in ("self", "super"):
            cur = list(ctx)
            k = 0
            while k < len(segs) and segs[k] in ("self", "super"):
                if segs[k] == "super":
                    if not cur:
                        return None
                    cur.pop()
                k += 1
            return tuple(cur) + tuple(segs[k:])
        if s0 in self.children.get(tuple(ctx), ()):
            return tuple(ctx) + tuple(segs)
        u = self.uses_by_ctx.get(tuple(ctx), {}).get(s0)
        if u is not None and u.segs != tuple(segs[:1]):
            base = self.to_abs(u.segs, u.ctx, depth + 1)
            if base is None:
                return None
            return base + tuple(segs[1:])
        return None

    def resolve_target(self, abs_segs, depth=0):
        """Module (file-level modpath) that defines what abs_segs names."""
        k = 0
        while k < len(abs_segs) and tuple(abs_segs[:k + 1]) in self.files:
            k += 1
        mod = tuple(abs_segs[:k])
        rest = abs_segs[k:]
        if rest and depth < 16:
            # follow a `use` of that module (a re-export or an import), possibly in an inline module
            ctx = mod
            j = 0
            while j < len(rest) - 1 and rest[j] in self.children.get(ctx, ()):
                ctx = ctx + (rest[j],)
                j += 1
            u = self.uses_by_ctx.get(ctx, {}).get(rest[j])
            if u is not None:
                target = self.to_abs(u.segs, u.ctx)
                if target is None:
                    return None  # re-export of something outside the crate
                return self.resolve_target(target + tuple(rest[j + 1:]), depth + 1)
        return mod

    def resolve(self, segs, ctx):
        a = self.to_abs(segs, ctx)
        if a is None:
            return None
        return self.resolve_target(a)

    # -- graph ----------------------------------------------------------------------------------

    def edges(self):
        """{(src, dst): [(file, line), ...]}"""
        out = defaultdict(list)

        def add(src, dst, fi, line):
            if dst is None or src == dst:
                return
            loc = (self.rel(fi.path), line)
            if loc not in out[(src, dst)]:
                out[(src, dst)].append(loc)

        for mp, fi in self.files.items():
            is_root = mp == ()
            if not is_root and not self.ignore_mod_decls:
                for name, line in fi.mod_decls:
                    if name not in fi.test_mod_decls:
                        add(mp, mp + (name,), fi, line)
            for u in fi.uses:
                if is_root and u.is_pub:
                    continue  # the crate root's re-exports are not dependencies
                if u.glob:
                    a = self.to_abs(u.segs, u.ctx) if u.segs else None
                    add(mp, self.resolve_target(a) if a is not None else None, fi, u.line)
                else:
                    add(mp, self.resolve(u.segs, u.ctx), fi, u.line)
            for segs, ctx, line in fi.code_refs:
                s0 = segs[0]
                if s0 in ("crate", "$crate", "self", "super") or s0 in self.children.get(ctx, ()):
                    add(mp, self.resolve(segs, ctx), fi, line)
        return out


def tarjan_scc(nodes, adj):
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []
    counter = [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(adj.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            pushed = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(adj.get(w, ())))))
                    pushed = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if pushed:
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                sccs.append(comp)
    return sccs


def find_cycles(crate):
    edges = crate.edges()
    adj = defaultdict(set)
    for (a, b) in edges:
        adj[a].add(b)
    nodes = sorted(set(crate.files) | set(adj))
    sccs = [sorted(c) for c in tarjan_scc(nodes, adj) if len(c) > 1]
    sccs.sort()
    return sccs, edges


def format_locs(locs):
    by_file = defaultdict(list)
    order = []
    for f, l in locs:
        if f not in by_file:
            order.append(f)
        by_file[f].append(l)
    return "; ".join(f"{f}:{', '.join(str(l) for l in sorted(by_file[f]))}" for f in order)


def check_crate(name, crate_dir, display_base, ignore_mod_decls, out=sys.stdout):
    crate = Crate(crate_dir, display_base, ignore_mod_decls)
    for w in crate.warnings:
        print(f"warning: {name}: {w}", file=sys.stderr)
    sccs, edges = find_cycles(crate)
    for n, comp in enumerate(sccs, 1):
        members = set(comp)
        print(f"{name}: cycle {n} ({len(comp)} modules): {', '.join(modname(m) for m in comp)}", file=out)
        for (a, b) in sorted(edges):
            if a in members and b in members:
                print(f"  {modname(a)} -> {modname(b)}: {format_locs(edges[(a, b)])}", file=out)
    return sccs


# ----------------------------------------------------------------------------------------------
# Self-test
# ----------------------------------------------------------------------------------------------

SELF_TESTS = [
    ("use crate:: cycle a<->b", {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "use crate::b::B;\npub struct A;\n",
        "b.rs": "pub struct B;\nfn f() -> crate::a::A { crate::a::A }\n",
    }, [["a", "b"]], {("b", "a"): [2]}),
    ("super:: cycle between siblings", {
        "lib.rs": "pub mod m;\n",
        "m/mod.rs": "mod x;\nmod y;\n",
        "m/x.rs": "use super::y::Y;\npub fn g() {}\n",
        "m/y.rs": "pub struct Y;\nfn f() { super::x::g(); }\n",
    }, [["m::x", "m::y"]], None),
    ("grouped multi-line use", {
        "lib.rs": "mod a;\nmod b;\nmod c;\n",
        "a.rs": "use crate::{\n    c::{self, C},\n    b::B,\n};\npub struct A;\n",
        "b.rs": "use crate::a::A;\npub struct B;\n",
        "c.rs": "pub struct C;\n",
    }, [["a", "b"]], {("a", "b"): [3], ("a", "c"): [2]}),
    ("comments, strings, chars, cfg(test) do not count", {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": (
            "//! [`crate::b::B`]\n"
            "// use crate::b::B;\n"
            "/* crate::b::x() /* nested */ crate::b::y() */\n"
            "/// see crate::b::B\n"
            "pub struct A;\n"
            "fn f<'a>(s: &'a str) -> char { let _ = \"crate::b::B \\\" crate::b::C\"; '\"' }\n"
            "fn g() { let _ = r#\"crate::b::B \"quoted\" \"#; let _ = b'x'; let _ = '\\''; }\n"
            "#[doc = \"crate::b::B\"]\n"
            "pub struct D;\n"
            "#[cfg(test)]\nmod tests {\n    use crate::b::B;\n    fn t() { crate::b::g(); }\n}\n"
            "#[cfg(test)]\nfn helper() { crate::b::g(); }\n"
        ),
        "b.rs": "use crate::a::A;\npub fn g() {}\npub struct B;\n",
    }, [], None),
    ("detection continues after lifetimes and literals", {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "fn f<'a>(s: &'a str) -> char { let _ = \"}\"; '{' }\nfn g() { crate::b::h(); }\n",
        "b.rs": "use crate::a::f;\npub fn h() {}\n",
    }, [["a", "b"]], {("a", "b"): [2]}),
    ("clean tree with re-exports through lib.rs", {
        "lib.rs": "mod a;\nmod b;\nmod c;\npub use b::Thing;\npub use a::A;\npub enum Error { C(c::C) }\n",
        "a.rs": "use crate::Thing;\nuse crate::Error;\npub struct A;\n",
        "b.rs": "use crate::c::C;\npub struct Thing(C);\n",
        "c.rs": "pub struct C;\nfn f() -> std::io::Result<()> { Ok(()) }\n",
    }, [], {("a", "b"): [1], ("a", "crate"): [2], ("crate", "c"): [6], ("crate", "a"): []}),
    ("cycle through a lib.rs re-export", {
        "lib.rs": "mod a;\nmod b;\npub use b::B;\n",
        "a.rs": "use crate::B;\npub struct A;\n",
        "b.rs": "pub struct B;\nimpl B { fn f(_: crate::a::A) {} }\n",
    }, [["a", "b"]], None),
    ("child using an item defined in its parent's file", {
        "lib.rs": "pub mod p;\n",
        "p/mod.rs": "mod c;\npub use c::C;\npub struct P;\n",
        "p/c.rs": "use super::P;\npub struct C;\n",
    }, [["p", "p::c"]], None),
    ("child using a sibling re-exported by the parent: no cycle", {
        "lib.rs": "pub mod p;\n",
        "p/mod.rs": "mod c;\nmod d;\npub use c::C;\npub use d::D;\n",
        "p/c.rs": "use super::D;\npub struct C;\n",
        "p/d.rs": "pub struct D;\n",
    }, [], {("p::c", "p::d"): [1]}),
    ("inline mod: super:: resolves relative to the inline module", {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "use crate::b::B;\nfn k() {}\npub(crate) mod x86 {\n    use super::k;\n    fn f() { super::k(); self::g(); }\n    fn g() {}\n}\n",
        "b.rs": "pub struct B;\n",
    }, [], {("a", "b"): [1], ("a", "crate"): []}),
]


def run_self_test():
    failures = 0
    for title, files, want_sccs, want_edges in SELF_TESTS:
        tmp = tempfile.mkdtemp(prefix="modcycles-")
        try:
            cdir = os.path.join(tmp, "krate")
            for rel, text in files.items():
                p = os.path.join(cdir, "src", rel)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "w") as f:
                    f.write(text)
            crate = Crate(cdir, tmp)
            sccs, edges = find_cycles(crate)
            got = [[modname(m) for m in c] for c in sccs]
            problems = []
            if got != want_sccs:
                problems.append(f"cycles: got {got}, want {want_sccs}")
            for key, lines in (want_edges or {}).items():
                a, b = (() if k == ROOT_NAME else tuple(k.split("::")) for k in key)
                got_lines = sorted(l for _, l in edges.get((a, b), []))
                if got_lines != lines:
                    problems.append(f"edge {key[0]} -> {key[1]}: lines {got_lines}, want {lines}")
            status = "ok  " if not problems else "FAIL"
            print(f"self-test {status} {title}")
            for p in problems:
                print(f"    {p}")
                all_edges = {f"{modname(a)}->{modname(b)}": [l for _, l in v] for (a, b), v in edges.items()}
                print(f"    edges: {all_edges}")
            failures += bool(problems)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"self-test: {len(SELF_TESTS) - failures}/{len(SELF_TESTS)} passed")
    return 1 if failures else 0


# ----------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("crates", nargs="*", default=["datapath", "rdmap"])
    ap.add_argument("--root", help="repository root (default: parent of this script's directory)")
    ap.add_argument("--self-test", action="store_true", help="run the built-in test cases")
    ap.add_argument("--ignore-mod-decls", action="store_true",
                    help="do not count a bare `mod child;` declaration as parent -> child")
    args = ap.parse_args(argv)
    if args.self_test:
        return run_self_test()
    root = os.path.abspath(args.root or os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    summaries, any_cycle, errors = [], False, False
    for name in args.crates:
        cdir = name if os.path.isdir(os.path.join(name, "src")) else os.path.join(root, name)
        label = os.path.basename(os.path.normpath(cdir))
        try:
            sccs = check_crate(label, cdir, root, args.ignore_mod_decls)
        except (OSError, FileNotFoundError) as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            errors = True
            continue
        any_cycle |= bool(sccs)
        summaries.append(f"module cycles: {label}: {len(sccs) if sccs else 'none'}")
    for s in summaries:
        print(s)
    return 1 if any_cycle else (2 if errors else 0)


if __name__ == "__main__":
    sys.exit(main())
