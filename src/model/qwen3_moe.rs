//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B) forward pass on the CPU, and the hybrid models
//! built from the same blocks: Qwen3-Next and Qwen3.5 (see the end of this comment).
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
//!
//! Hybrid models (Qwen3-Next, Qwen3.5) differ in three places. Each layer's mixer is either
//! gated attention or Gated DeltaNet (`delta_net.rs`, state in the KV cache's place), by
//! `layer_types`. Gated attention is the attention above with RoPE on the first `rotary_dim`
//! dims only and its output times sigmoid(h Wg) (`o_gate_proj`) before Wo. The MoE block adds
//! `sigmoid(h · w_sg) · shared_expert(h)` to the routed sum. Their (1 + w) norms are stored as
//! (1 + w) by the converter, so the norms here are the same.
//! Tokens routed to the same expert are computed together, so each expert's weights are read
//! once per batch; each token's expert outputs are summed in rank order, whatever order the
//! experts ran in, so the result never depends on scheduling.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use moescope_kernels::ops::{Rope, add_inplace, rms_norm, rms_norm_inplace};

use super::attention;
use super::delta_net::{self, DeltaNet};
use super::error::ModelError;
use super::kv_cache::KvCache;
use super::moe::{self, ExpertQuery, ExpertSource, RouterSpec, Steer, swiglu_mlp};
use super::observer::Observer;
use super::route_replay::{ReplayAt, RouteReplay};
use super::rows::{Angles, add_rows, norm_rope_rows, norm_rows};
use super::run_state::RunState;
use crate::exec::Exec;
use crate::model_config::{LayerKind, ModelConfig};
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
        shared: Option<SharedExpert>,
    },
}

/// The hybrids' shared expert: a SwiGLU MLP every token runs, scaled by sigmoid(h · gate).
#[derive(Clone, Copy)]
struct SharedExpert {
    gate_proj: TensorId,
    up_proj: TensorId,
    down_proj: TensorId,
    /// `[1, H]` f32
    gate: TensorId,
}

/// Softmax attention's tensors; `o_gate` in hybrid models.
struct Attention {
    q: TensorId,
    o_gate: Option<TensorId>,
    k: TensorId,
    v: TensorId,
    o: TensorId,
    q_norm: TensorId,
    k_norm: TensorId,
}

enum Mixer {
    Attention(Attention),
    Linear(DeltaNet),
}

struct Layer {
    input_norm: TensorId,
    post_norm: TensorId,
    mixer: Mixer,
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
    /// the linear-attention shapes of a hybrid model
    delta: Option<delta_net::Dims>,
    /// routes taken from a trace instead of the routers (`--route-from`)
    replay: Option<Arc<RouteReplay>>,
    /// `--cache-aware-routing`'s tolerance, and the substitutions it has made
    cache_aware: Option<f32>,
    substitutions: AtomicU64,
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
                let shared = match &c.hybrid {
                    Some(hy) => {
                        let i = hy.shared_expert_intermediate_size;
                        Some(SharedExpert {
                            gate_proj: m(format!("{p}mlp.shared_expert.gate_proj.weight"), &[i, h])?,
                            up_proj: m(format!("{p}mlp.shared_expert.up_proj.weight"), &[i, h])?,
                            down_proj: m(format!("{p}mlp.shared_expert.down_proj.weight"), &[h, i])?,
                            gate: pkg.require(&format!("{p}mlp.shared_expert_gate.weight"), &[1, h], true)?,
                        })
                    }
                    None => None,
                };
                Ffn::Moe {
                    router: pkg.require(&format!("{p}mlp.gate.weight"), &[c.num_experts, h], true)?,
                    moe_layer: moe_layers - 1,
                    shared,
                }
            } else {
                let i = c.intermediate_size;
                Ffn::Dense {
                    gate: m(format!("{p}mlp.gate_proj.weight"), &[i, h])?,
                    up: m(format!("{p}mlp.up_proj.weight"), &[i, h])?,
                    down: m(format!("{p}mlp.down_proj.weight"), &[h, i])?,
                }
            };
            let mixer = match (c.layer_kind(l), &c.hybrid) {
                (LayerKind::LinearAttention, Some(hy)) => {
                    Mixer::Linear(DeltaNet::load(&pkg, &format!("{p}linear_attn."), hy, h)?)
                }
                _ => Mixer::Attention(Attention {
                    q: m(format!("{p}self_attn.q_proj.weight"), &[c.q_dim(), h])?,
                    o_gate: match c.hybrid {
                        Some(_) => Some(m(format!("{p}self_attn.o_gate_proj.weight"), &[c.q_dim(), h])?),
                        None => None,
                    },
                    k: m(format!("{p}self_attn.k_proj.weight"), &[c.kv_dim(), h])?,
                    v: m(format!("{p}self_attn.v_proj.weight"), &[c.kv_dim(), h])?,
                    o: m(format!("{p}self_attn.o_proj.weight"), &[h, c.q_dim()])?,
                    q_norm: v(format!("{p}self_attn.q_norm.weight"), hd)?,
                    k_norm: v(format!("{p}self_attn.k_norm.weight"), hd)?,
                }),
            };
            layers.push(Layer {
                input_norm: v(format!("{p}input_layernorm.weight"), h)?,
                post_norm: v(format!("{p}post_attention_layernorm.weight"), h)?,
                mixer,
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
            rope: Rope::new(c.rope_theta, c.rotary_dim()),
            delta: c.hybrid.as_ref().map(|hy| delta_net::Dims::new(hy, c.rms_norm_eps as f32)),
            replay: None,
            cache_aware: None,
            substitutions: AtomicU64::new(0),
            cfg: c,
            pkg,
        })
    }

    /// Take every MoE block's route from `replay` from now on (None: the routers' own again).
    pub fn set_route_replay(&mut self, replay: Option<Arc<RouteReplay>>) -> Result<(), ModelError> {
        if replay.is_some() && self.cache_aware.is_some() {
            return Err(ModelError::Unsupported("cache-aware routing cannot steer replayed routes".into()));
        }
        if let Some(r) = &replay {
            r.check_model(self.cfg.num_experts, self.cfg.num_experts_per_tok).map_err(ModelError::Unsupported)?;
        }
        self.replay = replay;
        Ok(())
    }

    pub fn route_replay(&self) -> Option<&RouteReplay> {
        self.replay.as_deref()
    }

    /// Cache-aware routing with tolerance `tol` (an absolute gap in router probability), or
    /// exact routing (None). Not with replayed routes.
    pub fn set_cache_aware_routing(&mut self, tol: Option<f32>) -> Result<(), ModelError> {
        if tol.is_some() && self.replay.is_some() {
            return Err(ModelError::Unsupported("cache-aware routing cannot steer replayed routes".into()));
        }
        if let Some(t) = tol
            && !(0.0..=1.0).contains(&t)
        {
            return Err(ModelError::Unsupported(format!("cache-aware routing tolerance {t} is not in [0, 1]")));
        }
        self.cache_aware = tol;
        Ok(())
    }

    pub fn cache_aware_routing(&self) -> Option<f32> {
        self.cache_aware
    }

    /// Routed experts cache-aware routing replaced so far.
    pub fn substitutions(&self) -> u64 {
        self.substitutions.load(Ordering::Relaxed)
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
            let per: u64 = ex.parts_of(0).iter().map(|p| p.shape.iter().product::<usize>() as u64).sum();
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
            let parts: u64 = (0..ex.layers.len()).flat_map(|i| ex.parts_of(i)).map(|p| p.length).sum();
            total += parts * c.num_experts_per_tok as u64;
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
            exec.rows_mut("embed_rows", &mut st.x[..t_n * h], h, &|r, x| {
                for (t, x) in r.zip(x.chunks_exact_mut(h)) {
                    emb.dequant_row(tokens[t] as usize, x);
                }
            });
        }
        obs.hidden(0, &st.x[..t_n * h]);
        // cos/sin of each position, shared by all layers
        let half = c.rotary_dim() / 2;
        for t in 0..t_n {
            let (cs, sn) = (&mut st.cos[t * half..(t + 1) * half], &mut st.sin[t * half..(t + 1) * half]);
            self.rope.cos_sin(pos0 + t, cs, sn);
        }
        let eps = c.rms_norm_eps as f32;
        for (l, layer) in self.layers.iter().enumerate() {
            let is_moe = matches!(layer.ffn, Ffn::Moe { .. });
            let _layer = trace::span("layer").arg("layer", l).arg("kind", if is_moe { "moe" } else { "dense" });
            // the mixer's norm, the mixer, residual add, the MLP's norm
            let (x, hn) = (&st.x[..t_n * h], &mut st.hn[..t_n * h]);
            norm_rows(exec, x, pkg.f32_by_index(layer.input_norm), eps, hn);
            match &layer.mixer {
                Mixer::Attention(a) => self.attention(exec, l, a, t_n, pos0, kv, st),
                Mixer::Linear(dn) => self.linear(exec, l, dn, t_n, kv, st)?,
            }
            let (x, hn, delta) = (&mut st.x[..t_n * h], &mut st.hn[..t_n * h], &mut st.delta[..t_n * h]);
            add_rows(exec, x, delta, h);
            norm_rows(exec, x, pkg.f32_by_index(layer.post_norm), eps, hn);
            // the MLP or the MoE block into delta, residual add
            match layer.ffn {
                Ffn::Dense { gate, up, down } => {
                    let _m = trace::span("mlp").arg("layer", l);
                    let (g, u, d) = (pkg.mat_by_index(gate), pkg.mat_by_index(up), pkg.mat_by_index(down));
                    let labels = ["gate_up_proj", "gate_proj", "up_proj", "down_proj"];
                    let y = swiglu_mlp(exec, labels, &g, &u, &d, hn, t_n, &mut st.scratch);
                    delta.copy_from_slice(&y);
                }
                Ffn::Moe { router, moe_layer, shared } => {
                    // the shared expert first: it does not depend on the route, and with its
                    // output on the residual the next layer's router predicts better (reported
                    // +3 points of recall); added after the routed sum, as transformers does
                    let shared_y = shared.map(|se| self.shared_expert(exec, l, se, t_n, st));
                    let lookahead = match &shared_y {
                        Some(y) if t_n == 1 => {
                            let mut r = st.x[..h].to_vec();
                            add_inplace(&mut r, y);
                            let mut la = vec![0f32; h];
                            rms_norm(&r, pkg.f32_by_index(layer.post_norm), eps, &mut la);
                            Some(la)
                        }
                        _ => None,
                    };
                    let at = MoeAt { layer: l, moe_layer, router, pos0, lookahead: lookahead.as_deref() };
                    self.moe(exec, experts, at, t_n, st, obs)?;
                    if let Some(y) = shared_y {
                        add_inplace(&mut st.delta[..t_n * h], &y);
                    }
                }
            }
            let (x, delta) = (&mut st.x[..t_n * h], &st.delta[..t_n * h]);
            add_rows(exec, x, delta, h);
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
            exec.rows_mut("final_norm_rows", x, h, &|_, x| {
                for x in x.chunks_exact_mut(h) {
                    rms_norm_inplace(x, norm, eps);
                }
            });
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

    /// Self-attention of layer `l` for the first `t_n` rows of `st.hn` (normed), at positions
    /// `pos0..`; the result (before the residual add) in `st.delta`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        exec: &Exec,
        l: usize,
        layer: &Attention,
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
        let RunState { hn, delta, q, gate, k, v, qkv, attn, cos, sin, scratch: s, .. } = st;
        let (hn, out) = (&hn[..t_n * h], &mut delta[..t_n * h]);
        let (q, k, v) = (&mut q[..t_n * nh * hd], &mut k[..t_n * nkv * hd], &mut v[..t_n * nkv * hd]);
        let (wq, wk, wv) = (pkg.mat_by_index(layer.q), pkg.mat_by_index(layer.k), pkg.mat_by_index(layer.v));
        let wg = layer.o_gate.map(|g| pkg.mat_by_index(g));
        let gate = &mut gate[..if wg.is_some() { t_n * nh * hd } else { 0 }];
        if t_n == 1 {
            // decode: all in one parallel section (its pieces cross from q into k and v),
            // one quantization of the normed input
            let (qd, kvd, gd) = (nh * hd, nkv * hd, gate.len());
            let mut mats = vec![&wq];
            mats.extend(wg.as_ref());
            mats.extend([&wk, &wv]);
            let qkv = &mut qkv[..qd + gd + 2 * kvd];
            exec.matvec_concat("qkv_proj", &mats, hn, qkv, s);
            let (qp, rest) = qkv.split_at(qd);
            let (gp, kv_part) = rest.split_at(gd);
            q.copy_from_slice(qp);
            gate.copy_from_slice(gp);
            k.copy_from_slice(&kv_part[..kvd]);
            v.copy_from_slice(&kv_part[kvd..]);
        } else {
            // one quantization of the normed input for all of them
            let mut prods = vec![("q_proj", &wq, &mut *q)];
            if let Some(wg) = &wg {
                prods.push(("o_gate_proj", wg, &mut *gate));
            }
            prods.extend([("k_proj", &wk, &mut *k), ("v_proj", &wv, &mut *v)]);
            exec.matmul_shared(hn, t_n, &mut prods, s);
        }
        let (qn, kn) = (pkg.f32_by_index(layer.q_norm), pkg.f32_by_index(layer.k_norm));
        let half = c.rotary_dim() / 2;
        // each head of each token normed and rotated by its position (the rows in parallel)
        let rope = Angles { cos, sin, half };
        norm_rope_rows(exec, "q_norm_rope", q, nh * hd, hd, qn, eps, rope);
        norm_rope_rows(exec, "k_norm_rope", k, nkv * hd, hd, kn, eps, rope);
        for t in 0..t_n {
            kv.write(l, pos0 + t, &k[t * nkv * hd..(t + 1) * nkv * hd], &v[t * nkv * hd..(t + 1) * nkv * hd]);
        }
        let attn = &mut attn[..t_n * nh * hd];
        attention::attend(exec, kv, l, attention::Heads { nh, nkv, hd }, q, pos0, attn);
        // gated attention: each output value times sigmoid of its gate
        if !gate.is_empty() {
            let gate = &gate[..];
            exec.rows_mut("attn_gate", attn, nh * hd, &|r, a| {
                for (a, &g) in a.iter_mut().zip(&gate[r.start * nh * hd..r.end * nh * hd]) {
                    *a *= 1.0 / (1.0 + (-g).exp());
                }
            });
        }
        exec.matmul("o_proj", &pkg.mat_by_index(layer.o), attn, t_n, out, s);
    }

    /// Gated DeltaNet of linear-attention layer `l` for the first `t_n` rows of `st.hn`,
    /// advancing the layer's state in `kv`; the result in `st.delta`.
    fn linear(
        &self,
        exec: &Exec,
        l: usize,
        dn: &DeltaNet,
        t_n: usize,
        kv: &mut KvCache,
        st: &mut RunState,
    ) -> Result<(), ModelError> {
        let h = self.cfg.hidden_size;
        let _s = trace::span("linear_attention").arg("layer", l).arg("tokens", t_n);
        let (Some(d), Some(state), Some(bufs)) = (self.delta, kv.linear_mut(l), st.linear.as_mut()) else {
            return Err(ModelError::Unsupported(format!(
                "layer {l} is linear attention, but the model or its cache has no linear-attention state"
            )));
        };
        let (hn, out) = (&st.hn[..t_n * h], &mut st.delta[..t_n * h]);
        delta_net::forward(exec, &self.pkg, dn, d, state, hn, t_n, bufs, &mut st.scratch, out);
        Ok(())
    }

    /// The shared expert of MoE layer `l` scaled by its gate, `[t_n, H]`, for the first `t_n`
    /// rows of `st.hn` (to be added to the routed sum).
    fn shared_expert(&self, exec: &Exec, l: usize, se: SharedExpert, t_n: usize, st: &mut RunState) -> Vec<f32> {
        let h = self.cfg.hidden_size;
        let pkg = &*self.pkg;
        let _s = trace::span("shared_expert").arg("layer", l).arg("tokens", t_n);
        let (g, u, d) = (pkg.mat_by_index(se.gate_proj), pkg.mat_by_index(se.up_proj), pkg.mat_by_index(se.down_proj));
        let hn = &st.hn[..t_n * h];
        let labels = ["shared_gate_up_proj", "shared_gate_proj", "shared_up_proj", "shared_down_proj"];
        let mut y = swiglu_mlp(exec, labels, &g, &u, &d, hn, t_n, &mut st.scratch);
        let wg = pkg.f32_by_index(se.gate);
        for (t, yt) in y.chunks_exact_mut(h).enumerate() {
            let x = &hn[t * h..(t + 1) * h];
            let z: f32 = wg.iter().zip(x).map(|(&w, &v)| w * v).sum();
            let sg = 1.0 / (1.0 + (-z).exp());
            for v in yt.iter_mut() {
                *v *= sg;
            }
        }
        y
    }

    /// The routed-experts block of MoE layer `at` for the first `t_n` tokens of `st.hn`
    /// (normed); the result in `st.delta`.
    fn moe(
        &self,
        exec: &Exec,
        experts: &dyn ExpertSource,
        at: MoeAt<'_>,
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
        let replay = self.replay.as_deref().map(|r| ReplayAt {
            replay: r,
            moe_layer: at.moe_layer,
            base: r.begin(at.moe_layer, t_n),
        });
        let steer = match (replay, self.cache_aware) {
            (Some(r), _) => Steer::Replay(r),
            (None, Some(tol)) => Steer::CacheAware { source: experts, moe_layer: at.moe_layer, tol },
            (None, None) => Steer::Exact,
        };
        let routing = moe::route(exec, &router, spec, at.layer, hn, at.pos0, &mut probs[..t_n * e_n], s, obs, steer);
        if routing.substituted > 0 {
            self.substitutions.fetch_add(routing.substituted as u64, Ordering::Relaxed);
            span.set("substituted", routing.substituted);
        }
        span.set("experts_used", routing.used.len());
        let predicted = replay.filter(|_| t_n == 1).map(|r| r.candidates(0)).filter(|c| !c.is_empty());
        let q = ExpertQuery {
            layer: at.layer,
            moe_layer: at.moe_layer,
            tokens: t_n,
            used: &routing.used,
            lookahead: at.lookahead.unwrap_or(hn),
            predicted,
            ranked: if t_n == 1 { routing.picks_of(0) } else { &[] },
        };
        let bufs = moe::SumBuffers { yk: &mut yk[..t_n * k_n * h], out };
        moe::routed_sum(exec, experts, &q, &routing, hn, self.pkg.sizes().blob, bufs, s)
    }
}

/// Where a MoE block runs: its layer, its place among the MoE layers, its router tensor and the
/// batch's first position.
#[derive(Debug, Clone, Copy)]
struct MoeAt<'a> {
    layer: usize,
    moe_layer: usize,
    router: TensorId,
    pos0: usize,
    /// What the predictor should see instead of the block's normed input (see `ExpertQuery`).
    lookahead: Option<&'a [f32]>,
}
