//! The score/softmax/value part of attention over the KV cache, spread over the compute
//! threads (the projections around it are products like any other). Each task takes one KV
//! head and every query head of its GQA group, so a head's cached keys and values are read
//! once for the whole group (`kernels::attn`: an online softmax, block by block):
//! - decode (one token): one task per (KV head, split of `attn::SPLIT` positions), their
//!   partial states merged in position order afterwards (flash-decoding), so a long context
//!   spreads over the threads while a short one is a task per KV head;
//! - prefill: one task per (KV head, tile of [`TILE`] tokens), each folding its splits in order.
//!
//! A query's result is the same bits either way and at any thread count (`kernels::attn`).

use std::sync::OnceLock;

use moescope_kernels::attn::{self, State};

use super::kv_cache::KvCache;
use crate::exec::{Chunks, Exec};
use crate::trace;

/// Tokens per prefill task: with a GQA group of 8 heads, 128 query rows share each block of
/// keys and values while it is in L1.
pub const TILE: usize = 16;

/// The shape of one layer's attention heads.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    /// query heads, KV heads, head dimension
    pub nh: usize,
    pub nkv: usize,
    pub hd: usize,
}

/// `attn[t, h] = softmax(q[t, h] k^T / sqrt(hd)) v` over layer `l`'s cached positions
/// `0..=pos0 + t` of KV head `h / (nh / nkv)`, for the `t_n` tokens at positions
/// `pos0..pos0 + t_n`; `q` and `attn` are `[t_n, nh, hd]`, and the cache already holds these
/// tokens' keys and values.
pub fn attend(exec: &Exec, kv: &KvCache, l: usize, shape: Heads, q: &[f32], pos0: usize, attn: &mut [f32]) {
    let Heads { nh, nkv, hd } = shape;
    let t_n = q.len() / (nh * hd);
    debug_assert_eq!(attn.len(), q.len());
    let span = trace::span("heads").arg("heads", nh).arg("tokens", t_n).arg("kv_len", pos0 + t_n);
    let key = if span.is_recording() { trace::next_id() } else { 0 };
    let flows = span.flows_out(exec.threads());
    let task_span = |p: usize| {
        let s = trace::span("heads").merge_with(key);
        trace::flow_in(flows.map(|b| b + p as u64), key);
        s
    };
    let (isa, scale, group) = (exec.isa, 1.0 / (hd as f32).sqrt(), nh / nkv);
    if t_n == 1 {
        decode(exec, kv, l, shape, q, pos0, attn, &task_span);
        drop(span);
        return;
    }
    let tiles = t_n.div_ceil(TILE);
    let out = Chunks::new(attn);
    exec.run(nkv * tiles, &|task, p| {
        let _c = task_span(p);
        // the latest tiles first: they attend over the most positions, and a long task
        // claimed last would leave the other threads waiting for it
        let (h, t0) = (task % nkv, (tiles - 1 - task / nkv) * TILE);
        let t1 = (t0 + TILE).min(t_n);
        // the tile's query rows (token-major, the group's heads within a token) and their ends
        let rows = (t1 - t0) * group;
        let mut qt = Vec::with_capacity(rows * hd);
        let mut ends = Vec::with_capacity(rows);
        for t in t0..t1 {
            let at = (t * nh + h * group) * hd;
            qt.extend_from_slice(&q[at..at + group * hd]);
            ends.extend(std::iter::repeat_n(pos0 + t + 1, group));
        }
        let (keys, vals) = kv.head(l, h, pos0 + t1);
        let (mut acc, mut part) = (State::new(rows, hd), State::new(rows, hd));
        let mut o = vec![0f32; rows * hd];
        attn::attend(isa, &qt, &ends, keys, vals, scale, &mut acc, &mut part, &mut o);
        for (i, t) in (t0..t1).enumerate() {
            let at = (t * nh + h * group) * hd;
            // SAFETY: this task alone writes token t's heads of KV head h, inside `attn`,
            // which outlives the section
            unsafe { out.slice(at, group * hd) }.copy_from_slice(&o[i * group * hd..(i + 1) * group * hd]);
        }
    });
    drop(span);
}

/// One token: a task per (KV head, split), then the splits merged per KV head.
#[allow(clippy::too_many_arguments)]
fn decode(
    exec: &Exec,
    kv: &KvCache,
    l: usize,
    shape: Heads,
    q: &[f32],
    pos0: usize,
    attn: &mut [f32],
    task_span: &(dyn Fn(usize) -> trace::Span + Sync),
) {
    let Heads { nh, nkv, hd } = shape;
    let (isa, scale, group) = (exec.isa, 1.0 / (hd as f32).sqrt(), nh / nkv);
    let n = pos0 + 1;
    let splits: Vec<_> = attn::splits(n).collect();
    let ends = vec![n; group];
    let parts: Vec<OnceLock<State>> = (0..nkv * splits.len()).map(|_| OnceLock::new()).collect();
    exec.run(parts.len(), &|task, p| {
        let _c = task_span(p);
        let (h, s) = (task / splits.len(), task % splits.len());
        let (keys, vals) = kv.head(l, h, n);
        let mut st = State::new(group, hd);
        attn::fold(isa, &q[h * group * hd..(h + 1) * group * hd], &ends, keys, vals, splits[s].clone(), scale, &mut st);
        let _ = parts[task].set(st);
    });
    for h in 0..nkv {
        let mut acc = State::new(group, hd);
        for part in &parts[h * splits.len()..(h + 1) * splits.len()] {
            // every task ran (the section returns after all of them)
            if let Some(p) = part.get() {
                acc.merge(p);
            }
        }
        for g in 0..group {
            let at = (h * group + g) * hd;
            acc.finish(g, &mut attn[at..at + hd]);
        }
    }
}
