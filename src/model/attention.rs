//! The attention block and its score/softmax/value part over the KV cache.
//!
//! For T tokens at positions `pos0..pos0+T`, `hn` normed (`[T, H]`):
//! ```text
//! q = hn Wq (+ bq) [T, nh*hd], k = hn Wk (+ bk) [T, nkv*hd], v = hn Wv (+ bv)
//! q, k: rms_norm per head over hd (q_norm, k_norm: the Qwen families, GLM-4.5 optionally),
//!       then rotate-half RoPE (on the first rotary_dim dims: all of hd, or part in the
//!       hybrids and GLM-4.5); k, v -> KV cache
//! a = softmax(q k^T / sqrt(hd), causal) v   (GQA: query head j reads kv head j / (nh/nkv))
//!     sliding layers (gpt-oss): only the `window` latest positions
//!     sinks (gpt-oss): head j's softmax has one more term, exp(sink_j), in its denominator
//! gated (Qwen3-Next, Qwen3.5): a *= sigmoid(hn Wg)   (one gate per output value)
//! delta = a Wo (+ bo: gpt-oss)
//! ```
//! The score part is spread over the compute threads (the projections around it are products
//! like any other). Each task takes one KV head and every query head of its GQA group, so a
//! head's cached keys and values are read once for the whole group (`kernels::attn`: an online
//! softmax, block by block):
//! - decode (one token): one task per (KV head, split of `attn::SPLIT` positions), their
//!   partial states merged in position order afterwards (flash-decoding), so a long context
//!   spreads over the threads while a short one is a task per KV head;
//! - prefill: one task per (KV head, tile of [`tile_tokens`] tokens), each folding its splits in
//!   order.
//!
//! A query's result is the same bits either way and at any thread count (`kernels::attn`).

use std::sync::Mutex;

use smallvec::SmallVec;

use moescope_kernels::attn::{self, State};
use moescope_kernels::ops::mul_sigmoid;

use super::error::ModelError;
use super::kv_cache::KvCache;
use super::pass::Pass;
use super::rows::{Angles, HeadPrep, add_bias_rows, prepare_heads};
use super::run_state::RunState;
use crate::exec::{Chunks, Exec};
use crate::model_config::ModelConfig;
use crate::package::{Package, TensorId};
use crate::trace;

/// How attention's output is shaped before `o_proj`.
#[derive(Debug, Clone, Copy)]
pub enum Output {
    /// softmax attention as it is (Qwen3-MoE)
    Plain,
    /// each value times the sigmoid of its own gate, `hn Wg` (`o_gate_proj`: Qwen3-Next, Qwen3.5)
    Gated(TensorId),
}

/// The projections' biases: `[nh*hd]`, `[nkv*hd]`, `[nkv*hd]`, and `[H]` f32 (gpt-oss; GLM-4.5
/// has none on o).
#[derive(Debug, Clone, Copy)]
struct Biases {
    q: TensorId,
    k: TensorId,
    v: TensorId,
    o: Option<TensorId>,
}

/// One attention layer's tensors (package names under `model.layers.{l}.self_attn.`) and shapes.
pub struct Attention {
    q: TensorId,
    k: TensorId,
    v: TensorId,
    o: TensorId,
    /// q_norm and k_norm, `[hd]` f32 each (the Qwen families)
    qk_norm: Option<(TensorId, TensorId)>,
    bias: Option<Biases>,
    /// `[nh]` f32: each head's sink logit (gpt-oss)
    sinks: Option<TensorId>,
    /// the positions a query attends, itself included, in a sliding layer
    window: Option<usize>,
    output: Output,
    heads: Heads,
    /// RoPE turns the first `2 * rotary_half` dims of each head
    rotary_half: usize,
    hidden: usize,
    eps: f32,
}

impl Attention {
    /// The block under `prefix`; gated where the model is a hybrid, with the biases, sinks and
    /// `window` (this layer's) where the model has them.
    pub fn load(pkg: &Package, prefix: &str, c: &ModelConfig, window: Option<usize>) -> Result<Attention, ModelError> {
        let (h, hd) = (c.hidden_size, c.head_dim);
        let m = |name: &str, shape: &[usize]| pkg.require(&format!("{prefix}{name}.weight"), shape, false);
        let v = |name: &str, len: usize| pkg.require(&format!("{prefix}{name}"), &[len], true);
        let qk_norm = match c.qk_norm() {
            true => Some((v("q_norm.weight", hd)?, v("k_norm.weight", hd)?)),
            false => None,
        };
        let bias = match c.features.attention_bias || c.features.qkv_bias {
            true => Some(Biases {
                q: v("q_proj.bias", c.q_dim())?,
                k: v("k_proj.bias", c.kv_dim())?,
                v: v("v_proj.bias", c.kv_dim())?,
                o: if c.features.attention_bias { Some(v("o_proj.bias", h)?) } else { None },
            }),
            false => None,
        };
        let sinks = match c.features.attention_sinks {
            true => Some(v("sinks", c.num_attention_heads)?),
            false => None,
        };
        Ok(Attention {
            q: m("q_proj", &[c.q_dim(), h])?,
            k: m("k_proj", &[c.kv_dim(), h])?,
            v: m("v_proj", &[c.kv_dim(), h])?,
            o: m("o_proj", &[h, c.q_dim()])?,
            qk_norm,
            bias,
            sinks,
            window,
            output: match c.hybrid {
                Some(_) => Output::Gated(m("o_gate_proj", &[c.q_dim(), h])?),
                None => Output::Plain,
            },
            heads: Heads { nh: c.num_attention_heads, nkv: c.num_key_value_heads, hd, hv: hd, keyed: false },
            rotary_half: c.rotary_dim() / 2,
            hidden: h,
            eps: c.rms_norm_eps as f32,
        })
    }

    /// Layer `l`'s attention over the pass's normed rows (`st.hn`), each sequence's at its
    /// positions, their keys and values appended to its cache; the result (before the residual
    /// add) in `st.delta`.
    pub fn forward(&self, pass: &mut Pass<'_, '_>, l: usize) {
        let (exec, pkg, t_n) = (pass.exec, pass.pkg, pass.t_n);
        let (h, Heads { nh, nkv, hd, .. }) = (self.hidden, self.heads);
        let _att = trace::span("attention").arg("layer", l).arg("tokens", t_n).arg("pos", pass.pos0());
        let RunState { hn, delta, q, gate, k, v, qkv, attn, cos, sin, attn_work, scratch: s, .. } = &mut *pass.st;
        let (hn, out) = (&hn[..t_n * h], &mut delta[..t_n * h]);
        let (q, k, v) = (&mut q[..t_n * nh * hd], &mut k[..t_n * nkv * hd], &mut v[..t_n * nkv * hd]);
        let (wq, wk, wv) = (pkg.mat_by_index(self.q), pkg.mat_by_index(self.k), pkg.mat_by_index(self.v));
        let wg = match self.output {
            Output::Gated(g) => Some(pkg.mat_by_index(g)),
            Output::Plain => None,
        };
        let gate = &mut gate[..if wg.is_some() { t_n * nh * hd } else { 0 }];
        if t_n == 1 {
            // decode: all in one parallel section (its pieces cross from q into k and v),
            // one quantization of the normed input
            let (qd, kvd, gd) = (nh * hd, nkv * hd, gate.len());
            let qkv = &mut qkv[..qd + gd + 2 * kvd];
            match &wg {
                Some(wg) => exec.matvec_concat("qkv_proj", &[&wq, wg, &wk, &wv], hn, qkv, s),
                None => exec.matvec_concat("qkv_proj", &[&wq, &wk, &wv], hn, qkv, s),
            }
            let (qp, rest) = qkv.split_at(qd);
            let (gp, kv_part) = rest.split_at(gd);
            q.copy_from_slice(qp);
            gate.copy_from_slice(gp);
            k.copy_from_slice(&kv_part[..kvd]);
            v.copy_from_slice(&kv_part[kvd..]);
        } else {
            // one quantization of the normed input for all of them
            match &wg {
                Some(wg) => {
                    let mut prods = [
                        ("q_proj", &wq, &mut *q),
                        ("o_gate_proj", wg, &mut *gate),
                        ("k_proj", &wk, &mut *k),
                        ("v_proj", &wv, &mut *v),
                    ];
                    exec.matmul_shared(hn, t_n, &mut prods, s);
                }
                None => {
                    let mut prods = [("q_proj", &wq, &mut *q), ("k_proj", &wk, &mut *k), ("v_proj", &wv, &mut *v)];
                    exec.matmul_shared(hn, t_n, &mut prods, s);
                }
            }
        }
        // each head of each token biased, normed and rotated by its position (the rows in
        // parallel)
        let rope = Angles { cos, sin, half: self.rotary_half };
        let f = |id: TensorId| pkg.f32_by_index(id);
        let (qn, kn) = match self.qk_norm {
            Some((qn, kn)) => (Some((f(qn), self.eps)), Some((f(kn), self.eps))),
            None => (None, None),
        };
        let bias = self.bias.map(|b| (f(b.q), f(b.k), f(b.v), b.o.map(f)));
        let (qb, kb) = (bias.map(|b| b.0), bias.map(|b| b.1));
        prepare_heads(exec, "q_norm_rope", q, HeadPrep { width: nh * hd, hd, bias: qb, norm: qn }, rope);
        prepare_heads(exec, "k_norm_rope", k, HeadPrep { width: nkv * hd, hd, bias: kb, norm: kn }, rope);
        if let Some(b) = bias {
            add_bias_rows(exec, "v_bias", v, b.2);
        }
        let attn = &mut attn[..t_n * nh * hd];
        // each sequence over its own cache
        for s in pass.seqs.iter_mut() {
            s.kv.write_rows(exec, l, s.pos0, s.of(k, nkv * hd), s.of(v, nkv * hd));
            let (window, sinks) = (self.window, self.sinks.map(f));
            let at = At { layer: l, heads: self.heads, pos0: s.pos0, window, sinks, scale: None };
            attend(exec, s.kv, at, s.of(q, nh * hd), s.of_mut(attn, nh * hd), attn_work);
        }
        // gated attention: each output value times sigmoid of its gate
        if !gate.is_empty() {
            let gate = &gate[..];
            exec.rows_mut("attn_gate", attn, nh * hd, &|r, a| {
                mul_sigmoid(a, &gate[r.start * nh * hd..r.end * nh * hd]);
            });
        }
        exec.matmul("o_proj", &pkg.mat_by_index(self.o), attn, t_n, out, s);
        if let Some(bo) = bias.and_then(|b| b.3) {
            add_bias_rows(exec, "o_bias", out, bo);
        }
    }
}

/// Tokens per prefill task at most: with a GQA group of 8 heads, 128 query rows share each
/// block of keys and values while it is in L1.
pub const TILE: usize = 16;

/// Query rows a prefill task aims at: DeepSeek-V3's latent attention (128 heads on one cache
/// row, 512-wide states) takes 4 tokens a task rather than 16, so a task's states (1 MiB) stay
/// in L2 (its tile of 16 x 128 rows: 5% slower per (query, key) in benches/attention.rs).
const TILE_ROWS: usize = 512;

/// Tokens per prefill task for `group` query heads a KV head.
pub fn tile_tokens(group: usize) -> usize {
    (TILE_ROWS / group.max(1)).clamp(1, TILE)
}

/// The shape of one layer's attention heads.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    /// query heads, KV heads, query and key dimension
    pub nh: usize,
    pub nkv: usize,
    pub hd: usize,
    /// value (and output) dimension: `hd`, or the compressed kv's in DeepSeek's absorbed
    /// latent attention
    pub hv: usize,
    /// the values are each key's first `hv` dims (the cache holds no values of their own)
    pub keyed: bool,
}

/// What attention works in, kept between passes: decode's partial states, one per (KV head,
/// split), and the merge's; prefill's tile buffers, one set per compute thread.
pub struct AttnWork {
    parts: Vec<Mutex<State>>,
    acc: State,
    tiles: Vec<Mutex<Tile>>,
}

/// One prefill task's tile: its query rows, their ends and sinks, two softmax states and the
/// output.
struct Tile {
    qt: Vec<f32>,
    ends: Vec<usize>,
    sinks: Vec<f32>,
    acc: State,
    part: State,
    o: Vec<f32>,
}

impl Default for AttnWork {
    fn default() -> AttnWork {
        AttnWork { parts: Vec::new(), acc: State::new(0, 0), tiles: Vec::new() }
    }
}

impl AttnWork {
    /// One tile per compute thread, for `rows` queries of `hd` values and outputs of `hv` (each
    /// sized for a whole tile, whichever tasks its thread claims).
    fn tiles(&mut self, threads: usize, rows: usize, hd: usize, hv: usize) -> &[Mutex<Tile>] {
        let fresh = || {
            let st = || State::new(rows, hv);
            Mutex::new(Tile {
                qt: vec![0.0; rows * hd],
                ends: vec![0; rows],
                sinks: vec![0.0; rows],
                acc: st(),
                part: st(),
                o: vec![0.0; rows * hv],
            })
        };
        let stale = |t: &Tile| t.acc.hd != hv || t.ends.capacity() < rows || t.qt.capacity() < rows * hd;
        if self.tiles.first().is_some_and(|t| t.lock().map_or(true, |t| stale(&t))) {
            self.tiles.clear();
        }
        if self.tiles.len() < threads {
            self.tiles.resize_with(threads, fresh);
        }
        &self.tiles
    }

    /// `n` states of `nq` queries of `hd` values (grown when a longer context needs more).
    fn fit(&mut self, n: usize, nq: usize, hd: usize) {
        if self.acc.hd != hd {
            (self.parts, self.acc) = (Vec::new(), State::new(nq, hd));
        }
        if self.parts.len() < n {
            self.parts.resize_with(n, || Mutex::new(State::new(nq, hd)));
        }
    }
}

/// Where a batch's queries attend: layer `layer`'s cache, heads of shape `heads`, the first
/// token at position `pos0`; the layer's window, if it slides, and its heads' sink logits
/// (`[nh]`), if it has them.
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    pub layer: usize,
    pub heads: Heads,
    pub pos0: usize,
    pub window: Option<usize>,
    pub sinks: Option<&'a [f32]>,
    /// the softmax scale, if not `1 / sqrt(hd)` (DeepSeek-V3's, YaRN's mscale in it)
    pub scale: Option<f32>,
}

/// `attn[t, h] = softmax(q[t, h] k^T / sqrt(hd)) v` over layer `at.layer`'s cached positions
/// `0..=pos0 + t` (the window's latest of them) of KV head `h / (nh / nkv)`, for the `t_n`
/// tokens at positions
/// `pos0..pos0 + t_n`; `q` and `attn` are `[t_n, nh, hd]`, and the cache already holds these
/// tokens' keys and values.
pub fn attend(exec: &Exec, kv: &KvCache, at: At<'_>, q: &[f32], attn: &mut [f32], work: &mut AttnWork) {
    let At { layer: l, heads: shape, pos0, window, sinks, scale } = at;
    let Heads { nh, nkv, hd, hv, keyed } = shape;
    let t_n = q.len() / (nh * hd);
    debug_assert_eq!(attn.len(), t_n * nh * hv);
    let span = trace::span("heads").arg("heads", nh).arg("tokens", t_n).arg("kv_len", pos0 + t_n);
    let key = if span.is_recording() { trace::next_id() } else { 0 };
    let flows = span.flows_out(exec.threads());
    let task_span = |p: usize| {
        let s = trace::span("heads").merge_with(key);
        trace::flow_in(flows.map(|b| b + p as u64), key);
        s
    };
    let (isa, group) = (exec.isa, nh / nkv);
    let sc = attn::Scoring { scale: scale.unwrap_or(1.0 / (hd as f32).sqrt()), window };
    if t_n == 1 {
        decode(exec, kv, at, q, attn, work, &task_span);
        drop(span);
        return;
    }
    let tile = tile_tokens(group);
    let tiles = t_n.div_ceil(tile);
    let tiles_work = work.tiles(exec.threads(), tile * group, hd, hv);
    let out = Chunks::new(attn);
    exec.run(nkv * tiles, &|task, p| {
        let _c = task_span(p);
        // the latest tiles first: they attend over the most positions, and a long task
        // claimed last would leave the other threads waiting for it
        let (h, t0) = (task % nkv, (tiles - 1 - task / nkv) * tile);
        let t1 = (t0 + tile).min(t_n);
        // the tile's query rows (token-major, the group's heads within a token) and their ends
        let rows = (t1 - t0) * group;
        let mut tile = tiles_work[p].lock().unwrap_or_else(|e| e.into_inner());
        let Tile { qt, ends, sinks: row_sinks, acc, part, o } = &mut *tile;
        qt.clear();
        ends.clear();
        row_sinks.clear();
        for t in t0..t1 {
            let at = (t * nh + h * group) * hd;
            qt.extend_from_slice(&q[at..at + group * hd]);
            ends.extend(std::iter::repeat_n(pos0 + t + 1, group));
            if let Some(s) = sinks {
                row_sinks.extend_from_slice(&s[h * group..(h + 1) * group]);
            }
        }
        let (keys, vals) = kv.head(l, h, pos0 + t1);
        let values = if keyed { None } else { vals };
        o.resize(rows * hv, 0.0);
        attn::attend_cached(isa, (qt, hd), ends, keys, values, sc, row_sinks, (acc, part), o);
        for (i, t) in (t0..t1).enumerate() {
            let at = (t * nh + h * group) * hv;
            // SAFETY: this task alone writes token t's heads of KV head h, inside `attn`,
            // which outlives the section
            unsafe { out.slice(at, group * hv) }.copy_from_slice(&o[i * group * hv..(i + 1) * group * hv]);
        }
    });
    drop(span);
}

/// One token: a task per (KV head, split), then the splits merged per KV head.
fn decode(
    exec: &Exec,
    kv: &KvCache,
    at: At<'_>,
    q: &[f32],
    attn: &mut [f32],
    work: &mut AttnWork,
    task_span: &(dyn Fn(usize) -> trace::Span + Sync),
) {
    let At { layer: l, heads: Heads { nh, nkv, hd, hv, keyed }, pos0, window, sinks, scale } = at;
    let (isa, group) = (exec.isa, nh / nkv);
    let sc = attn::Scoring { scale: scale.unwrap_or(1.0 / (hd as f32).sqrt()), window };
    let n = pos0 + 1;
    let splits = n.div_ceil(attn::SPLIT).max(1);
    let split = |s: usize| attn::splits(n).nth(s).unwrap_or(0..0);
    let ends: SmallVec<[usize; 64]> = SmallVec::from_elem(n, group);
    work.fit(nkv * splits, group, hv);
    let AttnWork { parts, acc, .. } = work;
    let parts = &parts[..nkv * splits];
    exec.run(parts.len(), &|task, p| {
        let _c = task_span(p);
        let (h, s) = (task / splits, task % splits);
        let (keys, vals) = kv.head(l, h, n);
        let values = if keyed { None } else { vals };
        let mut st = parts[task].lock().unwrap_or_else(|e| e.into_inner());
        st.reset(group);
        // a split wholly before the window leaves the state empty, as prefill skips it
        if split(s).end > sc.first(n) {
            let qh = &q[h * group * hd..(h + 1) * group * hd];
            attn::fold_cached(isa, (qh, hd), &ends, keys, values, split(s), sc, &mut st);
        }
    });
    for h in 0..nkv {
        acc.reset(group);
        for part in &parts[h * splits..(h + 1) * splits] {
            // every task ran (the section returns after all of them)
            acc.merge(&part.lock().unwrap_or_else(|e| e.into_inner()));
        }
        for g in 0..group {
            let at = (h * group + g) * hv;
            acc.finish(g, sinks.map(|s| s[h * group + g]), &mut attn[at..at + hv]);
        }
    }
}
