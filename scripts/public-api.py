#!/usr/bin/env python3
"""The public API of a library crate, one item a line, from its rustdoc JSON.

    python3 scripts/public-api.py target/api/doc/pglock.json [--package pglock]
        [--features metrics,test-hooks] [--dep target/api/doc/other.json ...] > api/pglock.txt

scripts/api-listing.sh runs it for every published library of the workspace; the JSON comes from
`RUSTC_BOOTSTRAP=1 cargo rustdoc -p CRATE --all-features --lib -- -Z unstable-options
--output-format json`. Written against rustdoc JSON format_version 57 (Rust 1.95); versions 57 to
61 differ only in fields it does not read, and another version is warned about on stderr.
Python 3.11, standard library only.

What is listed: every item a user of the crate can name, walked from the crate root through
public modules and `pub use` re-exports (globs included; a name declared in a module shadows one
a glob brings). `#[doc(hidden)]` items are left out (rustdoc drops them, and so does this script),
and so is anything private. The listing is the API with every feature on, as the JSON is made
with `--all-features`: the header says so, and an item's own `#[cfg(feature = "..")]` is shown
in front of it (an item inside a gated module inherits the module's, unshown).

- Modules, and `macro_rules!` macros exported at the crate root, with the rules' matchers.
- Structs with their public fields (`{ /* private fields */ }` when some are not public), tuple
  structs with their fields in the declaration, unions likewise; enums with each variant in
  declaration order (tuple fields inline, struct-variant fields a line each) and explicit
  discriminants.
- Traits with supertraits, generics and where clauses; every method, associated type and
  associated const. A provided method ends in `{ ... }`, an associated const with a default in
  `= ...`. A trait with a supertrait no one outside the crate can name is marked `// sealed`.
  Impls of the trait that belong to no listed type (a blanket impl the crate writes, impls for
  foreign types) are listed under the trait.
- Functions and methods with their full signatures: `const`/`async`/`unsafe`/`extern`, generics
  and bounds, where clauses, `impl Trait` in arguments and returns, lifetimes, references,
  slices, arrays, tuples, raw pointers, `dyn Trait + Send + 'a`, fn pointers, HRTBs and
  `<T as Trait>::Item`. `async fn` is shown as `async fn` with its declared return type; an
  `#[async_trait]` method shows the desugared `Pin<Box<dyn Future<..> + Send + 'async_trait>>`
  signature, which is what callers and implementors get.
- Consts and statics with their types (not their values), type aliases with their definitions.
- For each struct, enum and union: its inherent impls with their public methods and consts, its
  trait impls (`impl core::clone::Clone for pglock::LockInfo`) with their associated types and
  consts (`type <X as core::str::traits::FromStr>::Err = Y`; the methods are the trait's), and
  its stable auto traits (Send, Sync, Unpin, UnwindSafe, RefUnwindSafe), including
  `impl !Sync for X` and the conditions of `impl<T> Send for X<T> where T: Send`. Left out:
  rustdoc's copies of blanket impls (`impl<T> Any for T`, `impl<T> From<T> for T`, ...: their
  `blanket_impl` is set), the unstable auto traits (Freeze, UnsafeUnpin) and the
  StructuralPartialEq that `#[derive(PartialEq)]` adds, which no stable code can name. An impl
  of the crate that no type or trait above claims, and that names a public item, is listed at
  the end of the crate root's items.
- Attributes that matter for semver, in front of the item: `#[cfg(..)]` (see above),
  `#[non_exhaustive]`, `#[must_use]` (without its message: rewording it breaks nothing),
  `#[deprecated(since, note)]`, `#[repr(..)]`, `#[macro_export]`, and `unsafe` on an unsafe
  trait or impl.

Paths: every path is written in full from the crate root. An item reachable by several public
paths is listed in full once, at its shortest path (fewest segments; between paths as short,
the one with no `pub use` on the way; then the first in alphabetical order): `pglock::Attempt`,
not `pglock::prelude::Attempt`. Each other path it is reachable by gets one line of its own,
`pub use pglock::prelude::Attempt => pglock::Attempt`, so that adding or removing a re-export
shows in a diff too; so does a re-export of another crate's item
(`pub use pglock_testing::Stage => pglock::hooks::Stage`). Items of other crates are written at
the path rustdoc records, the module where they are declared (`alloc::string::String`,
`core::future::future::Future`, `chrono::datetime::DateTime`), not always the path their crate
exports them at; `--dep OTHER.json` (the rustdoc JSON of a crate this one depends on) writes that
crate's items at their public paths, by the rule above (`pglock::LockManager`).

Order: lines are sorted so that what belongs together stays together and a change touches as
few lines as possible. Modules in alphabetical order of their paths, the crate root first; in a
module, its items in alphabetical order of name (case ignored), each followed by its parts: a
type's fields or variants (declaration order), its inherent impls with their methods and consts
(alphabetical), its trait impls (by trait path), then its auto-trait impls; a trait's
associated types, consts and methods (alphabetical), then its impls. One item a line, never
wrapped; a multi-line expression or message is joined with single spaces.

Not shown: const and static values, the bodies of macros, what a body does (panics, behaviour),
whether a trait is dyn-compatible, traits sealed by other means than a private supertrait (a
method taking a private type), the traits a type gets only through other crates' blanket impls,
and the message of `#[must_use]`. Bounds are as rustdoc records them: a bound written inline on
a struct's parameter may show in its where clause.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict

KNOWN_FORMAT_VERSIONS = range(57, 62)

# The auto traits that stable code can name; rustdoc also synthesizes impls of unstable ones
# (core::marker::Freeze, UnsafeUnpin), which the listing leaves out.
STABLE_AUTO_TRAITS = {
    "core::marker::Send",
    "core::marker::Sync",
    "core::marker::Unpin",
    "core::panic::unwind_safe::UnwindSafe",
    "core::panic::unwind_safe::RefUnwindSafe",
    "std::panic::UnwindSafe",
    "std::panic::RefUnwindSafe",
}
UNSTABLE_AUTO_TRAIT_NAMES = {"Freeze", "UnsafeUnpin"}
# Traits no stable code can name or implement, whose impls the listing leaves out:
# `#[derive(PartialEq)]` implements StructuralPartialEq beside PartialEq.
UNNAMEABLE_TRAITS = {"core::marker::StructuralPartialEq"}
# Foreign unsafe traits: an explicit impl of one is an `unsafe impl` (rustdoc JSON's
# `Impl::is_unsafe` says false for it; a local trait's own `is_unsafe` is used for the others).
UNSAFE_TRAITS = {"core::marker::Send", "core::marker::Sync"}

TYPE_KINDS = ("struct", "enum", "union")
# Order of kinds for items of the same name in one module (different namespaces).
KIND_RANK = {
    "module": 0,
    "macro": 1,
    "proc_macro": 1,
    "trait": 2,
    "trait_alias": 2,
    "struct": 3,
    "enum": 3,
    "union": 3,
    "type_alias": 4,
    "constant": 5,
    "static": 6,
    "function": 7,
    "variant": 8,
    "use": 9,
}
MACRO_NS, VALUE_NS, TYPE_NS = "macro", "value", "type"


def kind_of(item):
    inner = item["inner"]
    return inner if isinstance(inner, str) else next(iter(inner))


def inner_of(item):
    inner = item["inner"]
    return None if isinstance(inner, str) else next(iter(inner.values()))


def one(d):
    """The single (key, value) of a serde externally tagged enum, or (name, None) for a unit."""
    if isinstance(d, str):
        return d, None
    return next(iter(d.items()))


def namespace(kind):
    if kind in ("macro", "proc_macro", "proc_attribute", "proc_derive"):
        return MACRO_NS
    if kind in ("function", "constant", "static"):
        return VALUE_NS
    return TYPE_NS


def rust_str(s):
    """A string literal as Rust would write it (JSON escapes are close enough, and one line)."""
    return json.dumps(s, ensure_ascii=False)


def one_line(s):
    return re.sub(r"\s+", " ", s).strip()


class CfgTrace:
    """The `#[cfg(...)]` of an item, from the text rustdoc JSON (format 57) gives it:
    `#[attr = CfgTrace([NameValue { name: "feature", value: Some("metrics"), span: .. }])]`,
    with `Any([..], span)`, `All([..], span)` and `Not(.., span)` around such predicates. The text
    is rustc's debug output, not a stable format: what does not parse is shown as `#[cfg(?)]`."""

    PREFIX = "#[attr = CfgTrace(["

    def __init__(self, text):
        self.s, self.i = text, len(self.PREFIX)

    @classmethod
    def render(cls, text):
        if not text.startswith(cls.PREFIX):
            return None
        try:
            parser = cls(text)
            preds = parser.predicates()
            if not preds:
                return None
            return preds[0] if len(preds) == 1 else "all(" + ", ".join(preds) + ")"
        except (ValueError, IndexError):
            return "?"

    def skip_ws(self):
        while self.s[self.i] in " \n\t,":
            self.i += 1

    def skip_to_close(self):
        """Past the bracket that closes the one last opened (skipping spans, `(#0)` and all)."""
        depth = 0
        while True:
            c = self.s[self.i]
            self.i += 1
            if c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    return
                depth -= 1

    def predicates(self):
        out = []
        while True:
            self.skip_ws()
            if self.s[self.i] == "]":
                self.i += 1
                return out
            out.append(self.predicate())

    def predicate(self):
        self.skip_ws()
        rest = self.s[self.i:]
        if rest.startswith("NameValue {"):
            m = re.match(r'NameValue \{\s*name:\s*"((?:[^"\\]|\\.)*)",\s*value:\s*(?:Some\("((?:[^"\\]|\\.)*)"\)|None)', rest)
            if not m:
                raise ValueError(rest[:40])
            self.i += m.end()
            self.skip_to_close()
            return m.group(1) if m.group(2) is None else f'{m.group(1)} = "{m.group(2)}"'
        for name in ("Any", "All"):
            if rest.startswith(name + "(["):
                self.i += len(name) + 2
                preds = self.predicates()
                self.skip_to_close()
                return name.lower() + "(" + ", ".join(preds) + ")"
        if rest.startswith("Not("):
            self.i += 4
            pred = self.predicate()
            self.skip_to_close()
            return "not(" + pred + ")"
        raise ValueError(rest[:40])


class Api:
    def __init__(self, krate, deps=()):
        self.krate = krate
        self.index = krate["index"]
        self.paths = krate["paths"]
        self.root = str(krate["root"])
        self.crate_name = self.index[self.root]["name"]
        # Public paths of the items of the crates given with --dep, by their definition path.
        self.dep_paths = {}
        for dep in deps:
            self.dep_paths.update(dep.public_paths_by_definition())
        self.found = defaultdict(dict)  # local id -> {public path (tuple): reached through a `use`}
        self.foreign_reexports = []  # (public path, what it names)
        self.variant_aliases = []  # (public path, variant id): `pub use Enum::*`
        self._walk()
        # The shortest path; between paths as short, one with no `pub use` on the way (where the
        # item is declared); then the first in alphabetical order.
        self.canonical = {
            i: min(ps, key=lambda p: (len(p), ps[p], p)) for i, ps in self.found.items()
        }

    # ---------------------------------------------------------------- reachability

    def item(self, i):
        return self.index.get(str(i))

    def hidden(self, item):
        for attr in item.get("attrs", ()):
            name, value = one(attr)
            if name == "other" and re.search(r"doc\s*\(\s*hidden\s*\)", value):
                return True
        return False

    def _entries(self, mid, stack):
        """The public names of a module: {(name, namespace): (target, through a `use`)}, the
        target a local id, ("variant", id) or ("foreign", text)."""
        module = inner_of(self.item(mid))
        explicit, globs = {}, []
        for cid in module["items"]:
            it = self.item(cid)
            if it is None or self.hidden(it) or it["visibility"] != "public":
                continue
            kind = kind_of(it)
            if kind == "impl":
                continue
            if kind == "use":
                use = inner_of(it)
                if use["is_glob"]:
                    globs.append(use)
                    continue
                target = use["id"]
                t = self.item(target) if target is not None else None
                if t is not None:
                    if self.hidden(t):
                        continue
                    explicit[(use["name"], namespace(kind_of(t)))] = (str(target), True)
                else:
                    summary = self.paths.get(str(target)) if target is not None else None
                    if summary is not None and summary["crate_id"] == 0:
                        continue  # a local item rustdoc stripped: hidden
                    ns = namespace(summary["kind"]) if summary else TYPE_NS
                    explicit[(use["name"], ns)] = (("foreign", self.foreign_name(target, use["source"])), True)
                continue
            explicit[(it["name"], namespace(kind))] = (str(cid), False)
        for use in globs:
            target = use["id"]
            t = self.item(target) if target is not None else None
            if t is None:
                explicit.setdefault(("*", "glob"), (("foreign", self.foreign_name(target, use["source"]) + "::*"), True))
                continue
            kind = kind_of(t)
            if kind == "module":
                if str(target) in stack:
                    continue
                sub = self._entries(str(target), stack + (str(target),))
            elif kind == "enum":
                sub = {}
                for vid in inner_of(t)["variants"]:
                    v = self.item(vid)
                    if v is not None and not self.hidden(v):
                        sub[(v["name"], TYPE_NS)] = (("variant", str(vid)), True)
            else:
                continue
            for key, (value, _via) in sub.items():
                explicit.setdefault(key, (value, True))
        return explicit

    def _walk(self):
        self.found[self.root][(self.crate_name,)] = False
        todo = [(self.root, (self.crate_name,), False, (self.root,))]
        while todo:
            mid, path, via_use, stack = todo.pop()
            for (name, _ns), (target, via) in sorted(self._entries(mid, stack).items()):
                via = via or via_use
                p = path + (name,)
                if isinstance(target, tuple):
                    if target[0] == "variant":
                        self.variant_aliases.append((p, target[1]))
                    else:
                        self.foreign_reexports.append((p, target[1]))
                    continue
                self.found[target][p] = self.found[target].get(p, True) and via
                if kind_of(self.item(target)) == "module" and target not in stack and len(p) < 32:
                    todo.append((target, p, via, stack + (target,)))

    def public_paths_by_definition(self):
        """{definition path: public path} of this crate's items, for crates depending on it."""
        out = {}
        for i, path in self.canonical.items():
            summary = self.paths.get(i)
            if summary is not None and summary["crate_id"] == 0:
                out[(self.crate_name,) + tuple(summary["path"][1:])] = path
        return out

    # ---------------------------------------------------------------- names

    def foreign_name(self, i, written):
        summary = self.paths.get(str(i)) if i is not None else None
        if summary is None:
            return written
        path = tuple(summary["path"])
        return "::".join(self.dep_paths.get(path, path))

    def name_of(self, i, written):
        i = str(i)
        if i in self.canonical:
            return "::".join(self.canonical[i])
        summary = self.paths.get(i)
        if summary is None:
            return written.lstrip(":") if written else "?"
        path = tuple(summary["path"])
        if summary["crate_id"] == 0:
            # A local item no public path reaches (a private type in a public signature, or a
            # sealing trait): its definition path.
            return "::".join(path)
        return "::".join(self.dep_paths.get(path, path))

    # ---------------------------------------------------------------- types

    def ty(self, t):
        if t is None:
            return "()"
        k, v = one(t)
        if k == "resolved_path":
            return self.path(v)
        if k == "dyn_trait":
            parts = [self.poly_trait(p) for p in v["traits"]]
            if v.get("lifetime"):
                parts.append(v["lifetime"])
            return "dyn " + " + ".join(parts)
        if k in ("generic", "primitive"):
            return v
        if k == "function_pointer":
            return self.fn_pointer(v)
        if k == "tuple":
            inner = ", ".join(self.ty(x) for x in v)
            return "(" + inner + ("," if len(v) == 1 else "") + ")"
        if k == "slice":
            return "[" + self.ty(v) + "]"
        if k == "array":
            return "[" + self.ty(v["type"]) + "; " + one_line(v["len"]) + "]"
        if k == "pat":
            return self.ty(v["type"]) + " is " + one_line(v.get("__pat_unstable_do_not_use", "_"))
        if k == "impl_trait":
            return "impl " + self.bounds(v)
        if k == "infer":
            return "_"
        if k == "raw_pointer":
            return ("*mut " if v["is_mutable"] else "*const ") + self.pointee(v["type"])
        if k == "borrowed_ref":
            s = "&"
            if v.get("lifetime"):
                s += v["lifetime"] + " "
            if v["is_mutable"]:
                s += "mut "
            return s + self.pointee(v["type"])
        if k == "qualified_path":
            self_ty = self.ty(v["self_type"])
            args = self.generic_args(v.get("args"))
            if v.get("trait") is None:
                return self_ty + "::" + v["name"] + args
            return "<" + self_ty + " as " + self.path(v["trait"]) + ">::" + v["name"] + args
        raise ValueError(f"unknown type kind {k!r}")

    def pointee(self, t):
        """A type behind & or *: `&(dyn A + B)` needs the parentheses, `&dyn A` does not."""
        k, v = one(t)
        if k == "dyn_trait" and (len(v["traits"]) + (1 if v.get("lifetime") else 0)) > 1:
            return "(" + self.ty(t) + ")"
        if k == "impl_trait" and len(v) > 1:
            return "(" + self.ty(t) + ")"
        return self.ty(t)

    def path(self, p):
        return self.name_of(p["id"], p.get("path")) + self.generic_args(p.get("args"))

    def generic_args(self, args):
        if not args:
            return ""
        k, v = one(args)
        if k == "angle_bracketed":
            parts = [self.generic_arg(a) for a in v["args"]]
            parts += [self.constraint(c) for c in v["constraints"]]
            return "<" + ", ".join(parts) + ">" if parts else ""
        if k == "parenthesized":
            s = "(" + ", ".join(self.ty(x) for x in v["inputs"]) + ")"
            if v.get("output") is not None:
                s += " -> " + self.ty(v["output"])
            return s
        if k == "return_type_notation":
            return "(..)"
        raise ValueError(f"unknown generic args {k!r}")

    def generic_arg(self, a):
        k, v = one(a)
        if k == "lifetime":
            return v
        if k == "type":
            return self.ty(v)
        if k == "const":
            return one_line(v["expr"])
        if k == "infer":
            return "_"
        raise ValueError(f"unknown generic arg {k!r}")

    def constraint(self, c):
        s = c["name"] + self.generic_args(c.get("args"))
        k, v = one(c["binding"])
        if k == "equality":
            return s + " = " + self.term(v)
        return s + ": " + self.bounds(v)

    def term(self, t):
        k, v = one(t)
        return self.ty(v) if k == "type" else one_line(v["expr"])

    def hrtb(self, params):
        params = [self.generic_param(p) for p in params or () if not self.synthetic(p)]
        return "for<" + ", ".join(params) + "> " if params else ""

    def poly_trait(self, p):
        return self.hrtb(p.get("generic_params")) + self.path(p["trait"])

    def bound(self, b):
        k, v = one(b)
        if k == "trait_bound":
            modifier = {"none": "", "maybe": "?", "maybe_const": "~const "}[v.get("modifier", "none")]
            return self.hrtb(v.get("generic_params")) + modifier + self.path(v["trait"])
        if k == "outlives":
            return v
        if k == "use":
            return "use<" + ", ".join(one(a)[1] for a in v) + ">"
        raise ValueError(f"unknown bound {k!r}")

    def bounds(self, bs):
        return " + ".join(self.bound(b) for b in bs)

    @staticmethod
    def synthetic(p):
        k, v = one(p["kind"])
        return k == "type" and v.get("is_synthetic")

    def generic_param(self, p):
        k, v = one(p["kind"])
        if k == "lifetime":
            return p["name"] + (": " + " + ".join(v["outlives"]) if v["outlives"] else "")
        if k == "type":
            s = p["name"]
            if v["bounds"]:
                s += ": " + self.bounds(v["bounds"])
            if v.get("default") is not None:
                s += " = " + self.ty(v["default"])
            return s
        if k == "const":
            s = "const " + p["name"] + ": " + self.ty(v["type"])
            if v.get("default") is not None:
                s += " = " + one_line(v["default"])
            return s
        raise ValueError(f"unknown generic param {k!r}")

    def generics(self, g):
        params = [self.generic_param(p) for p in g["params"] if not self.synthetic(p)]
        return "<" + ", ".join(params) + ">" if params else ""

    def where_clause(self, g):
        preds = []
        for w in g["where_predicates"]:
            k, v = one(w)
            if k == "bound_predicate":
                s = self.hrtb(v.get("generic_params")) + self.ty(v["type"]) + ":"
                if v["bounds"]:
                    s += " " + self.bounds(v["bounds"])
                preds.append(s)
            elif k == "lifetime_predicate":
                preds.append(v["lifetime"] + ": " + " + ".join(v["outlives"]))
            elif k == "eq_predicate":
                preds.append(self.ty(v["lhs"]) + " = " + self.term(v["rhs"]))
            else:
                raise ValueError(f"unknown where predicate {k!r}")
        return " where " + ", ".join(preds) if preds else ""

    def header(self, h):
        s = ""
        if h.get("is_const"):
            s += "const "
        if h.get("is_async"):
            s += "async "
        if h.get("is_unsafe"):
            s += "unsafe "
        abi = h.get("abi", "Rust")
        if abi != "Rust":
            name, v = one(abi)
            if name == "Other":
                s += f"extern {rust_str(v.strip(chr(34)))} "
            else:
                abi_name = {"SysV64": "sysv64", "Win64": "win64"}.get(name, name.lower())
                if name == "C":
                    abi_name = "C"
                if v and v.get("unwind"):
                    abi_name += "-unwind"
                s += f'extern "{abi_name}" '
        return s

    def fn_pointer(self, f):
        sig = f["sig"]
        args = [self.ty(t) for _name, t in sig["inputs"]]
        if sig.get("is_c_variadic"):
            args.append("...")
        s = self.hrtb(f.get("generic_params")) + self.header(f["header"]) + "fn(" + ", ".join(args) + ")"
        if sig.get("output") is not None:
            s += " -> " + self.ty(sig["output"])
        return s

    def self_param(self, t):
        k, v = one(t)
        if k == "generic" and v == "Self":
            return "self"
        if k == "borrowed_ref" and one(v["type"]) == ("generic", "Self"):
            s = "&"
            if v.get("lifetime"):
                s += v["lifetime"] + " "
            if v["is_mutable"]:
                s += "mut "
            return s + "self"
        return "self: " + self.ty(t)

    def signature(self, func, path):
        sig = func["sig"]
        args = []
        for name, t in sig["inputs"]:
            args.append(self.self_param(t) if name == "self" else f"{name}: {self.ty(t)}")
        if sig.get("is_c_variadic"):
            args.append("...")
        s = self.header(func["header"]) + "fn " + path + self.generics(func["generics"])
        s += "(" + ", ".join(args) + ")"
        if sig.get("output") is not None:
            s += " -> " + self.ty(sig["output"])
        return s + self.where_clause(func["generics"])

    # ---------------------------------------------------------------- attributes

    def attrs(self, item):
        out, cfgs = [], []
        for attr in item.get("attrs", ()):
            name, v = one(attr)
            if name == "other":
                cfg = CfgTrace.render(v)
                if cfg is not None:
                    cfgs.append(cfg)
            elif name == "non_exhaustive":
                out.append("#[non_exhaustive]")
            elif name == "must_use":
                out.append("#[must_use]")
            elif name == "macro_export":
                out.append("#[macro_export]")
            elif name == "repr":
                out.append(self.repr(v))
            elif name == "no_mangle":
                out.append("#[no_mangle]")
            elif name == "export_name":
                out.append(f"#[export_name = {rust_str(v)}]")
        dep = item.get("deprecation")
        if dep is not None:
            parts = []
            if dep.get("since"):
                parts.append("since = " + rust_str(dep["since"]))
            if dep.get("note"):
                parts.append("note = " + rust_str(dep["note"]))
            out.append("#[deprecated" + ("(" + ", ".join(parts) + ")" if parts else "") + "]")
        if cfgs:
            out.insert(0, "#[cfg(" + (cfgs[0] if len(cfgs) == 1 else "all(" + ", ".join(cfgs) + ")") + ")]")
        return "".join(a + " " for a in out)

    @staticmethod
    def repr(r):
        parts = []
        kind = r.get("kind", "rust")
        if kind != "rust":
            parts.append({"c": "C"}.get(kind, kind))
        if r.get("int"):
            parts.append(r["int"])
        if r.get("align") is not None:
            parts.append(f"align({r['align']})")
        if r.get("packed") is not None:
            parts.append("packed" if r["packed"] == 1 else f"packed({r['packed']})")
        return "#[repr(" + (", ".join(parts) or "Rust") + ")]"

    # ---------------------------------------------------------------- listing

    def listing(self):
        """[(sort key, line)] for the whole crate."""
        out = []
        self.owned_impls = set()
        items = sorted(self.canonical.items(), key=lambda kv: kv[1])
        # Types first: the impls they claim are not listed again under their traits.
        for i, path in items:
            if kind_of(self.item(i)) in TYPE_KINDS:
                out += self.render_type(i, path)
        for i, path in items:
            kind = kind_of(self.item(i))
            if kind in TYPE_KINDS:
                continue
            if kind == "module":
                out.append(((path, 0), self.attrs(self.item(i)) + "pub mod " + "::".join(path)))
            elif kind == "trait":
                out += self.render_trait(i, path)
            else:
                line = self.render_simple(i, path)
                if line is not None:
                    out.append((self.item_key(path, kind), line))
            for alias in sorted(set(self.found[i]) - {path}):
                out.append((self.item_key(alias, kind, "use"), f"pub use {'::'.join(alias)} => {'::'.join(path)}"))
        for i, path in items:
            if kind_of(self.item(i)) in TYPE_KINDS:
                for alias in sorted(set(self.found[i]) - {path}):
                    out.append((self.item_key(alias, kind_of(self.item(i)), "use"),
                                f"pub use {'::'.join(alias)} => {'::'.join(path)}"))
        out += self.render_other_impls()
        for alias, vid in self.variant_aliases:
            target = self.variant_path(vid)
            out.append((self.item_key(alias, "variant", "use"), f"pub use {'::'.join(alias)} => {target}"))
        for alias, target in self.foreign_reexports:
            out.append((self.item_key(alias, "use", "use"), f"pub use {'::'.join(alias)} => {target}"))
        return out

    def render_other_impls(self):
        """Impls of the crate that are neither a listed type's nor a listed trait's (say
        `impl From<pglock::X> for alloc::string::String`, which rustdoc may attach to no type),
        when they name a public item: at the end of the crate root's items."""
        out = []
        for i, it in sorted(self.index.items(), key=lambda kv: int(kv[0])):
            if it.get("crate_id") != 0 or kind_of(it) != "impl" or i in self.owned_impls or self.hidden(it):
                continue
            impl = inner_of(it)
            if impl.get("blanket_impl") is not None or impl.get("is_synthetic") or impl.get("trait") is None:
                continue
            if not self.nameable(impl["for"]) or not self.names_public_item([impl["for"], impl["trait"]]):
                continue
            t = self.item(impl["trait"]["id"])
            if t is not None and str(impl["trait"]["id"]) not in self.canonical:
                continue  # an impl of a private trait
            header = self.impl_header(impl)
            key = ((self.crate_name,), 2, header)
            out.append((key + (0, ""), header))
            qualified = f"<{self.ty(impl['for'])} as {self.path(impl['trait'])}>"
            out += [(key + (1, k[1]), line) for k, line in self.impl_members(impl, qualified, inherent=False)]
        return out

    def names_public_item(self, node):
        if isinstance(node, dict):
            if "id" in node and "path" in node and str(node["id"]) in self.canonical:
                return True
            return any(self.names_public_item(v) for v in node.values())
        if isinstance(node, list):
            return any(self.names_public_item(v) for v in node)
        return False

    def variant_path(self, vid):
        for i, path in self.canonical.items():
            it = self.item(i)
            if kind_of(it) == "enum" and int(vid) in inner_of(it)["variants"]:
                return "::".join(path) + "::" + self.item(vid)["name"]
        return self.item(vid)["name"]

    @staticmethod
    def item_key(path, kind, *rest):
        name = path[-1]
        return (path[:-1], 1, name.lower(), name, KIND_RANK.get(kind, 9)) + ((0, rest[0]) if rest else (0, ""))

    def render_simple(self, i, path):
        it = self.item(i)
        kind, inner = kind_of(it), inner_of(it)
        attrs = self.attrs(it)
        p = "::".join(path)
        if kind == "function":
            return attrs + "pub " + self.signature(inner, p)
        if kind == "constant":
            return attrs + f"pub const {p}: {self.ty(inner['type'])}"
        if kind == "static":
            mut = "mut " if inner.get("is_mutable") else ""
            unsafe = "unsafe " if inner.get("is_unsafe") else ""
            return attrs + f"pub {unsafe}static {mut}{p}: {self.ty(inner['type'])}"
        if kind == "type_alias":
            g = inner["generics"]
            return attrs + f"pub type {p}{self.generics(g)}{self.where_clause(g)} = {self.ty(inner['type'])}"
        if kind == "macro":
            text = one_line(inner)
            text = re.sub(r"^macro_rules!\s*\S+", "macro_rules! " + p, text)
            return attrs + text
        if kind == "proc_macro":
            mkind = inner["kind"]
            if mkind == "derive":
                helpers = ", ".join(inner.get("helpers", ()))
                return attrs + f"#[proc_macro_derive] {p}" + (f" (attributes: {helpers})" if helpers else "")
            return attrs + ("#[proc_macro_attribute] " if mkind == "attr" else "#[proc_macro] ") + p
        if kind == "trait_alias":
            g = inner["generics"]
            return attrs + f"pub trait {p}{self.generics(g)} = {self.bounds(inner['params'])}{self.where_clause(g)}"
        if kind in ("primitive", "extern_crate"):
            return None
        if kind == "extern_type":
            return attrs + f"pub type {p}"
        raise ValueError(f"unknown item kind {kind!r} at {p}")

    # types -------------------------------------------------------------------

    def render_type(self, i, path):
        it = self.item(i)
        kind, inner = kind_of(it), inner_of(it)
        p = "::".join(path)
        g = inner["generics"]
        key = self.item_key(path, kind)[:-2]
        out = []
        decl = self.attrs(it) + f"pub {kind} {p}{self.generics(g)}"
        fields = []
        if kind == "struct":
            skind, sv = one(inner["kind"])
            if skind == "unit":
                decl += self.where_clause(g) + ";"
            elif skind == "tuple":
                decl += "(" + ", ".join(self.tuple_field(f) for f in sv) + ")" + self.where_clause(g) + ";"
            else:
                decl += self.where_clause(g)
                fields = sv["fields"]
                if sv["has_stripped_fields"]:
                    decl += " { /* private fields */ }"
        elif kind == "union":
            decl += self.where_clause(g)
            fields = inner["fields"]
            if inner["has_stripped_fields"]:
                decl += " { /* private fields */ }"
        else:
            decl += self.where_clause(g)
            if inner.get("has_stripped_variants"):
                decl += " { /* hidden variants */ }"
        out.append((key + (0,), decl))
        for n, fid in enumerate(fields):
            f = self.item(fid)
            if f is None or self.hidden(f) or f["visibility"] != "public":
                continue
            out.append((key + (1, n, -1), self.attrs(f) + f"pub {p}::{f['name']}: {self.ty(inner_of(f))}"))
        if kind == "enum":
            for n, vid in enumerate(inner["variants"]):
                out += [(key + (1, n) + k, line) for k, line in self.render_variant(vid, p)]
        out += [(key + k, line) for k, line in self.render_impls(inner["impls"], p)]
        return out

    def tuple_field(self, fid):
        if fid is None:
            return "/* private field */"
        f = self.item(fid)
        if f is None or self.hidden(f) or f["visibility"] != "public":
            return "/* private field */"
        return self.attrs(f) + "pub " + self.ty(inner_of(f))

    def render_variant(self, vid, p):
        v = self.item(vid)
        if v is None or self.hidden(v):
            return []
        inner = inner_of(v)
        vp = f"{p}::{v['name']}"
        vkind, vv = one(inner["kind"])
        out = []
        line = self.attrs(v) + "pub " + vp
        if vkind == "tuple":
            parts = []
            for fid in vv:
                f = self.item(fid) if fid is not None else None
                parts.append("_" if f is None or self.hidden(f) else self.attrs(f) + self.ty(inner_of(f)))
            line += "(" + ", ".join(parts) + ")"
        elif vkind == "struct":
            for n, fid in enumerate(vv["fields"]):
                f = self.item(fid)
                if f is None or self.hidden(f):
                    continue
                out.append(((n,), self.attrs(f) + f"pub {vp}::{f['name']}: {self.ty(inner_of(f))}"))
            if vv.get("has_stripped_fields"):
                line += " { /* private fields */ }"
        if inner.get("discriminant"):
            line += " = " + one_line(inner["discriminant"]["expr"])
        return [((-1,), line)] + out

    def impl_is_unsafe(self, impl):
        if impl.get("is_unsafe"):
            return True
        trait = impl.get("trait")
        if trait is None or impl.get("is_negative") or impl.get("is_synthetic"):
            return False
        t = self.item(trait["id"])
        if t is not None and kind_of(t) == "trait":
            return bool(inner_of(t).get("is_unsafe"))
        return self.name_of(trait["id"], trait.get("path")) in UNSAFE_TRAITS

    def impl_header(self, impl):
        g = impl["generics"]
        s = ("unsafe " if self.impl_is_unsafe(impl) else "") + "impl" + self.generics(g) + " "
        if impl.get("trait") is not None:
            s += ("!" if impl.get("is_negative") else "") + self.path(impl["trait"]) + " for "
        return s + self.ty(impl["for"]) + self.where_clause(g)

    def render_impls(self, impl_ids, p):
        """Keys (relative to the type's) and lines of the impls of one type."""
        out = []
        for iid in impl_ids:
            it = self.item(iid)
            if it is None or self.hidden(it):
                continue
            impl = inner_of(it)
            if impl.get("blanket_impl") is not None:
                continue
            self.owned_impls.add(str(iid))
            header = self.impl_header(impl)
            if impl.get("trait") is None:
                members = self.impl_members(impl, self.ty(impl["for"]), inherent=True)
                if not members:
                    continue
                out.append(((2, header, 0, "", ""), header))
                out += [((2, header, 1) + k, line) for k, line in members]
                continue
            trait_name = self.name_of(impl["trait"]["id"], impl["trait"].get("path"))
            if trait_name in UNNAMEABLE_TRAITS or self.private_local(impl["trait"]["id"]):
                continue
            if impl.get("is_synthetic"):
                if trait_name not in STABLE_AUTO_TRAITS and trait_name.rsplit("::", 1)[-1] in UNSTABLE_AUTO_TRAIT_NAMES:
                    continue
                out.append(((4, trait_name, header, 0, "", ""), header))
                continue
            qualified = f"<{self.ty(impl['for'])} as {self.path(impl['trait'])}>"
            out.append(((3, trait_name, header, 0, "", ""), header))
            out += [((3, trait_name, header, 1) + k, line)
                    for k, line in self.impl_members(impl, qualified, inherent=False)]
        return out

    def impl_members(self, impl, owner, inherent):
        """The listed members of an impl: [((kind rank, name), line)]."""
        out = []
        for mid in impl["items"]:
            m = self.item(mid)
            if m is None or self.hidden(m):
                continue
            if inherent and m["visibility"] != "public":
                continue
            kind, inner = kind_of(m), inner_of(m)
            attrs = self.attrs(m)
            name = m["name"]
            if kind == "function":
                if not inherent:
                    continue
                out.append(((2, name), attrs + "pub " + self.signature(inner, f"{owner}::{name}")))
            elif kind == "assoc_const":
                line = attrs + ("pub " if inherent else "") + f"const {owner}::{name}: {self.ty(inner['type'])}"
                out.append(((1, name), line))
            elif kind == "assoc_type":
                g = inner["generics"]
                line = attrs + ("pub " if inherent else "") + f"type {owner}::{name}{self.generics(g)}"
                if inner.get("type") is not None:
                    line += " = " + self.ty(inner["type"])
                out.append(((0, name), line + self.where_clause(g)))
        return out

    # traits ------------------------------------------------------------------

    def render_trait(self, i, path):
        it = self.item(i)
        inner = inner_of(it)
        p = "::".join(path)
        g = inner["generics"]
        key = self.item_key(path, "trait")[:-2]
        decl = self.attrs(it) + "pub "
        if inner.get("is_unsafe"):
            decl += "unsafe "
        if inner.get("is_auto"):
            decl += "auto "
        decl += "trait " + p + self.generics(g)
        if inner["bounds"]:
            decl += ": " + self.bounds(inner["bounds"])
        decl += self.where_clause(g)
        if self.sealed(inner):
            decl += " // sealed"
        out = [(key + (0,), decl)]
        for mid in inner["items"]:
            m = self.item(mid)
            if m is None or self.hidden(m):
                continue
            kind, mi = kind_of(m), inner_of(m)
            attrs = self.attrs(m)
            name = m["name"]
            if kind == "function":
                line = attrs + "pub " + self.signature(mi, f"{p}::{name}")
                if mi.get("has_body"):
                    line += " { ... }"
                out.append((key + (1, 2, name, line), line))
            elif kind == "assoc_type":
                mg = mi["generics"]
                line = attrs + f"pub type {p}::{name}{self.generics(mg)}"
                if mi["bounds"]:
                    line += ": " + self.bounds(mi["bounds"])
                line += self.where_clause(mg)
                if mi.get("type") is not None:
                    line += " = " + self.ty(mi["type"])
                out.append((key + (1, 0, name, line), line))
            elif kind == "assoc_const":
                line = attrs + f"pub const {p}::{name}: {self.ty(mi['type'])}"
                if mi.get("value") is not None:
                    line += " = ..."
                out.append((key + (1, 1, name, line), line))
        for iid in inner["implementations"]:
            if str(iid) in self.owned_impls:
                continue
            imp_item = self.item(iid)
            if imp_item is None or self.hidden(imp_item):
                continue
            impl = inner_of(imp_item)
            if impl.get("blanket_impl") is not None or not self.nameable(impl["for"]):
                continue
            self.owned_impls.add(str(iid))
            header = self.impl_header(impl)
            out.append((key + (3, header, 0, ""), header))
            qualified = f"<{self.ty(impl['for'])} as {self.path(impl['trait'])}>"
            out += [(key + (3, header, 1, k[1]), line)
                    for k, line in self.impl_members(impl, qualified, inherent=False)]
        return out

    def private_local(self, i):
        """Whether an id is an item of this crate that no public path reaches."""
        i = str(i)
        summary = self.paths.get(i)
        local = i in self.index or (summary is not None and summary["crate_id"] == 0)
        return local and i not in self.canonical

    def sealed(self, trait):
        for b in trait["bounds"]:
            k, v = one(b)
            if k == "trait_bound":
                tid = str(v["trait"]["id"])
                summary = self.paths.get(tid)
                local = tid in self.index or (summary is not None and summary["crate_id"] == 0)
                if local and tid not in self.canonical:
                    return True
        return False

    def nameable(self, t):
        """Whether a type implementing a trait is one a user can have: not a private local type."""
        k, v = one(t)
        if k == "resolved_path":
            i = str(v["id"])
            summary = self.paths.get(i)
            if (i in self.index or (summary and summary["crate_id"] == 0)) and i not in self.canonical:
                return False
        if k == "borrowed_ref" or k == "raw_pointer":
            return self.nameable(v["type"])
        return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="rustdoc JSON of the crate (target/doc/CRATE.json)")
    ap.add_argument("--package", help="the package's name, for the header (default: the crate's)")
    ap.add_argument("--features", default="", help="comma-separated features, for the header")
    ap.add_argument("--dep", action="append", default=[],
                    help="rustdoc JSON of a crate this one depends on: its items are written at their public paths")
    args = ap.parse_args()

    def load(path):
        with open(path, encoding="utf-8") as f:
            krate = json.load(f)
        version = krate.get("format_version")
        if version not in KNOWN_FORMAT_VERSIONS:
            print(f"public-api.py: {path} is rustdoc JSON format_version {version}; this script knows "
                  f"{KNOWN_FORMAT_VERSIONS.start} to {KNOWN_FORMAT_VERSIONS.stop - 1}: check its output",
                  file=sys.stderr)
        return krate

    deps = [Api(load(d)) for d in args.dep]
    api = Api(load(args.json), deps)
    package = args.package or api.crate_name
    features = [f for f in args.features.split(",") if f and f != "default"]
    lines = [
        f"// The public API of the crate `{package}` with all its features on (--all-features"
        + (": " + ", ".join(features) if features else ": it has none") + ").",
        "// Generated by scripts/api-listing.sh --write from rustdoc JSON; do not edit by hand.",
        "// Rules (paths, order, what is left out): scripts/public-api.py.",
        "",
    ]
    seen = set()
    for _key, line in sorted(api.listing(), key=lambda kl: (kl[0], kl[1])):
        line = one_line(line)
        if line not in seen:
            seen.add(line)
            lines.append(line)
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
