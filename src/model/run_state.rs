//! The forward pass's buffers (llama2.c's RunState), sized once from the model's shapes.

use std::sync::Mutex;

use moescope_kernels::act::QuantAct;

use super::attention::AttnWork;
use super::delta_net;
use super::mla::MlaWork;
use super::mlp::MlpWork;
use super::moe::ExpertWork;
use super::router::{RouterRule, Routing};
use crate::exec::Scratch;
use crate::model_config::ModelConfig;

/// The forward pass's buffers, allocated once for batches of up to `chunk` tokens (llama2.c's
/// RunState); a pass of T tokens uses the first T rows of each. Those whose size depends on
/// the batch's routing (each expert's gathered input and intermediate rows, on each thread)
/// grow to the largest batch they have served and stay.
pub struct RunState {
    /// Most tokens of one pass.
    pub(super) chunk: usize,
    /// the batch's token ids, its sequences' one after another [chunk]
    pub(super) ids: Vec<u32>,
    /// residual stream [chunk, H]
    pub(super) x: Vec<f32>,
    /// a block's normed input [chunk, H]
    pub(super) hn: Vec<f32>,
    /// a block's output, before the residual add [chunk, H]
    pub(super) delta: Vec<f32>,
    /// queries [chunk, nh * hd]
    pub(super) q: Vec<f32>,
    /// gated attention's output gates [chunk, nh * hd] (empty without)
    pub(super) gate: Vec<f32>,
    /// keys and values [chunk, nkv * hd]
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    /// one token's q, gates, k and v from one section [(nh (2 if gated) + 2 nkv) * hd]
    pub(super) qkv: Vec<f32>,
    /// attention's output [chunk, nh * hd]
    pub(super) attn: Vec<f32>,
    /// what attention works in (decode's partial states, prefill's tiles)
    pub(super) attn_work: AttnWork,
    /// RoPE's cos and sin of each position [chunk, rotary_dim / 2]
    pub(super) cos: Vec<f32>,
    pub(super) sin: Vec<f32>,
    /// router probabilities [chunk, E]
    pub(super) probs: Vec<f32>,
    /// routed experts' weighted outputs per (token, rank) [chunk, k, H]
    pub(super) yk: Vec<f32>,
    /// the shared expert's output [chunk, H] (empty without one)
    pub(super) shared: Vec<f32>,
    /// a dense MLP's or the shared expert's intermediate rows
    pub(super) mlp: MlpWork,
    /// the batch's routing
    pub(super) routing: Routing,
    /// what each compute thread works in while it computes whole experts (a prompt's batch)
    pub(super) expert_work: Vec<Mutex<ExpertWork>>,
    /// the order a prompt's experts are claimed in [E]
    pub(super) expert_order: Mutex<Vec<usize>>,
    /// a prompt's input to the routed experts, quantized once for all of them [chunk, H]
    pub(super) routed_in: QuantAct,
    /// the logits of the positions asked for [rows, vocab] (one row at first; grown for more),
    /// and how many of its values the last pass left
    pub(super) logits: Vec<f32>,
    pub(super) logits_len: usize,
    /// the linear-attention mixer's buffers (hybrid models)
    pub(super) linear: Option<delta_net::Buffers>,
    /// the latent attention's buffers (DeepSeek-V3)
    pub(super) mla: Option<MlaWork>,
    /// quantized activations, reused by every product on this thread
    pub(super) scratch: Scratch,
}

impl RunState {
    pub fn new(c: &ModelConfig, chunk: usize) -> RunState {
        let h = c.hidden_size;
        let buf = |n: usize| vec![0f32; chunk * n];
        let gated = c.hybrid.is_some();
        let dims = c.hybrid.as_ref().map(|hy| delta_net::Dims::new(hy, c.rms_norm_eps as f32));
        let (conv, value) = c.hybrid.as_ref().map_or((0, 0), |hy| (hy.conv_dim(), hy.value_dim()));
        let shared = c.shared_expert_width();
        // latent attention runs through its own buffers (`MlaWork`) and q alone of these
        let plain = |n: usize| if c.features.mla.is_none() { n } else { 0 };
        RunState {
            chunk,
            ids: Vec::with_capacity(chunk),
            x: buf(h),
            hn: buf(h),
            delta: buf(h),
            q: buf(c.q_dim()),
            gate: if gated { buf(c.q_dim()) } else { vec![] },
            k: buf(plain(c.kv_dim())),
            v: buf(plain(c.kv_dim())),
            qkv: vec![0f32; plain(c.q_dim() * if gated { 2 } else { 1 } + 2 * c.kv_dim())],
            attn: buf(plain(c.q_dim())),
            attn_work: AttnWork::default(),
            cos: buf(c.rotary_dim() / 2),
            sin: buf(c.rotary_dim() / 2),
            probs: buf(c.num_experts),
            yk: buf(c.num_experts_per_tok * h),
            shared: if shared > 0 { buf(h) } else { vec![] },
            mlp: MlpWork::new(chunk, mlp_width(c)),
            routing: Routing::new(&RouterRule::of(c), chunk),
            expert_work: Vec::new(),
            expert_order: Mutex::new(Vec::with_capacity(c.num_experts)),
            routed_in: {
                let mut q = QuantAct::default();
                if c.num_experts > 0 && chunk > 1 {
                    q.reserve(chunk * h);
                }
                q
            },
            logits: vec![0f32; c.vocab_size],
            logits_len: 0,
            linear: dims.map(|d| delta_net::Buffers::new(d, chunk)),
            mla: MlaWork::new(c, chunk),
            scratch: {
                // the widest input and the most results a dense product of a chunk has
                // latent attention: q_b_proj reads q_lora values, kv_a_proj writes kv_lora + rope
                let latent =
                    c.features.mla.map_or(0, |m| (m.kv_lora_rank + m.qk_rope_head_dim).max(m.q_lora_rank.unwrap_or(0)));
                let widest = h.max(c.q_dim()).max(c.intermediate_size).max(value).max(shared).max(latent);
                let most = widest.max(plain(c.kv_dim())).max(c.num_experts).max(conv);
                let mut s = Scratch::default();
                s.reserve(chunk * widest, chunk * most);
                s
            },
        }
    }

    /// The logits the last pass left (`[rows, vocab]`; empty when it was asked for none).
    pub fn logits(&self) -> &[f32] {
        &self.logits[..self.logits_len]
    }

    /// Most tokens one pass may hold.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// Bytes of the buffers made at creation (the quantized activations' as they have grown so
    /// far). Those that grow with what the passes serve come on top, as temporaries would, so
    /// that the memory plan does not move with every reply: each thread's buffers for the experts
    /// it computes (up to a prompt chunk's rows of the widest expert), the linear-attention tasks'
    /// buffers (a value head's outputs over a chunk) and attention's states (one per KV head and split of
    /// the context).
    pub fn bytes(&self) -> u64 {
        let f = [
            &self.x,
            &self.hn,
            &self.delta,
            &self.q,
            &self.gate,
            &self.k,
            &self.v,
            &self.qkv,
            &self.attn,
            &self.cos,
            &self.sin,
            &self.probs,
            &self.yk,
            &self.shared,
            &self.logits,
        ];
        let linear =
            self.linear.as_ref().map_or(0, delta_net::Buffers::bytes) + self.mla.as_ref().map_or(0, MlaWork::bytes);
        (f.iter().map(|v| v.capacity() * 4).sum::<usize>() + self.scratch.bytes() + self.routed_in.bytes()) as u64
            + linear
            + self.mlp.bytes()
            + self.routing.bytes()
    }
}

/// The widest MLP that is not routed: a dense layer's, or the shared expert's (0 without).
fn mlp_width(c: &ModelConfig) -> usize {
    let dense = (0..c.num_hidden_layers).any(|l| !c.is_moe_layer(l));
    let shared = c.shared_expert_width();
    if dense { c.intermediate_size.max(shared) } else { shared }
}
