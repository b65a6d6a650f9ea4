//! DeepSeek-V3's multi-head latent attention in its absorbed form: the cache holds, per token
//! and layer, only the compressed kv and the rotary key every head shares, and each head's key
//! and value up-projections are folded into its query and its output. For T tokens `hn`
//! (`[T, H]`, normed), nh heads of nope + rope query dims and v value dims, kv_lora = r:
//! ```text
//! q   = norm(hn Wqa) Wqb  (q_lora)  or  hn Wq              [T, nh, nope + rope]
//! ckv = hn Wkva                                             [T, r + rope]
//! c   = norm(ckv[:r]),  k_pe = ckv[r:]                      (one rotary key for every head)
//! q[.., nope:], k_pe: RoPE (interleaved pairs, or halves)
//! cache <- [c, k_pe]                                        (r + rope floats a token)
//! qa_h = [K_h q_nope_h, q_pe_h]                             [T, nh, r + rope]
//!        (K_h: k_b_proj's rows h r .., `[r, nope]`: W_UK_h transposed)
//! o_h  = softmax(qa_h [c, k_pe]^T * softmax_scale, causal) c          [T, nh, r]
//! v_h  = V_h o_h  (V_h: v_b_proj's rows h v .., `[v, r]`)   [T, nh, v];  delta = v Wo
//! ```
//! `qa_h · [c_t, k_pe_t] = q_nope_h · (W_UK_h c_t) + q_pe_h · k_pe_t`: the expanded form's
//! score, and `W_UV_h Σ p_t c_t` its output, the sums taken in another order (the f32 bound).
//! Decode runs this form; a batch runs the expanded one (`mla_expanded.rs`) where that takes
//! fewer multiply-adds (a prompt's hundreds of tokens: about half).

use std::ops::Range;

use moescope_kernels::mat::Input;
use moescope_kernels::ops::{apply_rope, apply_rope_interleaved, rms_norm_inplace};
use moescope_kernels::{Isa, Mat, QuantAct};

use super::attention::{At, Heads, attend};
use super::error::ModelError;
use super::mla_expanded;
use super::pass::Pass;
use super::run_state::RunState;
use crate::exec::{Chunks, Exec};
use crate::model_config::{Mla, ModelConfig};
use crate::package::{Package, TensorId};
use crate::trace;

/// The buffers of one pass's latent attention, `[chunk, width]` each (grown once).
#[derive(Default)]
pub struct MlaWork {
    /// q_a_proj's output `[T, q_lora]`
    qa: Vec<f32>,
    /// kv_a_proj_with_mqa's output `[T, kv_lora + rope]`
    ckv: Vec<f32>,
    /// the absorbed queries `[T, nh, r + rope]`
    qa_abs: Vec<f32>,
    /// each head's attention over the compressed kv `[T, nh, r]`
    lat: Vec<f32>,
    /// each head's values, before o_proj `[T, nh * v]`
    out: Vec<f32>,
    /// one token's cache row `[r + rope]`
    key: Vec<f32>,
    /// one rotary part, reordered
    rot: Vec<f32>,
}

impl MlaWork {
    pub fn new(c: &ModelConfig, chunk: usize) -> Option<MlaWork> {
        let m = c.features.mla?;
        let nh = c.num_attention_heads;
        Some(MlaWork {
            qa: vec![0.0; chunk * m.q_lora_rank.unwrap_or(0)],
            ckv: vec![0.0; chunk * (m.kv_lora_rank + m.qk_rope_head_dim)],
            qa_abs: vec![0.0; chunk * nh * (m.kv_lora_rank + m.qk_rope_head_dim)],
            lat: vec![0.0; chunk * nh * m.kv_lora_rank],
            out: vec![0.0; chunk * nh * m.v_head_dim],
            key: vec![0.0; m.kv_lora_rank + m.qk_rope_head_dim],
            rot: vec![0.0; m.qk_rope_head_dim],
        })
    }

    pub fn bytes(&self) -> u64 {
        let b = [&self.qa, &self.ckv, &self.qa_abs, &self.lat, &self.out, &self.key, &self.rot];
        b.iter().map(|v| v.capacity() as u64 * 4).sum()
    }
}

/// One head's products in a task of its own: the head's inputs gathered `[T, width]`, their
/// quantized form, the results weight-row-major `[rows, T]`.
#[derive(Default)]
struct HeadWork {
    x: Vec<f32>,
    qa: QuantAct,
    y: Vec<f32>,
}

thread_local! {
    static HEAD: std::cell::RefCell<HeadWork> = std::cell::RefCell::new(HeadWork::default());
}

/// Every head's product with its own rows of `w` (`w.rows / nh` each), the heads in parallel:
/// head h of token t reads `x[(t nh + h) x_stride ..][..w.cols]` and writes its results to
/// `out[(t nh + h) out_stride ..]`. `label` names the tasks in the trace.
fn heads_product(
    exec: &Exec,
    label: &'static str,
    w: &Mat<'_>,
    (nh, t_n): (usize, usize),
    (x, x_stride): (&[f32], usize),
    (out, out_stride): (&mut [f32], usize),
) {
    let rows = w.rows / nh;
    let dst = Chunks::new(out);
    exec.run(nh, &|h, _| {
        let _s = trace::span(label);
        HEAD.with_borrow_mut(|hw| {
            hw.x.clear();
            (0..t_n).for_each(|t| hw.x.extend_from_slice(&x[(t * nh + h) * x_stride..][..w.cols]));
            head_product(exec.isa, w, h * rows..(h + 1) * rows, t_n, hw);
            for t in 0..t_n {
                // SAFETY: task h alone writes head h of every token, inside `out`, which
                // outlives the section
                let o = unsafe { dst.slice((t * nh + h) * out_stride, rows) };
                o.iter_mut().enumerate().for_each(|(r, o)| *o = hw.y[r * t_n + t]);
            }
        })
    });
}

/// `y[r, t] = W[rows][r] · x[t]` for one head's row range of `w` and its `T` inputs (`hw.x`,
/// `[T, w.cols]`), on this thread: the kernel the whole-matrix products run, so a head's row
/// has the bits it would have in any batch of tokens.
fn head_product(isa: Isa, w: &Mat<'_>, rows: Range<usize>, t_n: usize, hw: &mut HeadWork) {
    let HeadWork { x, qa, y } = hw;
    y.resize(rows.len() * t_n, 0.0);
    let input = match w.quant_group() {
        Some(g) => {
            qa.quantize(x, w.cols, g, isa);
            Input::Quant(qa)
        }
        None => Input::F32(x),
    };
    w.matmul_rows(isa, input, t_n, rows, y);
}

/// The query's first product: one matrix, or the low-rank pair with its norm between.
enum Query {
    Plain(TensorId),
    LowRank { a: TensorId, norm: TensorId, b: TensorId },
}

/// One latent-attention layer's tensors (package names under `model.layers.{l}.self_attn.`).
pub struct LatentAttention {
    q: Query,
    kv_a: TensorId,
    kv_norm: TensorId,
    k_b: TensorId,
    v_b: TensorId,
    o: TensorId,
    m: Mla,
    heads: usize,
    hidden: usize,
    eps: f32,
}

impl LatentAttention {
    pub fn load(pkg: &Package, prefix: &str, c: &ModelConfig) -> Result<LatentAttention, ModelError> {
        let m =
            c.features.mla.ok_or_else(|| ModelError::Unsupported("latent attention without its settings".into()))?;
        let (h, nh) = (c.hidden_size, c.num_attention_heads);
        let w = |name: &str, shape: &[usize]| pkg.require(&format!("{prefix}{name}.weight"), shape, false);
        let n = |name: &str, len: usize| pkg.require(&format!("{prefix}{name}.weight"), &[len], true);
        let (kvl, nope, rope, vd) = (m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
        Ok(LatentAttention {
            q: match m.q_lora_rank {
                Some(r) => Query::LowRank {
                    a: w("q_a_proj", &[r, h])?,
                    norm: n("q_a_layernorm", r)?,
                    b: w("q_b_proj", &[c.q_dim(), r])?,
                },
                None => Query::Plain(w("q_proj", &[c.q_dim(), h])?),
            },
            kv_a: w("kv_a_proj_with_mqa", &[kvl + rope, h])?,
            kv_norm: n("kv_a_layernorm", kvl)?,
            k_b: w("k_b_proj", &[nh * kvl, nope])?,
            v_b: w("v_b_proj", &[nh * vd, kvl])?,
            o: w("o_proj", &[h, nh * vd])?,
            m,
            heads: nh,
            hidden: h,
            eps: c.rms_norm_eps as f32,
        })
    }

    /// Layer `l`'s attention over the pass's normed rows (`st.hn`), each sequence's at its
    /// positions, their compressed kv and rotary keys appended to its cache; the result in
    /// `st.delta`.
    pub fn forward(&self, pass: &mut Pass<'_, '_>, l: usize) {
        let (exec, pkg, t_n) = (pass.exec, pass.pkg, pass.t_n);
        let _att = trace::span("attention").arg("layer", l).arg("tokens", t_n).arg("pos", pass.pos0());
        let (h, nh, m) = (self.hidden, self.heads, self.m);
        let (kvl, nope, rope, vd) = (m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
        let hd = nope + rope;
        let RunState { hn, delta, q, cos, sin, attn_work, mla, scratch: s, .. } = &mut *pass.st;
        let Some(w) = mla.as_mut() else { return };
        let hn = &hn[..t_n * h];
        let q = &mut q[..t_n * nh * hd];
        let f = |id: TensorId| pkg.f32_by_index(id);
        match self.q {
            Query::Plain(wq) => exec.matmul("q_proj", &pkg.mat_by_index(wq), hn, t_n, q, s),
            Query::LowRank { a, norm, b } => {
                let r = pkg.mat_by_index(a).rows;
                let qa = &mut w.qa[..t_n * r];
                exec.matmul("q_a_proj", &pkg.mat_by_index(a), hn, t_n, qa, s);
                qa.chunks_exact_mut(r).for_each(|row| rms_norm_inplace(row, f(norm), self.eps));
                exec.matmul("q_b_proj", &pkg.mat_by_index(b), qa, t_n, q, s);
            }
        }
        let ckv = &mut w.ckv[..t_n * (kvl + rope)];
        exec.matmul("kv_a_proj", &pkg.mat_by_index(self.kv_a), hn, t_n, ckv, s);
        let half = rope / 2;
        let rot = &mut w.rot;
        let turn = |x: &mut [f32], t: usize, rot: &mut [f32]| {
            let (cs, sn) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
            if m.rope_interleave { apply_rope_interleaved(x, cs, sn, rot) } else { apply_rope(x, cs, sn) }
        };
        let hk = kvl + rope;
        for seq in pass.seqs.iter_mut() {
            for t in seq.row0..seq.row0 + seq.n {
                for head in q[t * nh * hd..(t + 1) * nh * hd].chunks_exact_mut(hd) {
                    turn(&mut head[nope..], t, rot);
                }
                // the cache row: the compressed kv normed, the rotary key turned
                w.key.copy_from_slice(&ckv[t * (kvl + rope)..(t + 1) * (kvl + rope)]);
                rms_norm_inplace(&mut w.key[..kvl], f(self.kv_norm), self.eps);
                turn(&mut w.key[kvl..], t, rot);
                seq.kv.write(l, seq.pos0 + t - seq.row0, &w.key, &[]);
            }
        }
        let (k_b, v_b) = (pkg.mat_by_index(self.k_b), pkg.mat_by_index(self.v_b));
        // each sequence over its own cache, in the form its own rows pay for (a server's batch
        // runs each sequence as it would alone)
        for seq in pass.seqs.iter_mut() {
            let (t_n, pos0, q) = (seq.n, seq.pos0, seq.of(q, nh * hd));
            let out = seq.of_mut(&mut w.out, nh * vd);
            if mla_expanded::pays(&m, t_n, pos0) {
                let lat = mla_expanded::Latent { kv: seq.kv, layer: l, m, heads: nh, k_b: &k_b, v_b: &v_b };
                mla_expanded::attend(exec, &lat, q, pos0, out);
            } else {
                // each head's query folded through its key up-projection, its rotary part beside it
                let qa = &mut w.qa_abs[..t_n * nh * hk];
                heads_product(exec, "k_b_proj", &k_b, (nh, t_n), (q, hd), (qa, hk));
                for (i, row) in qa.chunks_exact_mut(hk).enumerate() {
                    row[kvl..].copy_from_slice(&q[i * hd + nope..][..rope]);
                }
                let lat = &mut w.lat[..t_n * nh * kvl];
                let heads = Heads { nh, nkv: 1, hd: hk, hv: kvl, keyed: true };
                let at = At { layer: l, heads, pos0, window: None, sinks: None, scale: Some(m.softmax_scale) };
                attend(exec, seq.kv, at, qa, lat, attn_work);
                // each head's values through its value up-projection
                heads_product(exec, "v_b_proj", &v_b, (nh, t_n), (lat, kvl), (out, vd));
            }
        }
        let out = &w.out[..t_n * nh * vd];
        exec.matmul("o_proj", &pkg.mat_by_index(self.o), out, t_n, &mut delta[..t_n * h], s);
    }
}
