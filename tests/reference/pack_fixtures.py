#!/usr/bin/env python3
# usage: pack_fixtures.py pack | unpack | check        (from the repository's root)
#
# The tracked tree stays under 60 MiB, so a device call carries it whole with the lean binary in
# xz beside it (issue 41; checkpoints that are a committed fixture's weights in another layout
# are derived at test time instead, src/derived_fixture.rs): the large
# test fixtures, the demo's weights and the real tokenizers are kept as NAME.xz (src/packed.rs
# reads them; its module doc is the format). A safetensors file's tensors are split into byte
# planes before xz: each value's first bytes together, then its second ones, ... (for f32 and
# bf16 the sign-and-exponent bytes are much alike, so they compress). Reference files lose the
# tensors no test reads first (UNREAD below), nothing else.
#
#   pack     every file of PACK at least MIN_BYTES long -> NAME.xz (NAME removed; a NAME.gz is
#            unzipped first, so .gz files become .xz), and MANIFEST in each root: the unpacked
#            file's CRC-32, size and path. Run it after a fixture script has written new files.
#   unpack   every NAME.xz back to NAME, in place (the device scripts read fixtures as files).
#   check    every NAME.xz unpacks to the bytes its MANIFEST names.
import gzip, json, lzma, os, struct, sys, zlib

# the folders whose large files are packed, each with a MANIFEST of its own
ROOTS = ["tests/fixtures", "src/demo", "assets/tokenizers"]
MIN_BYTES = 10_000
# the test fixtures' smaller data files too (reference JSON, configs, tiny.gguf): the tree's
# last KiBs under 60 MiB (the demo's and the tokenizers' small files stay plain for the binary);
# below 500 bytes xz's own framing eats what it saves
MIN_BYTES_OF = {"tests/fixtures": 500}
# reference tensors no test reads (tests/*.rs read logits, gen_logits, forced_logits, router_topk_idx,
# router_margin, gen_margin, the ids, and the GGUF logits of the committed files' types)
UNREAD = {"hidden_states", "router_logits", "router_topk_weight",
          "logits_f16", "logits_f32", "logits_q4_1", "logits_q5_0", "logits_q5_k_m", "logits_q6_k"}
WIDTH = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}


def split_header(b):
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), 8 + n


def regroup(b, to_planes):
    header, start = split_header(b)
    out = bytearray(b)
    for name, t in header.items():
        if name == "__metadata__":
            continue
        w = WIDTH.get(t["dtype"], 1)
        s, e = (start + o for o in t["data_offsets"])
        if w == 1 or (e - s) % w:
            continue
        data, n = b[s:e], (e - s) // w
        if to_planes:
            out[s:e] = b"".join(data[i::w] for i in range(w))
        else:
            v = bytearray(e - s)
            for i in range(w):
                v[i::w] = data[i * n:(i + 1) * n]
            out[s:e] = v
    return bytes(out)


def strip_unread(b):
    """A reference file without the UNREAD tensors (the others' bytes as they were)."""
    header, start = split_header(b)
    keep = {k: v for k, v in header.items() if k not in UNREAD}
    if len(keep) == len(header):
        return b
    data, out, at = b[start:], {}, 0
    parts = []
    for k, v in sorted(keep.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1):
        if k == "__metadata__":
            out[k] = v
            continue
        s, e = v["data_offsets"]
        parts.append(data[s:e])
        out[k] = dict(v, data_offsets=[at, at + e - s])
        at += e - s
    h = json.dumps(out, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(parts)


def manifest_path(root):
    return os.path.join(root, "MANIFEST")


def read_manifest(root):
    m = {}
    if os.path.exists(manifest_path(root)):
        for line in open(manifest_path(root)):
            if line.strip() and not line.startswith("#"):
                crc, size, name = line.split()
                m[name] = (crc, int(size))
    return m


def write_manifest(root, m):
    with open(manifest_path(root), "w") as f:
        f.write("# CRC-32 SIZE PATH of each packed file once unpacked (tests/reference/pack_fixtures.py)\n")
        for name in sorted(m):
            f.write(f"{m[name][0]} {m[name][1]} {name}\n")


def files(root):
    for d, _, names in os.walk(root):
        for n in sorted(names):
            yield os.path.join(d, n)


def pack():
    for root in ROOTS:
        m = read_manifest(root)
        for p in list(files(root)):
            if os.path.islink(p) or p.endswith(".xz") or os.path.basename(p) == "MANIFEST":
                continue
            # what a harness or a person reads as text beside the data stays plain
            # (a held-out text is data the tests read through the unpacked folder)
            text = p.endswith((".md", ".txt", ".jinja", ".py", ".sh")) and not p.endswith("heldout.txt")
            if text or "/corpus/" in p or "LICENSE" in p:
                continue
            if os.path.getsize(p) < MIN_BYTES_OF.get(root, MIN_BYTES):
                continue
            b = open(p, "rb").read()
            plain = p
            if p.endswith(".gz"):
                b, plain = gzip.decompress(b), p[:-3]
            if plain.endswith("reference.safetensors"):
                b = strip_unread(b)
            m[os.path.relpath(plain, root)] = (f"{zlib.crc32(b):08x}", len(b))
            body = regroup(b, True) if plain.endswith(".safetensors") else b
            open(plain + ".xz", "wb").write(lzma.compress(body, preset=9 | lzma.PRESET_EXTREME))
            os.remove(p)
            print(f"{plain}.xz: {len(b)} -> {os.path.getsize(plain + '.xz')} bytes")
        # a link to a file now packed (a fixture that is the demo's checkpoint) links the packed one
        for p in list(files(root)):
            t = os.readlink(p) if os.path.islink(p) else None
            target = os.path.join(os.path.dirname(p), t) if t else None
            if target and not os.path.exists(target) and os.path.exists(target + ".xz"):
                os.remove(p)
                os.symlink(t + ".xz", p + ".xz")
                b = unpacked(target + ".xz")
                m[os.path.relpath(p, root)] = (f"{zlib.crc32(b):08x}", len(b))
        write_manifest(root, m)


def unpacked(p):
    b = lzma.decompress(open(p, "rb").read())
    return regroup(b, False) if p.endswith(".safetensors.xz") else b


def unpack():
    for root in ROOTS:
        for p in list(files(root)):
            if p.endswith(".xz") and not os.path.islink(p):
                open(p[:-3], "wb").write(unpacked(p))
                os.remove(p)
        # links to packed files (a fixture that is the demo's checkpoint) point at the plain file
        for p in list(files(root)):
            if p.endswith(".xz") and os.path.islink(p):
                t = os.readlink(p)
                os.remove(p)
                os.symlink(t[:-3], p[:-3])


def check():
    bad = 0
    for root in ROOTS:
        m = read_manifest(root)
        for p in files(root):
            if p.endswith(".xz"):
                b = unpacked(p)
                want = m.get(os.path.relpath(p[:-3], root))
                if want != (f"{zlib.crc32(b):08x}", len(b)):
                    print(f"{p}: unpacks to bytes {manifest_path(root)} does not name")
                    bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    {"pack": pack, "unpack": unpack, "check": check}[sys.argv[1] if len(sys.argv) > 1 else "check"]()
