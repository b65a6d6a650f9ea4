#!/usr/bin/env python3
"""Plain text from the mdBook `print.html` pages that ship with the Rust toolchain
(the `rust-docs` rustup component; MIT OR Apache-2.0).

usage: rust_docs_corpus.py OUT.txt [--heldout OUT_EVAL.txt --heldout-frac 0.05]

The text keeps paragraphs and code blocks (code matters: the demo model talks about Rust),
drops navigation, scripts, styles and the mdBook chrome. Books are read in a fixed order so
the output is reproducible for a given toolchain. The held-out split takes every 20th
paragraph block (not a contiguous tail), so evaluation text covers every book.
"""
import argparse
import html
import os
import re
import subprocess
from html.parser import HTMLParser

BOOKS = ["book", "reference", "nomicon", "rust-by-example", "edition-guide", "embedded-book",
         "cargo", "rustc", "style-guide", "unstable-book"]
SKIP_TAGS = {"script", "style", "nav", "head", "button", "title"}
BLOCK_TAGS = {"p", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "li", "blockquote", "tr", "div", "dt", "dd",
              "table", "ul", "ol", "section", "main", "br"}


class Extract(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.skip = 0
        self.in_main = False
        self.pre = 0
        self.out = []

    def handle_starttag(self, tag, attrs):
        if tag in SKIP_TAGS:
            self.skip += 1
        if tag == "main":
            self.in_main = True
        if tag == "pre":
            self.pre += 1
        if tag in BLOCK_TAGS:
            self.out.append("\n\n" if tag != "br" else "\n")

    def handle_endtag(self, tag):
        if tag in SKIP_TAGS and self.skip:
            self.skip -= 1
        if tag == "main":
            self.in_main = False
        if tag == "pre" and self.pre:
            self.pre -= 1
        if tag in BLOCK_TAGS:
            self.out.append("\n\n")

    def handle_data(self, data):
        if self.skip or not self.in_main:
            return
        if self.pre:
            self.out.append(data)
        else:
            self.out.append(re.sub(r"\s+", " ", data))


def book_text(path):
    p = Extract()
    p.feed(open(path, encoding="utf-8").read())
    text = html.unescape("".join(p.out))
    # collapse the blank lines the block tags produce; keep code indentation
    blocks = [b.strip("\n") for b in re.split(r"\n\s*\n", text)]
    return [b for b in blocks if b.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--heldout")
    ap.add_argument("--heldout-every", type=int, default=20)
    args = ap.parse_args()
    sysroot = subprocess.check_output(["rustc", "--print", "sysroot"], text=True).strip()
    root = os.path.join(sysroot, "share", "doc", "rust", "html")
    train, held = [], []
    for b in BOOKS:
        path = os.path.join(root, b, "print.html")
        if not os.path.exists(path):
            continue
        for i, block in enumerate(book_text(path)):
            (held if args.heldout and i % args.heldout_every == args.heldout_every - 1 else train).append(block)
    open(args.out, "w", encoding="utf-8").write("\n\n".join(train) + "\n")
    if args.heldout:
        open(args.heldout, "w", encoding="utf-8").write("\n\n".join(held) + "\n")
    print(f"train {sum(map(len, train))} chars in {len(train)} blocks; held-out {sum(map(len, held))} chars")


if __name__ == "__main__":
    main()
