//! The element types a KV cache keeps keys and values in (`--cache-type-k` / `-ctk`,
//! `--cache-type-v` / `-ctv`, llama.cpp's names), and one layer's buffer of them.
//!
//! bf16 is the default: half of f32's bytes (96 KiB a token at Qwen3-30B-A3B's shape, against
//! 192), rounded once when stored, and attention widens what it reads (`kernels::attn::elem`).
//! f16 keeps 3 more mantissa bits in a narrower range (llama.cpp's default); f32 is exact.
//! q8_0 is llama.cpp's block format (`kernels::attn::q8`): 32 values of a row share an f16
//! scale, 34 bytes per 32 values (51 KiB a token at Qwen3-30B-A3B's shape); it needs a head
//! dimension that is a multiple of 32 ([`KvTypes::check`]).

use std::fmt;
use std::str::FromStr;

use moescope_kernels::attn::{Bf16, Cached, F16, KEY_BLOCK, KvElem, Q8Keys, Q8Rows, as_elems, q8};

/// A KV cache's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvType {
    F32,
    #[default]
    Bf16,
    F16,
    Q8_0,
}

impl KvType {
    /// Bytes `n` elements take (`n` a multiple of 32 for q8_0: whole blocks).
    pub fn bytes(self, n: usize) -> usize {
        match self {
            KvType::F32 => 4 * n,
            KvType::Bf16 | KvType::F16 => 2 * n,
            KvType::Q8_0 => n + n / q8::Q8_GROUP * 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::Bf16 => "bf16",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }
}

impl FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<KvType, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "bf16" => Ok(KvType::Bf16),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            other => Err(format!("unknown KV cache type '{other}' (expected f32, bf16, f16 or q8_0)")),
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The keys' and the values' element types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl KvTypes {
    /// Keys and values in f32: what the references (transformers' eager attention) compute.
    pub const F32: KvTypes = KvTypes { k: KvType::F32, v: KvType::F32 };

    /// Whether a cache of rows `hd` wide can keep these types: q8_0's blocks of 32 must tile a
    /// row, as llama.cpp requires.
    pub fn check(self, hd: usize) -> Result<(), String> {
        match [self.k, self.v].contains(&KvType::Q8_0) && !hd.is_multiple_of(q8::Q8_GROUP) {
            true => {
                Err(format!("a q8_0 KV cache needs a head dimension that is a multiple of 32 (this model's is {hd})"))
            }
            false => Ok(()),
        }
    }
}

impl fmt::Display for KvTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.k == self.v { write!(f, "{}", self.k) } else { write!(f, "K {} / V {}", self.k, self.v) }
    }
}

/// One layer's keys or values. Two-byte elements are kept as their bits: a `u16` buffer is
/// allocated zeroed, so its pages cost RAM only as positions fill them. q8_0 keeps its codes
/// and its scales apart, laid out for keys or for values (`kernels::attn::q8`).
pub(super) enum Buf {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    F16(Vec<u16>),
    Q8 { codes: Vec<i8>, scales: Vec<u16>, keys: bool },
}

impl Buf {
    /// `n` elements of `t`, keys (transposed blocks) or values (rows).
    pub(super) fn new(t: KvType, n: usize, keys: bool) -> Buf {
        match t {
            KvType::F32 => Buf::F32(vec![0.0; n]),
            KvType::Bf16 => Buf::Bf16(vec![0; n]),
            KvType::F16 => Buf::F16(vec![0; n]),
            KvType::Q8_0 => Buf::Q8 { codes: vec![0; n], scales: vec![0; n / q8::Q8_GROUP], keys },
        }
    }

    pub(super) fn kind(&self) -> KvType {
        match self {
            Buf::F32(_) => KvType::F32,
            Buf::Bf16(_) => KvType::Bf16,
            Buf::F16(_) => KvType::F16,
            Buf::Q8 { .. } => KvType::Q8_0,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.view().is_empty()
    }

    /// The whole buffer as attention reads it.
    pub(super) fn view(&self) -> Cached<'_> {
        self.part(0, self.len())
    }

    /// Elements stored.
    pub(super) fn len(&self) -> usize {
        match self {
            Buf::F32(x) => x.len(),
            Buf::Bf16(x) | Buf::F16(x) => x.len(),
            Buf::Q8 { codes, .. } => codes.len(),
        }
    }

    /// Elements `at..at + n` as attention reads them (for q8_0, `at` a head's start and `n`
    /// whole key blocks or rows: multiples of 32 that keep the scales' layout).
    pub(super) fn part(&self, at: usize, n: usize) -> Cached<'_> {
        match self {
            Buf::F32(x) => Cached::F32(&x[at..at + n]),
            Buf::Bf16(x) => Cached::Bf16(as_elems(&x[at..at + n])),
            Buf::F16(x) => Cached::F16(as_elems(&x[at..at + n])),
            Buf::Q8 { codes, scales, keys } => {
                let (c, s) = (&codes[at..at + n], as_elems(&scales[at / q8::Q8_GROUP..(at + n) / q8::Q8_GROUP]));
                if *keys { Cached::Q8Keys(Q8Keys::new(c, s)) } else { Cached::Q8Rows(Q8Rows::new(c, s)) }
            }
        }
    }

    /// `src`'s elements `from..from + n` copied to `at..` (the same type and role: checked by
    /// the caller; for q8_0 all three multiples of 32, as [`part`](Self::part)'s).
    pub(super) fn copy_from(&mut self, at: usize, src: &Buf, from: usize, n: usize) {
        match (self, src) {
            (Buf::F32(d), Buf::F32(s)) => d[at..at + n].copy_from_slice(&s[from..from + n]),
            (Buf::Bf16(d), Buf::Bf16(s)) | (Buf::F16(d), Buf::F16(s)) => {
                d[at..at + n].copy_from_slice(&s[from..from + n])
            }
            (Buf::Q8 { codes: dc, scales: ds, .. }, Buf::Q8 { codes: sc, scales: ss, .. }) => {
                dc[at..at + n].copy_from_slice(&sc[from..from + n]);
                let g = q8::Q8_GROUP;
                ds[at / g..(at + n) / g].copy_from_slice(&ss[from / g..(from + n) / g]);
            }
            _ => unreachable!("copy between caches of other element types"),
        }
    }

    /// The buffer cut in `parts` equal runs (a layer's KV heads), for the tasks of a section to
    /// write one run each.
    pub(super) fn heads(&mut self, parts: usize) -> Heads<'_> {
        let per = self.len() / parts.max(1);
        let (ptr, scales, kind) = match self {
            Buf::F32(x) => (x.as_mut_ptr().cast(), std::ptr::null_mut(), KvType::F32),
            Buf::Bf16(x) => (x.as_mut_ptr().cast(), std::ptr::null_mut(), KvType::Bf16),
            Buf::F16(x) => (x.as_mut_ptr().cast(), std::ptr::null_mut(), KvType::F16),
            Buf::Q8 { codes, scales, .. } => (codes.as_mut_ptr().cast(), scales.as_mut_ptr(), KvType::Q8_0),
        };
        Heads { ptr, scales, per, parts, kind, _buf: std::marker::PhantomData }
    }
}

/// A layer's buffer cut in runs of `per` elements, shared by the tasks that write them (one run
/// each: nothing is allocated to hand them out, as a warm forward pass allocates nothing).
pub(super) struct Heads<'a> {
    ptr: *mut u8,
    /// q8_0's scales (`per / 32` a run), else null
    scales: *mut u16,
    per: usize,
    parts: usize,
    kind: KvType,
    _buf: std::marker::PhantomData<&'a mut Buf>,
}

// SAFETY: the runs are disjoint, and `head`'s caller takes each one at a time
unsafe impl Sync for Heads<'_> {}

impl Heads<'_> {
    /// Run `h`, writable.
    ///
    /// # Safety
    /// No other live [`HeadMut`] of run `h`.
    pub(super) unsafe fn head(&self, h: usize) -> HeadMut<'_> {
        assert!(h < self.parts, "KV head {h} of {}", self.parts);
        let at = h * self.per;
        // SAFETY: run h lies inside the buffer (parts x per elements of its type, from `ptr`),
        // it is this call's alone (the caller's guarantee), and the borrow of the buffer lives
        // as long as `self`
        unsafe {
            match self.kind {
                KvType::F32 => HeadMut::F32(std::slice::from_raw_parts_mut(self.ptr.cast::<f32>().add(at), self.per)),
                KvType::Bf16 => {
                    HeadMut::Bf16(std::slice::from_raw_parts_mut(self.ptr.cast::<Bf16>().add(at), self.per))
                }
                KvType::F16 => HeadMut::F16(std::slice::from_raw_parts_mut(self.ptr.cast::<F16>().add(at), self.per)),
                KvType::Q8_0 => {
                    let g = q8::Q8_GROUP;
                    HeadMut::Q8(
                        std::slice::from_raw_parts_mut(self.ptr.cast::<i8>().add(at), self.per),
                        std::slice::from_raw_parts_mut(self.scales.cast::<F16>().add(at / g), self.per / g),
                    )
                }
            }
        }
    }
}

/// One KV head's run of a layer's buffer, writable.
pub(super) enum HeadMut<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [Bf16]),
    F16(&'a mut [F16]),
    /// codes and scales
    Q8(&'a mut [i8], &'a mut [F16]),
}

impl HeadMut<'_> {
    /// Values `src` stored as the row at `at` (rounded to the element type).
    pub(super) fn store_row(&mut self, at: usize, src: &[f32]) {
        fn store<E: KvElem>(dst: &mut [E], src: &[f32]) {
            dst.iter_mut().zip(src).for_each(|(d, &x)| *d = E::from_f32(x));
        }
        let n = src.len();
        match self {
            HeadMut::F32(x) => x[at..at + n].copy_from_slice(src),
            HeadMut::Bf16(x) => store(&mut x[at..at + n], src),
            HeadMut::F16(x) => store(&mut x[at..at + n], src),
            HeadMut::Q8(codes, scales) => q8::store_row(codes, scales, at, src),
        }
    }

    /// Key `src` (`[hd]`) of position `pos` into its block's column (`[hd, KEY_BLOCK]` blocks
    /// from the head's start).
    pub(super) fn store_key(&mut self, pos: usize, src: &[f32]) {
        fn store<E: KvElem>(kh: &mut [E], pos: usize, src: &[f32]) {
            let hd = src.len();
            let kb = &mut kh[pos / KEY_BLOCK * KEY_BLOCK * hd..][..hd * KEY_BLOCK];
            for (d, &x) in src.iter().enumerate() {
                kb[d * KEY_BLOCK + pos % KEY_BLOCK] = E::from_f32(x);
            }
        }
        match self {
            HeadMut::F32(x) => store(x, pos, src),
            HeadMut::Bf16(x) => store(x, pos, src),
            HeadMut::F16(x) => store(x, pos, src),
            HeadMut::Q8(codes, scales) => q8::store_key(codes, scales, pos, src),
        }
    }
}
