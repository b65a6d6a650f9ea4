//! Seeded mutations of an input: bytewise (bit flips, interesting bytes and integers written
//! over fields, truncation, deleted, repeated and inserted runs) and structural (a JSON value
//! replaced by an extreme one, a key dropped, deep nesting; inside a bundle, one part at a
//! time, so the others stay valid).

use moescope::fuzzing::{bundle, unbundle};
use moescope::package::layout::{HEADER_SIZE, Header};
use serde_json::Value;

/// xorshift64*: the same cases for the same seed on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// In `0..n` (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

/// Integers that sit on the edges readers get wrong: zero, one, signs, powers of two around
/// the 32- and 64-bit limits and the sizes a file can hold.
const INTERESTING: [u64; 14] = [
    0,
    1,
    2,
    0x7F,
    0x80,
    0xFF,
    0xFFFF,
    0x7FFF_FFFF,
    0x8000_0000,
    0xFFFF_FFFF,
    1 << 32,
    1 << 40,
    0x7FFF_FFFF_FFFF_FFFF,
    u64::MAX,
];

/// JSON values that stress a reader: extremes of each type and shapes it may not expect.
fn extreme_json(rng: &mut Rng) -> Value {
    match rng.below(14) {
        0 => Value::from(0),
        1 => Value::from(-1),
        2 => Value::from(1_000_000_000u64),
        3 => Value::from(1u64 << 40),
        4 => Value::from(u64::MAX),
        5 => Value::from(1e308),
        6 => Value::from(-1e308),
        7 => Value::from(0.5),
        8 => Value::from(""),
        9 => Value::from("x".repeat(1 << rng.below(17))),
        10 => Value::Null,
        11 => Value::from(true),
        12 => Value::Array((0..rng.below(64)).map(|i| Value::from(i as u64)).collect()),
        _ => {
            // nesting a recursive reader may not survive
            let mut v = Value::Null;
            for _ in 0..(1 << rng.below(12)) {
                v = Value::Array(vec![v]);
            }
            v
        }
    }
}

/// Every place in `v` (a path of keys and indices), up to `limit` of them.
fn places(v: &Value, at: &mut Vec<Vec<Place>>, path: &mut Vec<Place>, limit: usize) {
    if at.len() >= limit {
        return;
    }
    at.push(path.clone());
    match v {
        Value::Object(o) => {
            for k in o.keys() {
                path.push(Place::Key(k.clone()));
                places(&o[k], at, path, limit);
                path.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate().take(64) {
                path.push(Place::Index(i));
                places(x, at, path, limit);
                path.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone)]
enum Place {
    Key(String),
    Index(usize),
}

fn get_mut<'a>(v: &'a mut Value, path: &[Place]) -> Option<&'a mut Value> {
    let mut cur = v;
    for p in path {
        cur = match p {
            Place::Key(k) => cur.get_mut(k.as_str())?,
            Place::Index(i) => cur.get_mut(*i)?,
        };
    }
    Some(cur)
}

/// A structural change to JSON text: a value replaced by an extreme one, or a key removed;
/// None when `data` is not JSON.
fn mutate_json(rng: &mut Rng, data: &[u8]) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(data).ok()?;
    let mut all = vec![];
    places(&v, &mut all, &mut vec![], 4096);
    let path = all.get(rng.below(all.len()))?.clone();
    let remove = rng.below(4) == 0;
    match (remove, path.split_last()) {
        (true, Some((Place::Key(k), parent))) => {
            if let Some(Value::Object(o)) = get_mut(&mut v, parent) {
                o.remove(k.as_str());
            }
        }
        _ => {
            let x = extreme_json(rng);
            if let Some(slot) = get_mut(&mut v, &path) {
                *slot = x;
            }
        }
    }
    serde_json::to_vec(&v).ok()
}

/// One bytewise change; offsets favour the first 64 bytes and the first 4 KiB, where headers,
/// counts and indices are.
fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>) {
    let len = data.len();
    let at = |rng: &mut Rng| match rng.below(4) {
        0 => rng.below(len.min(64)),
        1 => rng.below(len.min(4096)),
        _ => rng.below(len),
    };
    match rng.below(8) {
        0 if len > 0 => {
            for _ in 0..1 + rng.below(8) {
                let i = at(rng);
                data[i] ^= 1 << rng.below(8);
            }
        }
        1 if len > 0 => {
            let i = at(rng);
            data[i] = [0u8, 1, 0x7F, 0x80, 0xFF][rng.below(5)];
        }
        // an integer field: 4 or 8 bytes, little-endian, at a 4-aligned offset
        2 | 3 if len >= 8 => {
            let i = at(rng).min(len - 8) & !3;
            let v = INTERESTING[rng.below(INTERESTING.len())];
            let w = if rng.below(2) == 0 { 4 } else { 8 };
            data[i..i + w].copy_from_slice(&v.to_le_bytes()[..w]);
        }
        4 => data.truncate(rng.below(len + 1)),
        5 if len > 0 => {
            let i = at(rng);
            let n = 1 + rng.below((len - i).min(256));
            data.drain(i..i + n);
        }
        6 if len > 0 => {
            let i = at(rng);
            let n = 1 + rng.below((len - i).min(256));
            let run = data[i..i + n].to_vec();
            let times = 1 + rng.below(16);
            for _ in 0..times {
                data.splice(i..i, run.iter().copied());
            }
        }
        _ => {
            let i = rng.below(len + 1);
            let n = 1 + rng.below(32);
            let junk: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            data.splice(i..i, junk);
        }
    }
}

/// A package's header, None if it does not decode.
fn header(data: &[u8]) -> Option<Header> {
    Header::decode(data.get(..HEADER_SIZE as usize)?).ok()
}

/// Where the header says the metadata JSON lies, None if that is not inside `data`.
fn meta_range(h: &Header, data: &[u8]) -> Option<std::ops::Range<usize>> {
    let start = usize::try_from(h.meta_offset).ok()?;
    let end = start.checked_add(usize::try_from(h.meta_len).ok()?)?;
    data.get(start..end)?;
    Some(start..end)
}

/// A change inside a .moe package that keeps its header and metadata checksums whole (so it
/// reaches the readers behind them): its metadata JSON changed structurally (the model config,
/// the tensor index, the expert table), or one header field set to an edge value; None if
/// `data` has no readable header or the new metadata does not fit before the dense tensors.
fn mutate_package(rng: &mut Rng, data: &[u8]) -> Option<Vec<u8>> {
    let h = header(data)?;
    let mut out = data.to_vec();
    let mut h2 = h;
    if rng.below(3) != 0 {
        let meta_at = meta_range(&h, data)?;
        let o = meta_at.start;
        let meta = &data[meta_at];
        let m = mutate_json(rng, meta)?;
        if m.len() > (h.dense_offset as usize).saturating_sub(o) {
            return None;
        }
        out[o..o + m.len()].copy_from_slice(&m);
        h2.meta_len = m.len() as u64;
        h2.meta_xxh3 = xxhash_rust::xxh3::xxh3_64(&m);
    } else {
        let v = INTERESTING[rng.below(INTERESTING.len())];
        match rng.below(7) {
            0 => h2.file_size = v,
            1 => h2.meta_offset = v,
            2 => h2.meta_len = v,
            3 => h2.dense_offset = v,
            4 => h2.dense_len = v,
            5 => h2.expert_offset = v,
            _ => h2.expert_len = v,
        }
    }
    out[..HEADER_SIZE as usize].copy_from_slice(&h2.encode());
    Some(out)
}

/// Where a package's checksummed ranges are, from its metadata: (offset, length, where the f32
/// scales start if it has any, its checksum's hex): each dense tensor and each expert blob.
fn checksummed(meta: &Value) -> Vec<(u64, u64, Option<u64>, String)> {
    let mut out = vec![];
    for t in meta["tensors"].as_array().into_iter().flatten() {
        if let (Some(off), Some(len), Some(x)) = (t["offset"].as_u64(), t["length"].as_u64(), t["xxh3"].as_str()) {
            out.push((off, len, t["scales_offset"].as_u64(), x.to_string()));
        }
    }
    let ex = &meta["experts"];
    let (blob, parts) = (ex["blob_len"].as_u64().unwrap_or(0), ex["parts"].as_array());
    for (i, e) in ex["table"].as_array().into_iter().flatten().enumerate() {
        if let (Some(off), Some(x)) = (e[0].as_u64(), e[1].as_str()) {
            // the scales of one of the blob's parts (relative to the blob start)
            let scales = parts.and_then(|p| p.get(i % p.len().max(1))).and_then(|p| p["scales_offset"].as_u64());
            out.push((off, blob, scales.map(|s| off + s), x.to_string()));
        }
    }
    out
}

/// Values a quantization scale must not hold, or holds rarely.
const ODD_SCALES: [f32; 8] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-45, 3e38, -3e38];

/// A change inside one dense tensor or expert blob with its checksum rewritten to match (and
/// the metadata's and the header's), so the bytes get past verification to the kernels: a
/// scale set to NaN, an infinity, zero, a subnormal or a huge value, or quantized values
/// overwritten. None if `data` has no readable metadata.
fn mutate_tensor(rng: &mut Rng, data: &[u8]) -> Option<Vec<u8>> {
    let h = header(data)?;
    let meta_at = meta_range(&h, data)?;
    let (mo, meta_end) = (meta_at.start, meta_at.end);
    let meta: Value = serde_json::from_slice(data.get(mo..meta_end)?).ok()?;
    let spans = checksummed(&meta);
    if spans.is_empty() {
        return None;
    }
    let (off, len, scales, old) = spans[rng.below(spans.len())].clone();
    let (start, end) = (usize::try_from(off).ok()?, usize::try_from(off.checked_add(len)?).ok()?);
    data.get(start..end)?;
    let mut out = data.to_vec();
    match scales.and_then(|s| usize::try_from(s).ok()).filter(|&s| s >= start && s + 4 <= end) {
        Some(s) if rng.below(3) != 0 => {
            let at = s + rng.below((end - s) / 4) * 4;
            let v = ODD_SCALES[rng.below(ODD_SCALES.len())];
            out[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        _ if end > start => {
            for _ in 0..1 + rng.below(8) {
                let at = start + rng.below(end - start);
                out[at] = rng.next() as u8;
            }
        }
        _ => return None,
    }
    let new = moescope::package::layout::hex64(xxhash_rust::xxh3::xxh3_64(&out[start..end]));
    let at = mo + data[mo..meta_end].windows(old.len()).position(|w| w == old.as_bytes())?;
    if new.len() != old.len() {
        return None;
    }
    out[at..at + new.len()].copy_from_slice(new.as_bytes());
    let mut h2 = h;
    h2.meta_xxh3 = xxhash_rust::xxh3::xxh3_64(&out[mo..meta_end]);
    out[..HEADER_SIZE as usize].copy_from_slice(&h2.encode());
    Some(out)
}

/// One change to `data`: structural for JSON (a third of the time), else bytewise.
fn mutate_one(rng: &mut Rng, data: &[u8]) -> Vec<u8> {
    if rng.below(3) == 0
        && let Some(j) = mutate_json(rng, data)
    {
        return j;
    }
    let mut d = data.to_vec();
    mutate_bytes(rng, &mut d);
    d
}

/// How a target's inputs are built, so mutations land inside the parts.
#[derive(Clone, Copy, PartialEq)]
pub enum Shape {
    /// One file.
    Whole,
    /// A bundle of named files (see `moescope::fuzzing::bundle`).
    Bundle,
    /// A selector byte, then a body.
    Tagged,
    /// A .moe package: two thirds of the changes keep its checksums whole (`mutate_package`:
    /// header and metadata; `mutate_tensor`: a tensor's bytes with its checksum).
    Package,
    /// An argument vector, words joined by NUL: `args::Files::mutate` changes it word by word
    /// (it knows each command's flags); here, bytewise.
    Args,
}

/// 1 to 3 changes to `seed`, by its shape.
pub fn mutate(rng: &mut Rng, seed: &[u8], shape: Shape) -> Vec<u8> {
    let mut d = seed.to_vec();
    for _ in 0..1 + rng.below(3) {
        d = match shape {
            Shape::Whole | Shape::Args => mutate_one(rng, &d),
            Shape::Package => match rng.below(3) {
                0 => mutate_package(rng, &d).unwrap_or_else(|| mutate_one(rng, &d)),
                1 => mutate_tensor(rng, &d).unwrap_or_else(|| mutate_one(rng, &d)),
                _ => mutate_one(rng, &d),
            },
            Shape::Tagged if !d.is_empty() && rng.below(8) != 0 => {
                let mut out = vec![d[0]];
                out.extend(mutate_one(rng, &d[1..]));
                out
            }
            Shape::Tagged => mutate_one(rng, &d),
            Shape::Bundle => {
                let mut parts = unbundle(&d);
                if parts.is_empty() || rng.below(16) == 0 {
                    // the container itself
                    mutate_one(rng, &d)
                } else {
                    let i = rng.below(parts.len());
                    if rng.below(16) == 0 {
                        parts.remove(i);
                    } else {
                        parts[i].1 = mutate_one(rng, &parts[i].1);
                    }
                    let refs: Vec<(&str, &[u8])> = parts.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
                    bundle(&refs)
                }
            }
        };
    }
    d
}
