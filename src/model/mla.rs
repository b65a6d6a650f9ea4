//! DeepSeek-V3's multi-head latent attention, in its expanded form: each head's keys and values
//! are made from the compressed kv and cached as ordinary attention heads. For T tokens `hn`
//! (`[T, H]`, normed), nh heads of nope + rope query/key dims and v value dims:
//! ```text
//! q   = norm(hn Wqa) Wqb  (q_lora)  or  hn Wq              [T, nh, nope + rope]
//! ckv = hn Wkva                                             [T, kv_lora + rope]
//! c   = norm(ckv[:kv_lora]),  k_pe = ckv[kv_lora:]          (one rotary key for every head)
//! kv  = c Wkvb                                              [T, nh, nope + v]
//! q[.., nope:], k_pe: RoPE (interleaved pairs, or halves)
//! k_h = [kv_h[:nope], k_pe],  v_h = [kv_h[nope:], 0 ...]    (v padded to nope + rope)
//! a   = softmax(q k^T * softmax_scale, causal) v;  delta = a[.., :v] Wo
//! ```
//! The cache holds nh x 2 x (nope + rope) values a token and layer; the absorbed form, caching
//! only c and k_pe, is the next step.

use moescope_kernels::ops::{apply_rope, apply_rope_interleaved, rms_norm_inplace};

use super::attention::{At, Heads, attend};
use super::error::ModelError;
use super::pass::Pass;
use super::run_state::RunState;
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
    /// the normed compressed kv `[T, kv_lora]`
    c: Vec<f32>,
    /// kv_b_proj's output `[T, nh * (nope + v)]`
    kvb: Vec<f32>,
    /// each head's values, before o_proj `[T, nh * v]`
    out: Vec<f32>,
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
            c: vec![0.0; chunk * m.kv_lora_rank],
            kvb: vec![0.0; chunk * nh * (m.qk_nope_head_dim + m.v_head_dim)],
            out: vec![0.0; chunk * nh * m.v_head_dim],
            rot: vec![0.0; m.qk_rope_head_dim],
        })
    }

    pub fn bytes(&self) -> u64 {
        let b = [&self.qa, &self.ckv, &self.c, &self.kvb, &self.out, &self.rot];
        b.iter().map(|v| v.capacity() as u64 * 4).sum()
    }
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
    kv_b: TensorId,
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
            kv_b: w("kv_b_proj", &[nh * (nope + vd), kvl])?,
            o: w("o_proj", &[h, nh * vd])?,
            m,
            heads: nh,
            hidden: h,
            eps: c.rms_norm_eps as f32,
        })
    }

    /// Layer `l`'s attention over the pass's normed rows (`st.hn`) at positions `pos0..`, their
    /// expanded keys and values appended to the cache; the result in `st.delta`.
    pub fn forward(&self, pass: &mut Pass<'_>, l: usize) {
        let (exec, pkg, t_n, pos0) = (pass.exec, pass.pkg, pass.t_n, pass.pos0);
        let _att = trace::span("attention").arg("layer", l).arg("tokens", t_n).arg("pos", pos0);
        let (h, nh, m) = (self.hidden, self.heads, self.m);
        let (kvl, nope, rope, vd) = (m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
        let hd = nope + rope;
        let RunState { hn, delta, q, k, v, attn, cos, sin, attn_work, mla, scratch: s, .. } = &mut *pass.st;
        let Some(w) = mla.as_mut() else { return };
        let hn = &hn[..t_n * h];
        let (q, k, v) = (&mut q[..t_n * nh * hd], &mut k[..t_n * nh * hd], &mut v[..t_n * nh * hd]);
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
        let c = &mut w.c[..t_n * kvl];
        for (c, row) in c.chunks_exact_mut(kvl).zip(ckv.chunks_exact(kvl + rope)) {
            c.copy_from_slice(&row[..kvl]);
            rms_norm_inplace(c, f(self.kv_norm), self.eps);
        }
        let kvb = &mut w.kvb[..t_n * nh * (nope + vd)];
        exec.matmul("kv_b_proj", &pkg.mat_by_index(self.kv_b), c, t_n, kvb, s);
        let half = rope / 2;
        let rot = &mut w.rot;
        let turn = |x: &mut [f32], t: usize, rot: &mut [f32]| {
            let (cs, sn) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
            if m.rope_interleave { apply_rope_interleaved(x, cs, sn, rot) } else { apply_rope(x, cs, sn) }
        };
        for t in 0..t_n {
            for head in q[t * nh * hd..(t + 1) * nh * hd].chunks_exact_mut(hd) {
                turn(&mut head[nope..], t, rot);
            }
            let k_pe = &mut ckv[t * (kvl + rope) + kvl..(t + 1) * (kvl + rope)];
            turn(k_pe, t, rot);
            let kv_t = &kvb[t * nh * (nope + vd)..(t + 1) * nh * (nope + vd)];
            let (kt, vt) = (&mut k[t * nh * hd..(t + 1) * nh * hd], &mut v[t * nh * hd..(t + 1) * nh * hd]);
            for ((kh, vh), src) in
                kt.chunks_exact_mut(hd).zip(vt.chunks_exact_mut(hd)).zip(kv_t.chunks_exact(nope + vd))
            {
                kh[..nope].copy_from_slice(&src[..nope]);
                kh[nope..].copy_from_slice(k_pe);
                vh[..vd].copy_from_slice(&src[nope..]);
                vh[vd..].fill(0.0);
            }
            pass.kv.write(l, pos0 + t, kt, vt);
        }
        let attn = &mut attn[..t_n * nh * hd];
        let heads = Heads { nh, nkv: nh, hd };
        let at = At { layer: l, heads, pos0, window: None, sinks: None, scale: Some(m.softmax_scale) };
        attend(exec, pass.kv, at, q, attn, attn_work);
        let out = &mut w.out[..t_n * nh * vd];
        for (o, a) in out.chunks_exact_mut(vd).zip(attn.chunks_exact(hd)) {
            o.copy_from_slice(&a[..vd]);
        }
        exec.matmul("o_proj", &pkg.mat_by_index(self.o), out, t_n, &mut delta[..t_n * h], s);
    }
}
