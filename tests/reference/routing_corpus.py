#!/usr/bin/env python3
"""The training text of the routing model (train_routing.py): three freely licensed sources,
as plain text in blocks separated by blank lines, every 20th block held out.

usage: routing_corpus.py OUT_DIR [--pydoc DIR]

- The Rust books that ship with the toolchain (`rust-docs`: MIT OR Apache-2.0), as
  rust_docs_corpus.py extracts them.
- The Rust standard library's API pages (`std/`, same component and licence): the text of
  each page's main content (item declarations, doc comments, examples), in a fixed order.
- Python 3.11's documentation (Debian's `python3.11-doc`, PSF License 2.0): its reStructuredText
  sources as shipped under html/_sources (`apt-get download python3.11-doc`, `dpkg-deb -x`,
  then pass .../usr/share/doc/python3.11/html as --pydoc).

Distinct domains (prose about Rust, API reference, Python prose and code) give the experts
something to specialise on. OUT_DIR gets train.txt, heldout.txt and sources.json (source,
licence, characters).
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_docs_corpus import BOOKS, book_text  # noqa: E402

HELD_EVERY = 20


def std_pages(root):
    """The std API pages in a fixed order (the all-items list left out)."""
    out = []
    for d, subdirs, files in os.walk(os.path.join(root, "std")):
        subdirs.sort()
        for f in sorted(files):
            if f.endswith(".html") and f != "all.html":
                out.append(os.path.join(d, f))
    return out


def api_clean(block):
    """rustdoc's chrome inside the main content: section anchors, source links, toggles."""
    lines = []
    for ln in block.replace("\u00a7", "").split("\n"):
        ln = re.sub(r"\s*(\d+\.\d+\.\d+ )?\u00b7 Source\s*$|\s*Source\s*$", "", ln)
        if ln.strip() not in ("Expand description", "Show 1 variant", ""):
            lines.append(ln)
    return "\n".join(lines)


def rst_blocks(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    return [b.strip("\n") for b in re.split(r"\n\s*\n", text) if b.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--pydoc")
    args = ap.parse_args()
    sysroot = subprocess.check_output(["rustc", "--print", "sysroot"], text=True).strip()
    root = os.path.join(sysroot, "share", "doc", "rust", "html")
    sources = []
    train, held = [], []

    def add(name, licence, blocks):
        n = 0
        for b in blocks:
            # long runs of near-empty blocks (navigation leftovers) carry no language
            if len(b) < 3:
                continue
            (held if (len(train) + len(held)) % HELD_EVERY == HELD_EVERY - 1 else train).append(b)
            n += len(b)
        sources.append(dict(source=name, licence=licence, chars=n))
        print(f"{name}: {n} chars", flush=True)

    books = []
    for b in BOOKS:
        p = os.path.join(root, b, "print.html")
        if os.path.exists(p):
            books += book_text(p)
    add("rust-docs books (" + ", ".join(BOOKS) + ")", "MIT OR Apache-2.0", books)
    api = []
    for p in std_pages(root):
        api += [api_clean(b) for b in book_text(p)]
    add("rust-docs std API pages", "MIT OR Apache-2.0", api)
    if args.pydoc:
        py = []
        src = os.path.join(args.pydoc, "_sources")
        for d, subdirs, files in os.walk(src):
            subdirs.sort()
            for f in sorted(files):
                if f.endswith(".rst.txt"):
                    py += rst_blocks(os.path.join(d, f))
        add("Python 3.11 documentation (Debian python3.11-doc, reST sources)", "PSF-2.0", py)
    os.makedirs(args.out, exist_ok=True)
    open(os.path.join(args.out, "train.txt"), "w", encoding="utf-8").write("\n\n".join(train) + "\n")
    open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8").write("\n\n".join(held) + "\n")
    json.dump(sources, open(os.path.join(args.out, "sources.json"), "w"), indent=1)
    print(f"train {sum(map(len, train))} chars in {len(train)} blocks; held-out {sum(map(len, held))} chars")


if __name__ == "__main__":
    main()
