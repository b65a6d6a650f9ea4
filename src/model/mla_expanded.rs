//! Latent attention in its expanded form, for a prompt's batch of tokens: each head's keys and
//! values are made from the cached compressed kv (`k_h = [W_UK_h c, k_pe]`, `v_h = W_UV_h c`:
//! `nope + rope` and `v` dims, transformers' own form), and the head attends over those.
//! The absorbed form (`mla.rs`) scores every query against the 576 cached dims and weighs the
//! 512-dim kv before its value projection; a batch of T tokens over P positions then costs
//! `T P (2 r + rope)` multiply-adds a head where this form costs `P r (nope + v)` to expand
//! the keys and values plus `T P (nope + rope + v)`: at DeepSeek-V3's shape, with T and P in
//! the hundreds, about half. Decode (T = 1) stays absorbed. The two forms are the same sums in
//! another order (within f32 rounding: tests/reference_logits.rs holds prompt and decoded
//! tokens to transformers at 2e-5, and the engine's decode to its one-pass prompt at 1e-4),
//! where the up-projections are float: quantized ones (a GGUF's Q8_0 `attn_v_b`) take the
//! absorbed form's query or latent output quantized to int8, as every quantized product's
//! input, which this form's f32 keys and values never are (0.01 logits apart on
//! tests/deepseek.rs's file, each within its q8 bounds of transformers).
//!
//! A head is one task: its keys and values made a split of [`attn::SPLIT`] positions at a
//! time (the memory bounded whatever the context), every query of the batch folded over each
//! split and the splits merged in order, so the bits depend on neither the thread count nor
//! which thread takes the head.

use moescope_kernels::attn::{self, Expansion, KEY_BLOCK, State};
use moescope_kernels::{Isa, Mat};

use super::kv_cache::KvCache;
use crate::exec::{Chunks, Exec};
use crate::model_config::Mla;
use crate::trace;

/// Whether the expanded form costs fewer multiply-adds for `t_n` tokens from position `pos0`
/// (a function of the batch's shape alone, so the same batch always runs the same form).
pub fn pays(m: &Mla, t_n: usize, pos0: usize) -> bool {
    let (r, rope, nope, v) = (m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim);
    let p = pos0 + t_n;
    // the positions the batch's queries see, all told
    let seen = t_n * pos0 + t_n * (t_n + 1) / 2;
    // absorbed: the batch's queries and outputs through k_b and v_b, then 576 + 512 dims a key
    let absorbed = t_n * r * (nope + v) + seen * (2 * r + rope);
    let expanded = p * r * (nope + v) + seen * (nope + rope + v);
    t_n > 1 && expanded < absorbed
}

/// One head's buffers, on the thread that runs it.
#[derive(Default)]
struct HeadWork {
    /// the head's key and value up-projections, packed
    kx: Expansion,
    vx: Expansion,
    row: Vec<f32>,
    /// a split's keys `[blocks, nope + rope, KEY_BLOCK]`, values transposed `[blocks, v,
    /// KEY_BLOCK]` and as rows `[positions, v]`
    keys: Vec<f32>,
    vt: Vec<f32>,
    vals: Vec<f32>,
    /// a split's compressed kv (`[blocks, r + rope, KEY_BLOCK]`) widened from the cache's
    /// two-byte elements (an f32 cache is read in place)
    wide: Vec<f32>,
    /// the head's queries `[T, nope + rope]` and their ends within a split
    q: Vec<f32>,
    split_ends: Vec<usize>,
    acc: Option<State>,
    part: Option<State>,
}

thread_local! {
    static HEAD: std::cell::RefCell<HeadWork> = std::cell::RefCell::new(HeadWork::default());
}

/// The layer's cached kv and its up-projections.
pub struct Latent<'a> {
    pub kv: &'a KvCache,
    pub layer: usize,
    pub m: Mla,
    pub heads: usize,
    /// `[heads r, nope]` and `[heads v, r]`
    pub k_b: &'a Mat<'a>,
    pub v_b: &'a Mat<'a>,
}

/// `out[t, h] = softmax(q[t, h] k_h^T * scale, causal) v_h` (`q`: `[T, heads, nope + rope]`, its
/// rotary part turned; `out`: `[T, heads, v]`) for the `T` tokens at `pos0..`, whose kv the
/// cache already holds.
pub fn attend(exec: &Exec, lat: &Latent<'_>, q: &[f32], pos0: usize, out: &mut [f32]) {
    let (nh, m) = (lat.heads, lat.m);
    let (nope, rope, vd) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
    let hd = nope + rope;
    let t_n = q.len() / (nh * hd);
    let _s = trace::span("heads").arg("heads", nh).arg("tokens", t_n).arg("kv_len", pos0 + t_n).arg("form", "expanded");
    let dst = Chunks::new(out);
    exec.run(nh, &|h, _| {
        let _t = trace::span("head");
        HEAD.with_borrow_mut(|w| {
            let st = head(exec.isa, lat, h, (q, pos0), w);
            for t in 0..t_n {
                // SAFETY: task h alone writes head h of every token, inside `out`, which
                // outlives the section
                st.finish(t, None, unsafe { dst.slice((t * nh + h) * vd, vd) });
            }
        })
    });
}

/// Head `h`'s attention state for every query of the batch (in `w`).
fn head<'w>(isa: Isa, lat: &Latent<'_>, h: usize, (q, pos0): (&[f32], usize), w: &'w mut HeadWork) -> &'w State {
    let (nh, m) = (lat.heads, lat.m);
    let (r, nope, rope, vd) = (m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
    let (hd, ck) = (nope + rope, r + rope);
    let t_n = q.len() / (nh * hd);
    let HeadWork { kx, vx, row, keys, vt, vals, wide, q: qh, split_ends, acc, part } = w;
    // k_b's rows h r .. are W_UK_h transposed (`[r, nope]`), v_b's rows h v .. W_UV_h (`[v, r]`)
    kx.set_rows((r, nope), row, |i, out| lat.k_b.dequant_row(h * r + i, out));
    vx.set_cols((r, vd), row, |j, out| lat.v_b.dequant_row(h * vd + j, out));
    qh.clear();
    (0..t_n).for_each(|t| qh.extend_from_slice(&q[(t * nh + h) * hd..][..hd]));
    let acc = acc.get_or_insert_with(|| State::new(0, vd));
    let part = part.get_or_insert_with(|| State::new(0, vd));
    if acc.hd != vd {
        (*acc, *part) = (State::new(0, vd), State::new(0, vd));
    }
    acc.reset(t_n);
    let sc = attn::Scoring::full(m.softmax_scale);
    let (cache, _) = lat.kv.head(lat.layer, 0, pos0 + t_n);
    for s in attn::splits(pos0 + t_n) {
        let (b0, blocks) = (s.start / KEY_BLOCK, s.len().div_ceil(KEY_BLOCK));
        let span = b0 * ck * KEY_BLOCK..(b0 + blocks) * ck * KEY_BLOCK;
        let c: &[f32] = match cache {
            attn::Cached::F32(x) => &x[span],
            other => {
                other.widen_into(span, wide);
                wide
            }
        };
        keys.resize(blocks * hd * KEY_BLOCK, 0.0);
        vt.resize(blocks * vd * KEY_BLOCK, 0.0);
        kx.apply(isa, (c, ck), (keys, hd));
        vx.apply(isa, (c, ck), (vt, vd));
        for (cb, kb) in c.chunks_exact(ck * KEY_BLOCK).zip(keys.chunks_exact_mut(hd * KEY_BLOCK)) {
            // the rotary key every head shares, after the head's own dims
            kb[nope * KEY_BLOCK..].copy_from_slice(&cb[r * KEY_BLOCK..]);
        }
        vals.resize(s.len() * vd, 0.0);
        for (p, v) in vals.chunks_exact_mut(vd).enumerate() {
            let b = p / KEY_BLOCK * vd * KEY_BLOCK + p % KEY_BLOCK;
            v.iter_mut().enumerate().for_each(|(d, v)| *v = vt[b + d * KEY_BLOCK]);
        }
        // query t sees positions up to pos0 + t, counted within the split: a query ending
        // before it sees none of it
        split_ends.clear();
        split_ends.extend((0..t_n).map(|t| (pos0 + t + 1).saturating_sub(s.start).min(s.len())));
        part.reset(t_n);
        attn::fold_keyed(isa, (qh, hd), split_ends, &keys[..], attn::Values::Rows(&vals[..]), 0..s.len(), sc, part);
        acc.merge(part);
    }
    acc
}
