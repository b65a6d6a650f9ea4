//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B) forward pass on the CPU.
//!
//! Per layer, for a batch of T tokens at positions `pos0..pos0+T` (prefill: the prompt; decode:
//! T = 1):
//! ```text
//! h = rms_norm(x) · input_layernorm
//! q = h Wq [T, nh*hd], k = h Wk [T, nkv*hd], v = h Wv
//! q, k: rms_norm per head over hd (q_norm, k_norm), then rotate-half RoPE; k, v -> KV cache
//! a = softmax(q k^T / sqrt(hd), causal) v   (GQA: query head j reads kv head j / (nh/nkv))
//! x += a Wo
//! h = rms_norm(x) · post_attention_layernorm
//! MoE layer: p = softmax(h Wr^T) in f32 over E experts; top-k; w = p_topk (/ sum if
//!            norm_topk_prob); x += sum_k w_k · down(silu(gate h) * up h) of expert k
//! dense layer: x += down(silu(gate h) * up h)
//! ```
//! then `logits = rms_norm(x) · norm · lm_head` (the embedding when tied).
//! Tokens routed to the same expert are computed together, so each expert's weights are read
//! once per batch; each token's expert outputs are summed in rank order, whatever order the
//! experts ran in, so the result never depends on scheduling.

use std::sync::Arc;

use moescope_kernels::ops::{Rope, add_inplace, apply_rope, rms_norm, rms_norm_inplace};

use super::attention;
use super::error::ModelError;
use super::kv_cache::KvCache;
use super::moe::{self, ExpertQuery, ExpertSource, RouterSpec, swiglu_mlp};
use super::observer::Observer;
use crate::exec::{Exec, Scratch};
use crate::model_config::ModelConfig;
use crate::package::{Package, TensorId};
use crate::trace;

/// Which positions of a batch need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Every position (tests, perplexity): `[T, vocab]`.
    All,
    /// Only the last position: `[vocab]`.
    Last,
    /// None (a prefill chunk that is not the last).
    None,
}

enum Ffn {
    Dense {
        gate: TensorId,
        up: TensorId,
        down: TensorId,
    },
    /// `moe_layer`: the layer's place among the MoE layers (its row of the expert table).
    Moe {
        router: TensorId,
        moe_layer: usize,
    },
}

struct Layer {
    input_norm: TensorId,
    post_norm: TensorId,
    q: TensorId,
    k: TensorId,
    v: TensorId,
    o: TensorId,
    q_norm: TensorId,
    k_norm: TensorId,
    ffn: Ffn,
}

pub struct Qwen3Moe {
    pub cfg: ModelConfig,
    pkg: Arc<Package>,
    embed: TensorId,
    norm: TensorId,
    lm_head: TensorId,
    layers: Vec<Layer>,
    rope: Rope,
}

impl Qwen3Moe {
    /// Bind the package's tensors, checking every name and shape the forward pass uses.
    pub fn load(pkg: Arc<Package>) -> Result<Qwen3Moe, ModelError> {
        let c = pkg.meta.model.clone();
        let (h, hd) = (c.hidden_size, c.head_dim);
        let m = |name: String, shape: &[usize]| pkg.require(&name, shape, false);
        let v = |name: String, n: usize| pkg.require(&name, &[n], true);
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut moe_layers = 0;
        for l in 0..c.num_hidden_layers {
            let p = format!("model.layers.{l}.");
            let ffn = if c.is_moe_layer(l) {
                moe_layers += 1;
                Ffn::Moe {
                    router: pkg.require(&format!("{p}mlp.gate.weight"), &[c.num_experts, h], true)?,
                    moe_layer: moe_layers - 1,
                }
            } else {
                let i = c.intermediate_size;
                Ffn::Dense {
                    gate: m(format!("{p}mlp.gate_proj.weight"), &[i, h])?,
                    up: m(format!("{p}mlp.up_proj.weight"), &[i, h])?,
                    down: m(format!("{p}mlp.down_proj.weight"), &[h, i])?,
                }
            };
            layers.push(Layer {
                input_norm: v(format!("{p}input_layernorm.weight"), h)?,
                post_norm: v(format!("{p}post_attention_layernorm.weight"), h)?,
                q: m(format!("{p}self_attn.q_proj.weight"), &[c.q_dim(), h])?,
                k: m(format!("{p}self_attn.k_proj.weight"), &[c.kv_dim(), h])?,
                v: m(format!("{p}self_attn.v_proj.weight"), &[c.kv_dim(), h])?,
                o: m(format!("{p}self_attn.o_proj.weight"), &[h, c.q_dim()])?,
                q_norm: v(format!("{p}self_attn.q_norm.weight"), hd)?,
                k_norm: v(format!("{p}self_attn.k_norm.weight"), hd)?,
                ffn,
            });
        }
        let embed = m("model.embed_tokens.weight".into(), &[c.vocab_size, h])?;
        let lm_head = if c.tie_word_embeddings { embed } else { m("lm_head.weight".into(), &[c.vocab_size, h])? };
        Ok(Qwen3Moe {
            norm: v("model.norm.weight".into(), h)?,
            embed,
            lm_head,
            layers,
            rope: Rope::new(c.rope_theta, hd),
            cfg: c,
            pkg,
        })
    }

    /// Router tensors of the MoE layers, in forward order (for the predictor).
    pub fn routers(&self) -> Vec<TensorId> {
        self.layers
            .iter()
            .filter_map(|l| match l.ffn {
                Ffn::Moe { router, .. } => Some(router),
                Ffn::Dense { .. } => None,
            })
            .collect()
    }

    pub fn package(&self) -> &Arc<Package> {
        &self.pkg
    }

    /// Parameters of the whole model (every expert counted).
    pub fn n_params(&self) -> u64 {
        let dense: u64 = self.pkg.meta.tensors.iter().map(|t| t.shape.iter().product::<usize>() as u64).sum();
        let experts = self.pkg.meta.experts.as_ref().map_or(0, |ex| {
            let per: u64 = ex.parts.iter().map(|p| p.shape.iter().product::<usize>() as u64).sum();
            per * ex.table.len() as u64
        });
        dense + experts
    }

    /// Weight bytes one decode token reads: every dense tensor except the embedding (of which
    /// one row), and `top-k` experts' parts in each MoE layer. The roofline's numerator: decode
    /// cannot beat (memory bandwidth / this).
    pub fn decode_weight_bytes(&self) -> u64 {
        let pkg = &self.pkg;
        let c = &self.cfg;
        let mut total = 0u64;
        for (i, t) in pkg.meta.tensors.iter().enumerate() {
            if i == self.embed.index() {
                let f = t.format().unwrap_or(moescope_kernels::Format::F32);
                total += (f.data_bytes(1, c.hidden_size) + f.scale_bytes(1, c.hidden_size)) as u64;
                if c.tie_word_embeddings {
                    total += t.length; // the lm_head reads it whole
                }
            } else {
                total += t.length;
            }
        }
        if let Some(ex) = &pkg.meta.experts {
            let per: u64 = ex.parts.iter().map(|p| p.length).sum();
            total += per * c.num_experts_per_tok as u64 * ex.layers.len() as u64;
        }
        total
    }

    /// Run `tokens` at positions `kv.len()..` in the buffers of `st`, appending their keys and
    /// values to `kv`; the routed experts come from `experts`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        exec: &Exec,
        experts: &dyn ExpertSource,
        st: &mut RunState,
        tokens: &[u32],
        kv: &mut KvCache,
        want: Logits,
        obs: &mut dyn Observer,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.cfg;
        let (t_n, h) = (tokens.len(), c.hidden_size);
        let pos0 = kv.len();
        if pos0 + t_n > kv.capacity() {
            return Err(ModelError::ContextFull { need: pos0 + t_n, ctx: kv.capacity() });
        }
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= c.vocab_size) {
            return Err(ModelError::TokenOutOfRange { id: bad, vocab: c.vocab_size });
        }
        if t_n > st.chunk {
            return Err(ModelError::BatchTooLarge { tokens: t_n, chunk: st.chunk });
        }
        let pkg = &*self.pkg;
        let _fwd = trace::span("forward").arg("tokens", t_n).arg("pos", pos0);
        obs.begin_pass();
        experts.begin_pass();
        let emb = pkg.mat_by_index(self.embed);
        {
            let _e = trace::span("embed");
            let x = &mut st.x[..t_n * h];
            for (t, &id) in tokens.iter().enumerate() {
                emb.dequant_row(id as usize, &mut x[t * h..(t + 1) * h]);
            }
        }
        obs.hidden(0, &st.x[..t_n * h]);
        // cos/sin of each position, shared by all layers
        let half = c.head_dim / 2;
        for t in 0..t_n {
            let (cs, sn) = (&mut st.cos[t * half..(t + 1) * half], &mut st.sin[t * half..(t + 1) * half]);
            self.rope.cos_sin(pos0 + t, cs, sn);
        }
        let eps = c.rms_norm_eps as f32;
        for (l, layer) in self.layers.iter().enumerate() {
            let is_moe = matches!(layer.ffn, Ffn::Moe { .. });
            let _layer = trace::span("layer").arg("layer", l).arg("kind", if is_moe { "moe" } else { "dense" });
            // attention, residual add, the MLP's norm
            self.attention(exec, l, layer, t_n, pos0, kv, st);
            let (x, hn, delta) = (&mut st.x[..t_n * h], &mut st.hn[..t_n * h], &mut st.delta[..t_n * h]);
            add_inplace(x, delta);
            let w = pkg.f32_by_index(layer.post_norm);
            for t in 0..t_n {
                rms_norm(&x[t * h..(t + 1) * h], w, eps, &mut hn[t * h..(t + 1) * h]);
            }
            // the MLP or the MoE block into delta, residual add
            match layer.ffn {
                Ffn::Dense { gate, up, down } => {
                    let _m = trace::span("mlp").arg("layer", l);
                    let (g, u, d) = (pkg.mat_by_index(gate), pkg.mat_by_index(up), pkg.mat_by_index(down));
                    let labels = ["gate_up_proj", "gate_proj", "up_proj", "down_proj"];
                    let y = swiglu_mlp(exec, labels, &g, &u, &d, hn, t_n, &mut st.scratch);
                    delta.copy_from_slice(&y);
                }
                Ffn::Moe { router, moe_layer } => {
                    let at = MoeAt { layer: l, moe_layer, router, pos0 };
                    self.moe(exec, experts, at, t_n, st, obs)?;
                }
            }
            let (x, delta) = (&mut st.x[..t_n * h], &st.delta[..t_n * h]);
            add_inplace(x, delta);
            obs.hidden(l + 1, x);
        }
        kv.set_len(pos0 + t_n);

        let rows: Vec<usize> = match want {
            Logits::All => (0..t_n).collect(),
            Logits::Last => vec![t_n - 1],
            Logits::None => vec![],
        };
        let norm = pkg.f32_by_index(self.norm);
        let x = &mut st.x[..t_n * h];
        {
            let _n = trace::span("final_norm");
            for t in 0..t_n {
                rms_norm_inplace(&mut x[t * h..(t + 1) * h], norm, eps);
            }
        }
        obs.hidden(c.num_hidden_layers + 1, x);
        if rows.is_empty() {
            return Ok(vec![]);
        }
        let xs: Vec<f32> = rows.iter().flat_map(|&t| x[t * h..(t + 1) * h].iter().copied()).collect();
        let mut logits = vec![0f32; rows.len() * c.vocab_size];
        exec.matmul("lm_head", &pkg.mat_by_index(self.lm_head), &xs, rows.len(), &mut logits, &mut st.scratch);
        Ok(logits)
    }

    /// Self-attention of layer `l` for the first `t_n` tokens of `st.x`, at positions `pos0..`;
    /// the result (before the residual add) in `st.delta`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        exec: &Exec,
        l: usize,
        layer: &Layer,
        t_n: usize,
        pos0: usize,
        kv: &mut KvCache,
        st: &mut RunState,
    ) {
        let c = &self.cfg;
        let pkg = &*self.pkg;
        let (h, hd, nh, nkv) = (c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads);
        let _att = trace::span("attention").arg("layer", l).arg("tokens", t_n).arg("pos", pos0);
        let eps = c.rms_norm_eps as f32;
        let RunState { x, hn, delta, q, k, v, qkv, attn, cos, sin, scratch: s, .. } = st;
        let (x, hn, out) = (&x[..t_n * h], &mut hn[..t_n * h], &mut delta[..t_n * h]);
        let (q, k, v) = (&mut q[..t_n * nh * hd], &mut k[..t_n * nkv * hd], &mut v[..t_n * nkv * hd]);
        let w = pkg.f32_by_index(layer.input_norm);
        for t in 0..t_n {
            rms_norm(&x[t * h..(t + 1) * h], w, eps, &mut hn[t * h..(t + 1) * h]);
        }
        let (wq, wk, wv) = (pkg.mat_by_index(layer.q), pkg.mat_by_index(layer.k), pkg.mat_by_index(layer.v));
        if t_n == 1 {
            // decode: the three in one parallel section (its pieces cross from q into k and v),
            // one quantization of the normed input
            exec.matvec_concat("qkv_proj", &[&wq, &wk, &wv], hn, qkv, s);
            let (qp, kv_part) = qkv.split_at(nh * hd);
            q.copy_from_slice(qp);
            k.copy_from_slice(&kv_part[..nkv * hd]);
            v.copy_from_slice(&kv_part[nkv * hd..]);
        } else {
            // one quantization of the normed input for all three
            exec.matmul_shared(hn, t_n, &mut [("q_proj", &wq, q), ("k_proj", &wk, k), ("v_proj", &wv, v)], s);
        }
        let (qn, kn) = (pkg.f32_by_index(layer.q_norm), pkg.f32_by_index(layer.k_norm));
        let half = hd / 2;
        for t in 0..t_n {
            let (cs, sn) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
            for head in q[t * nh * hd..(t + 1) * nh * hd].chunks_exact_mut(hd) {
                rms_norm_inplace(head, qn, eps);
                apply_rope(head, cs, sn);
            }
            for head in k[t * nkv * hd..(t + 1) * nkv * hd].chunks_exact_mut(hd) {
                rms_norm_inplace(head, kn, eps);
                apply_rope(head, cs, sn);
            }
            kv.write(l, pos0 + t, &k[t * nkv * hd..(t + 1) * nkv * hd], &v[t * nkv * hd..(t + 1) * nkv * hd]);
        }
        let attn = &mut attn[..t_n * nh * hd];
        attention::attend(exec, kv, l, attention::Heads { nh, nkv, hd }, q, pos0, attn);
        exec.matmul("o_proj", &pkg.mat_by_index(layer.o), attn, t_n, out, s);
    }

    /// The routed-experts block of MoE layer `at` for the first `t_n` tokens of `st.hn`
    /// (normed); the result in `st.delta`.
    fn moe(
        &self,
        exec: &Exec,
        experts: &dyn ExpertSource,
        at: MoeAt,
        t_n: usize,
        st: &mut RunState,
        obs: &mut dyn Observer,
    ) -> Result<(), ModelError> {
        let c = &self.cfg;
        let (h, e_n, k_n) = (c.hidden_size, c.num_experts, c.num_experts_per_tok);
        let mut span = trace::span("moe").arg("layer", at.layer).arg("tokens", t_n);
        let spec = RouterSpec { num_experts: e_n, top_k: k_n, renormalize: c.norm_topk_prob };
        let router = self.pkg.mat_by_index(at.router);
        let RunState { hn, delta, probs, yk, scratch: s, .. } = st;
        let (hn, out) = (&hn[..t_n * h], &mut delta[..t_n * h]);
        let routing = moe::route(exec, &router, spec, at.layer, hn, at.pos0, &mut probs[..t_n * e_n], s, obs);
        span.set("experts_used", routing.used.len());
        let q =
            ExpertQuery { layer: at.layer, moe_layer: at.moe_layer, tokens: t_n, used: &routing.used, lookahead: hn };
        let bufs = moe::SumBuffers { yk: &mut yk[..t_n * k_n * h], out };
        moe::routed_sum(exec, experts, &q, &routing, hn, self.pkg.sizes().blob, bufs, s)
    }
}

/// The forward pass's buffers, allocated once for batches of up to `chunk` tokens (llama2.c's
/// RunState); a pass of T tokens uses the first T rows of each. Per-expert temporaries (each
/// expert's gathered input and intermediate rows) and the logits are allocated per call.
pub struct RunState {
    /// Most tokens of one pass.
    chunk: usize,
    /// residual stream [chunk, H]
    x: Vec<f32>,
    /// a block's normed input [chunk, H]
    hn: Vec<f32>,
    /// a block's output, before the residual add [chunk, H]
    delta: Vec<f32>,
    /// queries [chunk, nh * hd]
    q: Vec<f32>,
    /// keys and values [chunk, nkv * hd]
    k: Vec<f32>,
    v: Vec<f32>,
    /// one token's q, k and v from one section [(nh + 2 nkv) * hd]
    qkv: Vec<f32>,
    /// attention's output [chunk, nh * hd]
    attn: Vec<f32>,
    /// RoPE's cos and sin of each position [chunk, hd / 2]
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// router probabilities [chunk, E]
    probs: Vec<f32>,
    /// routed experts' weighted outputs per (token, rank) [chunk, k, H]
    yk: Vec<f32>,
    /// quantized activations, reused by every product on this thread
    scratch: Scratch,
}

impl RunState {
    pub fn new(c: &ModelConfig, chunk: usize) -> RunState {
        let (h, hd) = (c.hidden_size, c.head_dim);
        let buf = |n: usize| vec![0f32; chunk * n];
        RunState {
            chunk,
            x: buf(h),
            hn: buf(h),
            delta: buf(h),
            q: buf(c.q_dim()),
            k: buf(c.kv_dim()),
            v: buf(c.kv_dim()),
            qkv: vec![0f32; c.q_dim() + 2 * c.kv_dim()],
            attn: buf(c.q_dim()),
            cos: buf(hd / 2),
            sin: buf(hd / 2),
            probs: buf(c.num_experts),
            yk: buf(c.num_experts_per_tok * h),
            scratch: {
                // the widest input and the most results a dense product of a chunk has
                let widest = h.max(c.q_dim()).max(c.intermediate_size);
                let most = widest.max(c.kv_dim()).max(c.num_experts);
                let mut s = Scratch::default();
                s.reserve(chunk * widest, chunk * most);
                s
            },
        }
    }

    /// Most tokens one pass may hold.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// Bytes of the buffers (the quantized activations' as they have grown so far).
    pub fn bytes(&self) -> u64 {
        let f = [
            &self.x,
            &self.hn,
            &self.delta,
            &self.q,
            &self.k,
            &self.v,
            &self.qkv,
            &self.attn,
            &self.cos,
            &self.sin,
            &self.probs,
            &self.yk,
        ];
        (f.iter().map(|v| v.capacity() * 4).sum::<usize>() + self.scratch.bytes()) as u64
    }
}

/// Where a MoE block runs: its layer, its place among the MoE layers, its router tensor and the
/// batch's first position.
#[derive(Debug, Clone, Copy)]
struct MoeAt {
    layer: usize,
    moe_layer: usize,
    router: TensorId,
    pos0: usize,
}
