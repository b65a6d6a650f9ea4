//! The forward pass's buffers (llama2.c's RunState), sized once from the model's shapes.

use super::delta_net;
use crate::exec::Scratch;
use crate::model_config::ModelConfig;

/// The forward pass's buffers, allocated once for batches of up to `chunk` tokens (llama2.c's
/// RunState); a pass of T tokens uses the first T rows of each. Per-expert temporaries (each
/// expert's gathered input and intermediate rows) and the logits are allocated per call.
pub struct RunState {
    /// Most tokens of one pass.
    pub(super) chunk: usize,
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
    /// RoPE's cos and sin of each position [chunk, rotary_dim / 2]
    pub(super) cos: Vec<f32>,
    pub(super) sin: Vec<f32>,
    /// router probabilities [chunk, E]
    pub(super) probs: Vec<f32>,
    /// routed experts' weighted outputs per (token, rank) [chunk, k, H]
    pub(super) yk: Vec<f32>,
    /// the linear-attention mixer's buffers (hybrid models)
    pub(super) linear: Option<delta_net::Buffers>,
    /// quantized activations, reused by every product on this thread
    pub(super) scratch: Scratch,
}

impl RunState {
    pub fn new(c: &ModelConfig, chunk: usize) -> RunState {
        let h = c.hidden_size;
        let buf = |n: usize| vec![0f32; chunk * n];
        let gated = c.hybrid.is_some();
        let dims = c.hybrid.as_ref().map(|hy| delta_net::Dims::new(hy, c.rms_norm_eps as f32));
        let (conv, value, shared) = c
            .hybrid
            .as_ref()
            .map_or((0, 0, 0), |hy| (hy.conv_dim(), hy.value_dim(), hy.shared_expert_intermediate_size));
        RunState {
            chunk,
            x: buf(h),
            hn: buf(h),
            delta: buf(h),
            q: buf(c.q_dim()),
            gate: if gated { buf(c.q_dim()) } else { vec![] },
            k: buf(c.kv_dim()),
            v: buf(c.kv_dim()),
            qkv: vec![0f32; c.q_dim() * if gated { 2 } else { 1 } + 2 * c.kv_dim()],
            attn: buf(c.q_dim()),
            cos: buf(c.rotary_dim() / 2),
            sin: buf(c.rotary_dim() / 2),
            probs: buf(c.num_experts),
            yk: buf(c.num_experts_per_tok * h),
            linear: dims.map(|d| delta_net::Buffers::new(d, chunk)),
            scratch: {
                // the widest input and the most results a dense product of a chunk has
                let widest = h.max(c.q_dim()).max(c.intermediate_size).max(value).max(shared);
                let most = widest.max(c.kv_dim()).max(c.num_experts).max(conv);
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
            &self.gate,
            &self.k,
            &self.v,
            &self.qkv,
            &self.attn,
            &self.cos,
            &self.sin,
            &self.probs,
            &self.yk,
        ];
        let linear = self.linear.as_ref().map_or(0, delta_net::Buffers::bytes);
        (f.iter().map(|v| v.capacity() * 4).sum::<usize>() + self.scratch.bytes()) as u64 + linear
    }
}
