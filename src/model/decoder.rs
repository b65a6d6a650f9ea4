//! The layer stack every family runs: embeddings, then per layer a mixer and an MLP, each
//! behind an RMS norm and added to the residual stream, then the final norm and the LM head.
//!
//! For a batch of T tokens at positions `pos0..pos0+T` (prefill: a prompt chunk; decode:
//! T = 1), per layer:
//! ```text
//! hn = rms_norm(x) · input_layernorm;        x += mixer(hn)   attention, gated attention or
//!                                                             Gated DeltaNet (`layer_types`)
//! hn = rms_norm(x) · post_attention_layernorm; x += ffn(hn)   a dense MLP or the MoE block
//! ```
//! then `logits = rms_norm(x) · norm · lm_head` (the embedding when tied). Each block is a
//! type with its own `forward(pass, layer)` (`attention.rs`, `delta_net.rs`, `mlp.rs`,
//! `moe.rs`); what they share is the [`Pass`]. Qwen3-MoE, Qwen3-Next and Qwen3.5 differ only
//! in which blocks their layers hold (the converter gives all three one tensor layout), so a
//! family is a choice of blocks and a router rule, not a file of its own.

use std::sync::Arc;

use smallvec::SmallVec;

use moescope_kernels::ops::{Rope, rms_norm_inplace};

use super::attention::Attention;
use super::delta_net::DeltaNet;
use super::error::ModelError;
use super::kv_cache::KvCache;
use super::mla::LatentAttention;
use super::mlp::DenseMlp;
use super::moe::Moe;
use super::observer::Observer;
use super::pass::{Pass, Runtime, SeqRows};
use super::route_replay::RouteReplay;
use super::router::{Router, Scoring};
use super::rows::{add_rows, norm_rows};
use super::run_state::RunState;
use super::steering::Steering;
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

/// One sequence of a batched pass: its cache, its next tokens (at positions `kv.len()..`), and
/// which of their logits it needs.
pub struct Seq<'a> {
    pub kv: &'a mut KvCache,
    pub tokens: &'a [u32],
    pub want: Logits,
}

/// What mixes information across positions.
enum Mixer {
    Attention(Attention),
    Latent(LatentAttention),
    Linear(DeltaNet),
}

impl Mixer {
    fn forward(&self, pass: &mut Pass<'_, '_>, l: usize) -> Result<(), ModelError> {
        match self {
            Mixer::Attention(a) => a.forward(pass, l),
            Mixer::Latent(a) => a.forward(pass, l),
            Mixer::Linear(d) => d.forward(pass, l)?,
        }
        Ok(())
    }
}

/// What each position runs through on its own.
enum Ffn {
    Dense(DenseMlp),
    Moe(Moe),
}

struct Layer {
    /// `[H]` f32 each
    input_norm: TensorId,
    post_norm: TensorId,
    mixer: Mixer,
    ffn: Ffn,
}

impl Layer {
    /// Layer `l` on the pass's residual stream `st.x`.
    fn forward(&self, pass: &mut Pass<'_, '_>, l: usize, eps: f32) -> Result<(), ModelError> {
        let kind = if matches!(self.ffn, Ffn::Moe(_)) { "moe" } else { "dense" };
        let _layer = trace::span("layer").arg("layer", l).arg("kind", kind);
        let (exec, pkg) = (pass.exec, pass.pkg);
        let rows = pass.t_n * pkg.f32_by_index(self.input_norm).len();
        let st = &mut *pass.st;
        norm_rows(exec, &st.x[..rows], pkg.f32_by_index(self.input_norm), eps, &mut st.hn[..rows]);
        self.mixer.forward(pass, l)?;
        let st = &mut *pass.st;
        let h = rows / pass.t_n;
        add_rows(exec, &mut st.x[..rows], &st.delta[..rows], h);
        norm_rows(exec, &st.x[..rows], pkg.f32_by_index(self.post_norm), eps, &mut st.hn[..rows]);
        match &self.ffn {
            Ffn::Dense(m) => m.forward(pass, l),
            Ffn::Moe(m) => m.forward(pass, l)?,
        }
        let st = &mut *pass.st;
        add_rows(exec, &mut st.x[..rows], &st.delta[..rows], h);
        pass.obs.hidden(l + 1, &st.x[..rows]);
        Ok(())
    }
}

/// A model bound to a package's tensors: the layer stack and its routing switches.
pub struct Decoder {
    pub cfg: ModelConfig,
    pkg: Arc<Package>,
    embed: TensorId,
    norm: TensorId,
    lm_head: TensorId,
    layers: Vec<Layer>,
    rope: Rope,
    steering: Steering,
}

impl Decoder {
    /// Bind the package's tensors, checking every name and shape the forward pass uses.
    pub fn load(pkg: Arc<Package>) -> Result<Decoder, ModelError> {
        let c = pkg.meta.model.clone();
        let h = c.hidden_size;
        let m = |name: &str, shape: &[usize]| pkg.require(name, shape, false);
        let v = |name: &str| pkg.require(name, &[h], true);
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut moe_layers = 0;
        for l in 0..c.num_hidden_layers {
            let p = format!("model.layers.{l}.");
            let post_norm = v(&format!("{p}post_attention_layernorm.weight"))?;
            let ffn = if c.is_moe_layer(l) {
                moe_layers += 1;
                Ffn::Moe(Moe::load(&pkg, &format!("{p}mlp."), &c, moe_layers - 1, post_norm)?)
            } else {
                Ffn::Dense(DenseMlp::load(&pkg, &format!("{p}mlp."), h, c.intermediate_size)?)
            };
            let mixer = match (c.layer_kind(l), &c.hybrid) {
                (LayerKind::LinearAttention, Some(hy)) => {
                    Mixer::Linear(DeltaNet::load(&pkg, &format!("{p}linear_attn."), hy, h, c.rms_norm_eps as f32)?)
                }
                _ if c.features.mla.is_some() => {
                    Mixer::Latent(LatentAttention::load(&pkg, &format!("{p}self_attn."), &c)?)
                }
                _ => Mixer::Attention(Attention::load(&pkg, &format!("{p}self_attn."), &c, c.window(l))?),
            };
            layers.push(Layer { input_norm: v(&format!("{p}input_layernorm.weight"))?, post_norm, mixer, ffn });
        }
        let embed = m("model.embed_tokens.weight", &[c.vocab_size, h])?;
        let lm_head = if c.tie_word_embeddings { embed } else { m("lm_head.weight", &[c.vocab_size, h])? };
        Ok(Decoder {
            norm: v("model.norm.weight")?,
            embed,
            lm_head,
            layers,
            rope: match &c.features.rope_yarn {
                Some(y) => Rope::with_freqs(y.inv_freq(c.rope_theta, c.rotary_dim()), y.attention_factor as f32),
                None => Rope::new(c.rope_theta, c.rotary_dim()),
            },
            steering: Steering::default(),
            cfg: c,
            pkg,
        })
    }

    /// Take every MoE block's route from `replay` from now on (None: the routers' own again).
    pub fn set_route_replay(&mut self, replay: Option<Arc<RouteReplay>>) -> Result<(), ModelError> {
        self.steering.set_route_replay(replay, self.cfg.num_experts, self.cfg.num_experts_per_tok)
    }

    pub fn route_replay(&self) -> Option<&RouteReplay> {
        self.steering.route_replay()
    }

    /// Cache-aware routing with tolerance `tol` (an absolute gap in router probability), or
    /// exact routing (None). Not with replayed routes, and only over plain softmax routers.
    pub fn set_cache_aware_routing(&mut self, tol: Option<f32>) -> Result<(), ModelError> {
        let plain = self
            .routers()
            .iter()
            .all(|r| r.rule.scoring == Scoring::Softmax && r.rule.groups.is_none() && r.correction.is_none());
        if tol.is_some() && !plain {
            return Err(ModelError::Unsupported("cache-aware routing needs plain softmax routers".into()));
        }
        self.steering.set_cache_aware_routing(tol)
    }

    pub fn cache_aware_routing(&self) -> Option<f32> {
        self.steering.cache_aware_routing()
    }

    /// Routed experts cache-aware routing replaced so far.
    pub fn substitutions(&self) -> u64 {
        self.steering.substitutions()
    }

    /// The MoE layers' routers, in forward order (for the predictor).
    pub fn routers(&self) -> Vec<Router> {
        self.layers
            .iter()
            .filter_map(|l| match &l.ffn {
                Ffn::Moe(m) => Some(*m.router()),
                Ffn::Dense(_) => None,
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

    /// Weights one decode token reads, counted as [`decode_weight_bytes`](Self::decode_weight_bytes)
    /// counts their bytes (the embedding's one row; `top-k` experts a MoE layer): bytes over
    /// this are the bits a weight decode reads, the file's own where the package keeps them.
    pub fn decode_weights(&self) -> u64 {
        let c = &self.cfg;
        let count = |shape: &[usize]| shape.iter().product::<usize>() as u64;
        let mut total = 0u64;
        for (i, t) in self.pkg.meta.tensors.iter().enumerate() {
            if i == self.embed.index() {
                total += c.hidden_size as u64 + if c.tie_word_embeddings { count(&t.shape) } else { 0 };
            } else {
                total += count(&t.shape);
            }
        }
        if let Some(ex) = &self.pkg.meta.experts {
            let parts: u64 = (0..ex.layers.len()).flat_map(|i| ex.parts_of(i)).map(|p| count(&p.shape)).sum();
            total += parts * c.num_experts_per_tok as u64;
        }
        total
    }

    /// Run `tokens` at positions `kv.len()..` in the buffers of `st`, appending their keys and
    /// values to `kv`; the routed experts come from `rt.experts`. The logits asked for, in
    /// `st` (`[rows, vocab]`).
    pub fn forward<'s>(
        &self,
        rt: Runtime<'_>,
        st: &'s mut RunState,
        kv: &mut KvCache,
        tokens: &[u32],
        want: Logits,
        obs: &mut dyn Observer,
    ) -> Result<&'s [f32], ModelError> {
        self.forward_batch(rt, st, &mut [Seq { kv, tokens, want }], obs)
    }

    /// Run several sequences' tokens in one pass (a server's batch: a decode token each, or a
    /// prompt chunk), each at positions `kv.len()..` of its own cache. Each row is computed as
    /// it would be in a pass of its sequence alone (the products give a row the same bits in
    /// any batch; attention and the linear attention's recurrence run per sequence), while the
    /// weights, and each routed expert, are read once for all of them. The logits asked for,
    /// the sequences' rows in order, in `st` (`[rows, vocab]`).
    pub fn forward_batch<'s>(
        &self,
        rt: Runtime<'_>,
        st: &'s mut RunState,
        seqs: &mut [Seq<'_>],
        obs: &mut dyn Observer,
    ) -> Result<&'s [f32], ModelError> {
        let c = &self.cfg;
        let h = c.hidden_size;
        let t_n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        for s in seqs.iter() {
            let need = s.kv.len() + s.tokens.len();
            if need > s.kv.capacity() {
                return Err(ModelError::ContextFull { need, ctx: s.kv.capacity() });
            }
            if let Some(&bad) = s.tokens.iter().find(|&&id| id as usize >= c.vocab_size) {
                return Err(ModelError::TokenOutOfRange { id: bad, vocab: c.vocab_size });
            }
        }
        if t_n > st.chunk {
            return Err(ModelError::BatchTooLarge { tokens: t_n, chunk: st.chunk });
        }
        let (exec, pkg) = (rt.exec, &*self.pkg);
        let pos0 = seqs.first().map_or(0, |s| s.kv.len());
        let _fwd = trace::span("forward").arg("tokens", t_n).arg("pos", pos0).arg("sequences", seqs.len());
        obs.begin_pass();
        rt.experts.begin_pass();
        st.ids.clear();
        seqs.iter().for_each(|s| st.ids.extend_from_slice(s.tokens));
        self.embed(rt, st);
        obs.hidden(0, &st.x[..t_n * h]);
        // cos/sin of each row's position, shared by all layers
        let half = c.rotary_dim() / 2;
        let mut row = 0;
        for s in seqs.iter() {
            for p in s.kv.len()..s.kv.len() + s.tokens.len() {
                let (cs, sn) = (&mut st.cos[row * half..(row + 1) * half], &mut st.sin[row * half..(row + 1) * half]);
                self.rope.cos_sin(p, cs, sn);
                row += 1;
            }
        }
        let eps = c.rms_norm_eps as f32;
        {
            let mut row0 = 0;
            let mut rows: SmallVec<[SeqRows<'_>; 8]> = SmallVec::new();
            for s in seqs.iter_mut() {
                let (n, pos0) = (s.tokens.len(), s.kv.len());
                rows.push(SeqRows { kv: &mut *s.kv, row0, n, pos0 });
                row0 += n;
            }
            let mut pass = Pass {
                exec,
                pkg,
                experts: rt.experts,
                obs: &mut *obs,
                seqs: &mut rows,
                st: &mut *st,
                steering: &self.steering,
                t_n,
            };
            for (l, layer) in self.layers.iter().enumerate() {
                layer.forward(&mut pass, l, eps)?;
            }
        }
        for s in seqs.iter_mut() {
            let len = s.kv.len() + s.tokens.len();
            s.kv.set_len(len);
        }

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
        // the rows asked for: a sequence's last `n`; where they are not the batch's last rows,
        // gathered into `hn` (free now) in order
        let wanted = |s: &Seq<'_>| match s.want {
            Logits::All => s.tokens.len(),
            Logits::Last => s.tokens.len().min(1),
            Logits::None => 0,
        };
        let n: usize = seqs.iter().map(wanted).sum();
        st.logits_len = n * c.vocab_size;
        if n == 0 {
            return Ok(&[]);
        }
        // (a sequence's wanted rows are its last ones: when no other wants any, they end the batch)
        let tail = seqs.iter().rev().skip(1).all(|s| wanted(s) == 0);
        let x = if tail {
            &st.x[(t_n - n) * h..t_n * h]
        } else {
            let (mut at, mut end) = (0, 0);
            for s in seqs.iter() {
                end += s.tokens.len();
                let w = wanted(s);
                st.hn[at * h..(at + w) * h].copy_from_slice(&st.x[(end - w) * h..end * h]);
                at += w;
            }
            &st.hn[..n * h]
        };
        let v = c.vocab_size;
        if st.logits.len() < n * v {
            st.logits.resize(n * v, 0.0);
        }
        exec.matmul("lm_head", &pkg.mat_by_index(self.lm_head), x, n, &mut st.logits[..n * v], &mut st.scratch);
        Ok(st.logits())
    }

    /// The embeddings of the batch's tokens (`st.ids`) into `st.x`, the rows in parallel.
    fn embed(&self, rt: Runtime<'_>, st: &mut RunState) {
        let h = self.cfg.hidden_size;
        let emb = self.pkg.mat_by_index(self.embed);
        let _e = trace::span("embed");
        let tokens = &st.ids[..];
        rt.exec.rows_mut("embed_rows", &mut st.x[..tokens.len() * h], h, &|r, x| {
            for (t, x) in r.zip(x.chunks_exact_mut(h)) {
                emb.dequant_row(tokens[t] as usize, x);
            }
        });
    }
}
