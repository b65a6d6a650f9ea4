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

use std::sync::{Arc, Mutex};

use moescope_kernels::Mat;
use moescope_kernels::ops::{
    Rope, add_inplace, apply_rope, rms_norm, rms_norm_inplace, softmax_inplace, swiglu, top_k,
};

use super::attention;
use super::config::ModelConfig;
use super::error::ModelError;
use super::exec::{Chunks, Exec, Scratch};
use super::kv_cache::KvCache;
use crate::experts::Experts;
use crate::package::{ExpertMats, Package};
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

/// What a forward pass reports as it goes (routing for the heatmap and the tests, hidden
/// states for debugging). Every method has a no-op default.
pub trait Observer {
    /// A forward pass begins (a prompt chunk or one decode token).
    fn begin_pass(&mut self) {}
    /// Token `t` of the batch (position `pos`) in MoE layer `layer` picked `experts` (rank
    /// order) with routing `weights`; `probs` is the softmax over all experts.
    fn routing(&mut self, _layer: usize, _pos: usize, _experts: &[usize], _weights: &[f32], _probs: &[f32]) {}
    /// Hidden states `[T, H]` after stage `i` (0 = embeddings, l + 1 = after layer l,
    /// L + 1 = after the final norm).
    fn hidden(&mut self, _i: usize, _x: &[f32]) {}
}

pub struct NoObserver;
impl Observer for NoObserver {}

enum Ffn {
    Dense { gate: usize, up: usize, down: usize },
    Moe { router: usize },
}

struct Layer {
    input_norm: usize,
    post_norm: usize,
    q: usize,
    k: usize,
    v: usize,
    o: usize,
    q_norm: usize,
    k_norm: usize,
    ffn: Ffn,
}

pub struct Qwen3Moe {
    pub cfg: ModelConfig,
    pkg: Arc<Package>,
    /// Where experts come from: None = the package's mapping (all resident), Some = streamed
    /// through the expert pool.
    experts: Option<Arc<Experts>>,
    embed: usize,
    norm: usize,
    lm_head: usize,
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
        for l in 0..c.num_hidden_layers {
            let p = format!("model.layers.{l}.");
            let ffn = if c.is_moe_layer(l) {
                Ffn::Moe { router: pkg.require(&format!("{p}mlp.gate.weight"), &[c.num_experts, h], true)? }
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
            experts: None,
        })
    }

    /// Router tensors of the MoE layers, in forward order (for the predictor).
    pub fn routers(&self) -> Vec<usize> {
        self.layers
            .iter()
            .filter_map(|l| match l.ffn {
                Ffn::Moe { router } => Some(router),
                Ffn::Dense { .. } => None,
            })
            .collect()
    }

    /// Stream experts through `experts` (None: read them from the package's mapping).
    pub fn set_experts(&mut self, experts: Option<Arc<Experts>>) {
        self.experts = experts;
    }

    pub fn experts(&self) -> Option<&Arc<Experts>> {
        self.experts.as_ref()
    }

    /// Index of layer `l` among the MoE layers (its place in the expert table).
    fn moe_index(&self, l: usize) -> usize {
        self.layers[..l].iter().filter(|x| matches!(x.ffn, Ffn::Moe { .. })).count()
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
            if i == self.embed {
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

    /// Run `tokens` at positions `kv.len()..`, appending their keys and values to `kv`.
    pub fn forward(
        &self,
        exec: &Exec,
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
        let pkg = &*self.pkg;
        let _fwd = trace::span("forward").arg("tokens", t_n).arg("pos", pos0);
        obs.begin_pass();
        if let Some(ex) = &self.experts {
            ex.cache.begin_pass();
        }
        let mut s = Scratch::default();
        // x [T, H]: the residual stream
        let mut x = vec![0f32; t_n * h];
        let emb = pkg.mat_by_index(self.embed);
        {
            let _e = trace::span("embed");
            for (t, &id) in tokens.iter().enumerate() {
                emb.dequant_row(id as usize, &mut x[t * h..(t + 1) * h]);
            }
        }
        obs.hidden(0, &x);
        // cos/sin of each position, shared by all layers: [T, hd/2]
        let half = c.head_dim / 2;
        let (mut cos, mut sin) = (vec![0f32; t_n * half], vec![0f32; t_n * half]);
        for t in 0..t_n {
            self.rope.cos_sin(pos0 + t, &mut cos[t * half..(t + 1) * half], &mut sin[t * half..(t + 1) * half]);
        }
        let mut hbuf = vec![0f32; t_n * h];
        for (l, layer) in self.layers.iter().enumerate() {
            let moe_layer = matches!(layer.ffn, Ffn::Moe { .. });
            let _layer = trace::span("layer").arg("layer", l).arg("kind", if moe_layer { "moe" } else { "dense" });
            self.attention(exec, l, layer, &x, &mut hbuf, pos0, &cos, &sin, kv, &mut s);
            add_inplace(&mut x, &hbuf);
            let w = pkg.f32_by_index(layer.post_norm);
            for t in 0..t_n {
                rms_norm(&x[t * h..(t + 1) * h], w, c.rms_norm_eps as f32, &mut hbuf[t * h..(t + 1) * h]);
            }
            let out = match layer.ffn {
                Ffn::Dense { gate, up, down } => {
                    let _m = trace::span("mlp").arg("layer", l);
                    let (g, u, d) = (pkg.mat_by_index(gate), pkg.mat_by_index(up), pkg.mat_by_index(down));
                    swiglu_mlp(
                        exec,
                        ["gate_up_proj", "gate_proj", "up_proj", "down_proj"],
                        &g,
                        &u,
                        &d,
                        &hbuf,
                        t_n,
                        &mut s,
                    )
                }
                Ffn::Moe { router } => self.moe(exec, l, router, &hbuf, pos0, &mut s, obs)?,
            };
            add_inplace(&mut x, &out);
            obs.hidden(l + 1, &x);
        }
        kv.set_len(pos0 + t_n);

        let rows: Vec<usize> = match want {
            Logits::All => (0..t_n).collect(),
            Logits::Last => vec![t_n - 1],
            Logits::None => vec![],
        };
        let norm = pkg.f32_by_index(self.norm);
        {
            let _n = trace::span("final_norm");
            for t in 0..t_n {
                rms_norm_inplace(&mut x[t * h..(t + 1) * h], norm, c.rms_norm_eps as f32);
            }
        }
        obs.hidden(c.num_hidden_layers + 1, &x);
        if rows.is_empty() {
            return Ok(vec![]);
        }
        let xs: Vec<f32> = rows.iter().flat_map(|&t| x[t * h..(t + 1) * h].iter().copied()).collect();
        let mut logits = vec![0f32; rows.len() * c.vocab_size];
        exec.matmul("lm_head", &pkg.mat_by_index(self.lm_head), &xs, rows.len(), &mut logits, &mut s);
        Ok(logits)
    }

    /// Self-attention of layer `l` for the batch; result (before the residual add) in `out`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        exec: &Exec,
        l: usize,
        layer: &Layer,
        x: &[f32],
        out: &mut [f32],
        pos0: usize,
        cos: &[f32],
        sin: &[f32],
        kv: &mut KvCache,
        s: &mut Scratch,
    ) {
        let c = &self.cfg;
        let pkg = &*self.pkg;
        let (h, hd, nh, nkv) = (c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads);
        let t_n = x.len() / h;
        let _att = trace::span("attention").arg("layer", l).arg("tokens", t_n).arg("pos", pos0);
        let eps = c.rms_norm_eps as f32;
        let mut hn = vec![0f32; t_n * h];
        let w = pkg.f32_by_index(layer.input_norm);
        for t in 0..t_n {
            rms_norm(&x[t * h..(t + 1) * h], w, eps, &mut hn[t * h..(t + 1) * h]);
        }
        // q [T, nh*hd], k and v [T, nkv*hd]
        let (mut q, mut k, mut v) = (vec![0f32; t_n * nh * hd], vec![0f32; t_n * nkv * hd], vec![0f32; t_n * nkv * hd]);
        let (wq, wk, wv) = (pkg.mat_by_index(layer.q), pkg.mat_by_index(layer.k), pkg.mat_by_index(layer.v));
        if t_n == 1 {
            // decode: the three in one parallel section (its pieces cross from q into k and v),
            // one quantization of the normed input
            let mut qkv = vec![0f32; (nh + 2 * nkv) * hd];
            exec.matvec_concat("qkv_proj", &[&wq, &wk, &wv], &hn, &mut qkv, s);
            let (qp, kv_part) = qkv.split_at(nh * hd);
            q.copy_from_slice(qp);
            k.copy_from_slice(&kv_part[..nkv * hd]);
            v.copy_from_slice(&kv_part[nkv * hd..]);
        } else {
            // one quantization of the normed input for all three
            exec.matmul_shared(
                &hn,
                t_n,
                &mut [("q_proj", &wq, &mut q), ("k_proj", &wk, &mut k), ("v_proj", &wv, &mut v)],
                s,
            );
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
        let mut attn = vec![0f32; t_n * nh * hd];
        attention::attend(exec, kv, l, attention::Heads { nh, nkv, hd }, &q, pos0, &mut attn);
        exec.matmul("o_proj", &pkg.mat_by_index(layer.o), &attn, t_n, out, s);
    }

    /// The routed-experts block of MoE layer `l` for the batch `hn` (`[T, H]`, normed).
    #[allow(clippy::too_many_arguments)]
    fn moe(
        &self,
        exec: &Exec,
        l: usize,
        router: usize,
        hn: &[f32],
        pos0: usize,
        s: &mut Scratch,
        obs: &mut dyn Observer,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.cfg;
        let pkg = &*self.pkg;
        let (h, e_n, k_n) = (c.hidden_size, c.num_experts, c.num_experts_per_tok);
        let t_n = hn.len() / h;
        let mut moe_span = trace::span("moe").arg("layer", l).arg("tokens", t_n);
        let mut router_span = trace::span("router").arg("layer", l);
        // router logits [T, E] in f32
        let mut probs = vec![0f32; t_n * e_n];
        exec.matmul("router", &pkg.mat_by_index(router), hn, t_n, &mut probs, s);
        // per token: softmax, top-k by probability (ties: lower expert id), weights
        let mut chosen = vec![(0usize, 0f32); t_n * k_n];
        let mut order: Vec<usize> = Vec::with_capacity(e_n);
        for t in 0..t_n {
            let p = &mut probs[t * e_n..(t + 1) * e_n];
            softmax_inplace(p);
            top_k(p, k_n, &mut order);
            let top = &order[..];
            let sum: f32 = top.iter().map(|&e| p[e]).sum();
            let norm = if c.norm_topk_prob { sum } else { 1.0 };
            for (j, &e) in top.iter().enumerate() {
                chosen[t * k_n + j] = (e, p[e] / norm);
            }
            let ids: Vec<usize> = top.to_vec();
            let ws: Vec<f32> = chosen[t * k_n..(t + 1) * k_n].iter().map(|c| c.1).collect();
            if t_n == 1 {
                router_span.set("experts", ids.as_slice());
                router_span.set("weights", ws.as_slice());
            }
            obs.routing(l, pos0 + t, &ids, &ws, p);
        }
        drop(router_span);
        // tokens per expert: (token, rank)
        let mut per_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); e_n];
        for t in 0..t_n {
            for j in 0..k_n {
                per_expert[chosen[t * k_n + j].0].push((t, j));
            }
        }
        // expert outputs, weighted, per (token, rank): [T, k, H]
        let mut yk = vec![0f32; t_n * k_n * h];
        let blob_bytes = pkg.sizes().2;
        let used: Vec<usize> = (0..e_n).filter(|&e| !per_expert[e].is_empty()).collect();
        moe_span.set("experts_used", used.len());
        // each (token, rank) slot of yk is written by the one expert that rank chose
        let yk_slots = Chunks::new(&mut yk);
        let run_expert = |e: usize, ex: &ExpertMats<'_>, exec: &Exec, s: &mut Scratch, flow: Option<u64>| {
            let users = &per_expert[e];
            let _es = trace::span("expert")
                .arg("layer", l)
                .arg("expert", e)
                .arg("tokens", users.len())
                .arg("bytes", blob_bytes);
            trace::flow_end(flow);
            let mut xe = Vec::with_capacity(users.len() * h);
            for &(t, _) in users {
                xe.extend_from_slice(&hn[t * h..(t + 1) * h]);
            }
            let labels = ["expert_gate_up", "expert_gate", "expert_up", "expert_down"];
            let ye = swiglu_mlp(exec, labels, &ex.gate, &ex.up, &ex.down, &xe, users.len(), s);
            for (i, &(t, j)) in users.iter().enumerate() {
                let w = chosen[t * k_n + j].1;
                // SAFETY: slot (t, j) is inside yk and belongs to expert e alone (token t's rank
                // j chose e), so no other task writes it; yk outlives every task
                let dst = unsafe { yk_slots.slice((t * k_n + j) * h, h) };
                for (d, y) in dst.iter_mut().zip(&ye[i * h..(i + 1) * h]) {
                    *d = y * w;
                }
            }
        };
        // one token's expert e output `y` ([H]), weighted into the slot of the rank that chose it
        let weigh = |e: usize, y: &[f32]| {
            let (_, j) = per_expert[e][0];
            let w = chosen[j].1;
            // SAFETY: slot (0, j) is inside yk and belongs to expert e alone, and this runs on
            // the engine thread between parallel sections, while no task writes yk
            let dst = unsafe { yk_slots.slice(j * h, h) };
            for (d, y) in dst.iter_mut().zip(y) {
                *d = y * w;
            }
        };
        match &self.experts {
            None if exec.threads() > 1 && t_n > 1 => {
                // a batch: whole experts per compute thread, the largest first: one parallel
                // section for the layer instead of three per expert, and each expert's
                // gathering, quantization and SwiGLU in parallel too. Every product runs as it
                // would alone, so the result is the same bits.
                let mats: Vec<ExpertMats<'_>> = used.iter().map(|&e| pkg.expert(l, e)).collect::<Result<_, _>>()?;
                let mut order: Vec<usize> = (0..used.len()).collect();
                order.sort_by_key(|&i| std::cmp::Reverse(per_expert[used[i]].len()));
                let scratch: Vec<Mutex<Scratch>> =
                    (0..exec.threads()).map(|_| Mutex::new(Scratch::default())).collect();
                exec.run(order.len(), &|task, p| {
                    let i = order[task];
                    let mut s = scratch[p].lock().unwrap_or_else(|e| e.into_inner());
                    run_expert(used[i], &mats[i], exec.serial(), &mut s, None);
                });
            }
            None if t_n == 1 => {
                // one token: all its experts in two sections split by rows, so the threads
                // finish together. Whole experts per thread (one section) left the threads
                // apart by ~94 µs a layer on the Intel host: bench8 2T tg32 there, 8 alternated
                // pairs, this way won 6 with a median ratio of 1.065 (roofline share median
                // 92.5 vs 92%)
                let mats: Vec<ExpertMats<'_>> = used.iter().map(|&e| pkg.expert(l, e)).collect::<Result<_, _>>()?;
                decode_experts(exec, &mats, hn, s, |i, y| weigh(used[i], y));
            }
            None => {
                for &e in &used {
                    let ex = pkg.expert(l, e)?;
                    run_expert(e, &ex, exec, s, None);
                }
            }
            Some(streamed) => {
                // experts already resident first, the rest as their reads land; the per-token
                // sums below run in rank order, so the order here never changes the result
                let li = self.moe_index(l);
                let pass = streamed.cache.pass();
                if t_n == 1 {
                    streamed.predictor.observe(pass, li, &used);
                    streamed.predictor.submit(pass, li, hn);
                }
                let mut req = streamed.cache.request(li, &used);
                if t_n == 1 {
                    // one token: the experts ready at once computed together (two parallel
                    // sections for all of them), then the next ones as their reads land. bench8
                    // x4, 2T, a pool of half the experts, warm, 3 alternations: 36.7 vs 33.5 t/s
                    // median against each expert's products run one by one
                    loop {
                        let batch = req.ready_batch()?;
                        if batch.is_empty() {
                            break;
                        }
                        let mut span =
                            trace::span("experts").arg("layer", l).arg("bytes", blob_bytes * batch.len() as u64);
                        span.set("experts", batch.iter().map(|b| b.expert).collect::<Vec<_>>().as_slice());
                        for b in &batch {
                            trace::flow_end(b.flow);
                        }
                        let mats: Vec<ExpertMats<'_>> =
                            batch.iter().map(|b| pkg.expert_view(b.bytes())).collect::<Result<_, _>>()?;
                        decode_experts(exec, &mats, hn, s, |i, y| weigh(batch[i].expert, y));
                        drop(mats);
                        drop(span);
                        for b in batch {
                            req.release(b);
                        }
                    }
                } else {
                    while let Some(b) = req.next_ready()? {
                        let ex = pkg.expert_view(b.bytes())?;
                        run_expert(b.expert, &ex, exec, s, b.flow);
                        req.release(b);
                    }
                }
            }
        }
        let mut out = vec![0f32; t_n * h];
        for t in 0..t_n {
            let o = &mut out[t * h..(t + 1) * h];
            for j in 0..k_n {
                add_inplace(o, &yk[(t * k_n + j) * h..(t * k_n + j + 1) * h]);
            }
        }
        Ok(out)
    }
}

/// One token's experts `mats` over the input `x` (`[H]`) as two parallel sections for all of
/// them: every gate and up row with its SwiGLU in one, every down row in the other, each section
/// cut into pieces across the experts' boundaries, so the threads finish
/// together whatever expert they are in. `each(i, y)` gets expert `i`'s output (`[H]`).
fn decode_experts(
    exec: &Exec,
    mats: &[ExpertMats<'_>],
    x: &[f32],
    s: &mut Scratch,
    mut each: impl FnMut(usize, &[f32]),
) {
    // each expert's SwiGLU activation, [I_e] end to end
    let pairs: Vec<(&Mat<'_>, &Mat<'_>)> = mats.iter().map(|m| (&m.gate, &m.up)).collect();
    let mut act = vec![0f32; mats.iter().map(|m| m.gate.rows).sum()];
    exec.swiglu_pairs("expert_gate_up", &pairs, x, &mut act, s);
    let mut downs: Vec<(&Mat<'_>, &[f32])> = Vec::with_capacity(mats.len());
    let mut a0 = 0;
    for m in mats {
        downs.push((&m.down, &act[a0..a0 + m.gate.rows]));
        a0 += m.gate.rows;
    }
    let mut y = vec![0f32; mats.iter().map(|m| m.down.rows).sum()];
    exec.matvec_each("expert_down", &downs, &mut y);
    let mut y0 = 0;
    for (i, m) in mats.iter().enumerate() {
        each(i, &y[y0..y0 + m.down.rows]);
        y0 += m.down.rows;
    }
}

/// `down(silu(gate x) * up x)` for `x` of `[n, H]`; returns `[n, H]`. `labels` name the
/// products in the trace: gate and up as one (one token), gate, up (several), down.
#[allow(clippy::too_many_arguments)]
fn swiglu_mlp(
    exec: &Exec,
    labels: [&'static str; 4],
    gate: &Mat<'_>,
    up: &Mat<'_>,
    down: &Mat<'_>,
    x: &[f32],
    n: usize,
    s: &mut Scratch,
) -> Vec<f32> {
    let i = gate.rows;
    let mut a = vec![0f32; n * i];
    if n == 1 {
        // one token (decode): gate and up with their SwiGLU in one parallel section, the input
        // quantized once
        exec.swiglu_pairs(labels[0], &[(gate, up)], x, &mut a, s);
    } else {
        let (mut g, mut u) = (vec![0f32; n * i], vec![0f32; n * i]);
        exec.matmul_shared(x, n, &mut [(labels[1], gate, &mut g), (labels[2], up, &mut u)], s);
        swiglu(&g, &u, &mut a);
    }
    let mut y = vec![0f32; n * down.rows];
    exec.matmul(labels[3], down, &a, n, &mut y, s);
    y
}
