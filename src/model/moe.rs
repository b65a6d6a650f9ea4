//! The MoE block: its router, its routed experts (from an [`ExpertSource`]) and, in hybrid
//! models, GLM-4.5 and DeepSeek-V3, its shared expert. For a batch of T tokens `hn` (`[T, H]`,
//! normed):
//! ```text
//! shared:  s = sigmoid(hn · w_g) * mlp(hn)              (hybrids; GLM, DeepSeek: ungated; `mlp.rs`)
//! route:   each token's top-k experts and weights        (`router.rs`: the rule is data)
//! group:   the (token, rank) uses of each expert the batch chose
//! compute: y = down(silu(gate x) * up x) of each expert for its tokens (gpt-oss: with the
//!          expert's biases and its clamped activation, `mlp.rs`), weighted into
//!          yk[t, j] ([T, k, H]) for the rank j that chose it
//! sum:     out[t] = sum of yk[t, j] over j in rank order (+ s[t])
//! ```
//! A source hands the experts out in any batches and any order (a resident package hands them
//! all at once; streamed experts come as their reads land). Each (token, rank) slot is written
//! by the one expert that rank chose, and the sum runs in rank order, so the result never
//! depends on how the experts arrived. How a batch is computed depends only on its shape.

use std::sync::Mutex;

use smallvec::SmallVec;

use moescope_kernels::Mat;
use moescope_kernels::act::QuantAct;
use moescope_kernels::mat::Input;
use moescope_kernels::ops::{Glu, add_inplace};

use super::error::ModelError;
use super::expert_source::{Ahead, ExpertQuery, ExpertSource, RouterInput};
use super::mlp::{Gating, MlpBias, MlpWork, SharedExpert, swiglu_mlp, swiglu_mlp_quantized};
use super::pass::Pass;
use super::router::{Router, RouterRule, Routing, Steer};
use super::run_state::RunState;
use crate::exec::{Chunks, Exec, GatePair, Scratch};
use crate::model_config::{ExpertAct, ModelConfig};
use crate::package::{ExpertMats, Package, TensorId};
use crate::trace;

/// One layer's MoE block.
pub struct Moe {
    router: Router,
    /// The layer's place among the MoE layers (its row of the expert table).
    moe_layer: usize,
    shared: Option<SharedExpert>,
    /// The norm that made the block's input (`[H]` f32), and its eps: what a guess at the next
    /// layer's router input is normed with.
    norm: TensorId,
    eps: f32,
    /// One expert's bytes, for the trace.
    blob_bytes: u64,
    /// The activation between the experts' gate/up and down products.
    glu: Glu,
    /// gpt-oss's expert biases: gate `[E, I]`, up `[E, I]`, down `[E, H]` f32
    /// (`{prefix}experts.{gate,up,down}_proj.bias`).
    bias: Option<[TensorId; 3]>,
}

impl Moe {
    /// The MoE block under `prefix` (`{prefix}gate.weight`, the shared expert's tensors in
    /// hybrid models) of MoE layer `moe_layer`, its input normed by `norm`.
    pub fn load(
        pkg: &Package,
        prefix: &str,
        c: &ModelConfig,
        moe_layer: usize,
        norm: TensorId,
    ) -> Result<Moe, ModelError> {
        let h = c.hidden_size;
        let shared = match (&c.hybrid, c.features.shared_experts) {
            (Some(hy), _) => Some(SharedExpert::load_gated(pkg, prefix, h, hy.shared_expert_intermediate_size)?),
            (None, 0) => None,
            (None, width) => Some(SharedExpert::load_plain(pkg, prefix, h, width)?),
        };
        let (e_n, i) = (c.num_experts, c.moe_intermediate_size);
        let bias = match c.features.expert_bias {
            true => {
                let b = |name: &str, w: usize| pkg.require(&format!("{prefix}experts.{name}.bias"), &[e_n, w], true);
                Some([b("gate_proj", i)?, b("up_proj", i)?, b("down_proj", h)?])
            }
            false => None,
        };
        Ok(Moe {
            router: Router::load(pkg, prefix, RouterRule::of(c), h)?,
            moe_layer,
            shared,
            norm,
            eps: c.rms_norm_eps as f32,
            blob_bytes: pkg.meta.experts.as_ref().map_or(0, |e| e.len_of(moe_layer)),
            glu: match c.features.expert_act {
                ExpertAct::Silu => Glu::Silu,
                ExpertAct::ClampedSwiglu { alpha, limit } => Glu::Clamped { alpha, limit },
            },
            bias,
        })
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Layer `l`'s block over the pass's normed rows (`st.hn`; `st.x` the residual they were
    /// normed from), into `st.delta`.
    pub fn forward(&self, pass: &mut Pass<'_, '_>, l: usize) -> Result<(), ModelError> {
        let t_n = pass.t_n;
        let mut span = trace::span("moe").arg("layer", l).arg("tokens", t_n);
        // the shared expert first: it does not depend on the route, and a source that guesses
        // the next layer's experts guesses better with its output on the residual; added
        // after the routed sum, as transformers does
        if let Some(se) = &self.shared {
            se.forward(pass, l);
        }
        let steer = self.router.route(pass, l, self.moe_layer);
        let (exec, experts, norm) = (pass.exec, pass.experts, pass.pkg.f32_by_index(self.norm));
        let h = norm.len();
        let RunState { x, hn, delta, shared, routing, yk, expert_work, expert_order, routed_in, .. } = &mut *pass.st;
        let (x, hn, out) = (&x[..t_n * h], &hn[..t_n * h], &mut delta[..t_n * h]);
        let shared = self.shared.as_ref().map(|_| &shared[..t_n * h]);
        if routing.substituted > 0 {
            span.set("substituted", routing.substituted);
        }
        span.set("experts_used", routing.used.len());
        let predicted = match steer {
            Steer::Replay(r) if t_n == 1 => Some(r.candidates(0)).filter(|c| !c.is_empty()),
            _ => None,
        };
        let q = ExpertQuery {
            layer: l,
            moe_layer: self.moe_layer,
            tokens: t_n,
            used: &routing.used,
            ahead: Ahead {
                input: RouterInput { normed: hn, residual: x, shared, norm, eps: self.eps },
                predicted,
                ranked: if t_n == 1 { routing.picks_of(0) } else { &[] },
            },
        };
        let k_n = routing.top_k();
        let bufs =
            SumBuffers { yk: &mut yk[..t_n * k_n * h], out, work: expert_work, order: expert_order, hq: routed_in };
        let f = |id: TensorId| pass.pkg.f32_by_index(id);
        let how = How {
            blob_bytes: self.blob_bytes,
            gating: ExpertGating { glu: self.glu, bias: self.bias.map(|[g, u, d]| [f(g), f(u), f(d)]), h },
        };
        routed_sum(exec, experts, &q, routing, hn, how, bufs)?;
        if let Some(s) = shared {
            add_inplace(out, s);
        }
        Ok(())
    }
}

/// What one task computing whole experts works in: its activations' scratch, the expert's
/// gathered input and output rows, and the SwiGLU's buffers; grown to the largest expert batch
/// it has served.
#[derive(Default)]
pub struct ExpertWork {
    s: Scratch,
    xe: Vec<f32>,
    /// the expert's rows of the layer's quantized input
    xq: QuantAct,
    ye: Vec<f32>,
    mlp: MlpWork,
}

impl ExpertWork {
    /// Room for an expert of width `i` over `n` tokens of `h` values, so that a thread's
    /// buffers grow with the batch rather than with which experts it happened to claim.
    fn fit(&mut self, n: usize, h: usize, i: usize) {
        let wide = n * h.max(i);
        self.s.reserve(wide, wide);
        self.xe.reserve((n * h).saturating_sub(self.xe.len()));
        self.xq.reserve(n * h);
        self.ye.reserve((n * h).saturating_sub(self.ye.len()));
        self.mlp.fit(n, i);
    }
}

/// Where [`routed_sum`] works and leaves its result.
pub struct SumBuffers<'a> {
    /// The experts' weighted outputs per (token, rank), `[T, k, H]`.
    pub yk: &'a mut [f32],
    /// The sum, `[T, H]`.
    pub out: &'a mut [f32],
    /// One [`ExpertWork`] per compute thread (more are added when the threads outnumber them);
    /// the first is also the calling thread's when it computes alone.
    pub work: &'a mut Vec<Mutex<ExpertWork>>,
    /// Room for the order a hand-out's experts are claimed in.
    pub order: &'a Mutex<Vec<usize>>,
    /// The batch's input quantized once for all its experts (several tokens).
    pub hq: &'a mut QuantAct,
}

/// Every expert's activation and biases: the biases of all of a layer's experts (gate `[E, I]`,
/// up `[E, I]`, down `[E, H]`), if it has them.
#[derive(Clone, Copy)]
struct ExpertGating<'a> {
    glu: Glu,
    bias: Option<[&'a [f32]; 3]>,
    h: usize,
}

impl<'a> ExpertGating<'a> {
    /// Expert `e`'s, for an expert of width `i`.
    fn of(&self, e: usize, i: usize) -> Gating<'a> {
        let bias = self.bias.map(|[g, u, d]| MlpBias {
            gate: &g[e * i..(e + 1) * i],
            up: &u[e * i..(e + 1) * i],
            down: &d[e * self.h..(e + 1) * self.h],
        });
        Gating { glu: self.glu, bias }
    }
}

/// How a layer's experts compute, beside their matrices: one expert's bytes (for the trace) and
/// the gating.
#[derive(Clone, Copy)]
struct How<'a> {
    blob_bytes: u64,
    gating: ExpertGating<'a>,
}

/// The weighted sum of the routed experts' outputs for the batch `hn` (`[T, H]`), computed as
/// `source` hands the experts out, into `bufs.out`.
fn routed_sum(
    exec: &Exec,
    source: &dyn ExpertSource,
    q: &ExpertQuery<'_>,
    routing: &Routing,
    hn: &[f32],
    how: How<'_>,
    bufs: SumBuffers<'_>,
) -> Result<(), ModelError> {
    let (t_n, k_n) = (q.tokens, routing.top_k());
    let h = hn.len() / t_n.max(1);
    let SumBuffers { yk, out, work, order, hq } = bufs;
    debug_assert!(yk.len() == t_n * k_n * h && out.len() == t_n * h);
    if work.len() < exec.threads() {
        work.resize_with(exec.threads(), Mutex::default);
    }
    {
        let slots = WeightedOutputs { routing, slots: Chunks::new(yk), h };
        let (blob_bytes, gating) = (how.blob_bytes, how.gating);
        let batch = Batch { exec, layer: q.layer, hn, h, blob_bytes, gating, out: &slots, work, order };
        // several tokens: the input quantized once, as the first hand-out's experts read it
        // (each expert then gathers its rows; each row's bits are its own, as if quantized
        // alone), where they take quantized input
        let mut quantized = false;
        source.for_each_ready(q, &mut |ids, mats| {
            if t_n > 1
                && !quantized
                && let Some(m) = mats.first()
            {
                quantized = matches!(exec.quantized(&m.gate, hn, hq), Input::Quant(_));
            }
            batch.compute(ids, mats, Some(&*hq).filter(|_| quantized));
            Ok(())
        })?;
    }
    // each token's ranks summed in rank order, the tokens in parallel
    let yk = &yk[..];
    exec.rows_mut("sum_rows", out, h, &|r, out| {
        for (t, o) in r.zip(out.chunks_exact_mut(h)) {
            o.fill(0.0);
            for j in 0..k_n {
                add_inplace(o, &yk[(t * k_n + j) * h..(t * k_n + j + 1) * h]);
            }
        }
    });
    Ok(())
}

/// `yk` of [`routed_sum`], written by the experts' tasks: each (token, rank) slot by the one
/// expert that rank chose.
struct WeightedOutputs<'r> {
    routing: &'r Routing,
    slots: Chunks,
    h: usize,
}

impl WeightedOutputs<'_> {
    /// Expert `e`'s outputs for its tokens (`[n, H]`, in its uses' order), weighted into their
    /// slots.
    ///
    /// # Safety
    /// No other task writes expert `e`'s slots meanwhile (each expert is computed once per
    /// batch, so only its own task does).
    unsafe fn put(&self, e: usize, ys: &[f32]) {
        let (h, k_n) = (self.h, self.routing.top_k());
        for (i, &u) in self.routing.uses_of(e).iter().enumerate() {
            let w = self.routing.weight(u);
            // SAFETY: slot (token, rank) is inside yk and belongs to expert e alone (that
            // token's rank chose e); the caller guarantees no one else writes e's slots now
            let dst = unsafe { self.slots.slice((u.token * k_n + u.rank) * h, h) };
            for (d, y) in dst.iter_mut().zip(&ys[i * h..(i + 1) * h]) {
                *d = y * w;
            }
        }
    }
}

/// How one hand-out of ready experts is computed.
struct Batch<'a> {
    exec: &'a Exec,
    layer: usize,
    hn: &'a [f32],
    h: usize,
    blob_bytes: u64,
    gating: ExpertGating<'a>,
    out: &'a WeightedOutputs<'a>,
    /// one per compute thread
    work: &'a [Mutex<ExpertWork>],
    /// the order a hand-out's experts are claimed in
    order: &'a Mutex<Vec<usize>>,
}

impl Batch<'_> {
    /// Compute experts `ids` (`mats`), by the batch's shape alone: one token: all of them in two
    /// row-split sections (the threads finish together); several tokens and several experts on
    /// several threads: whole experts per thread, the busiest first (one parallel section for
    /// the hand-out, each expert's gathering, quantization and SwiGLU in parallel too); else one
    /// expert after another, each product split over the threads. Every product runs as it would
    /// alone, so each strategy gives the same bits.
    fn compute(&self, ids: &[usize], mats: &[ExpertMats<'_>], hq: Option<&QuantAct>) {
        let (exec, routing) = (self.exec, self.out.routing);
        if self.hn.len() == self.h {
            let mut span =
                trace::span("experts").arg("layer", self.layer).arg("bytes", self.blob_bytes * ids.len() as u64);
            span.set("experts", ids);
            let mut w = self.work[0].lock().unwrap_or_else(|e| e.into_inner());
            let gating: Few<Gating<'_>> = ids.iter().zip(mats).map(|(&e, m)| self.gating.of(e, m.gate.rows)).collect();
            // SAFETY: each expert of the hand-out is put once, here on the calling thread
            decode_experts(exec, (mats, &gating), self.hn, &mut w, |i, y| unsafe { self.out.put(ids[i], y) });
        } else if ids.len() > 1 && exec.threads() > 1 {
            let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
            order.clear();
            order.extend(0..ids.len());
            order.sort_by_key(|&i| std::cmp::Reverse(routing.uses_of(ids[i]).len()));
            // room for an expert that every token of the batch chose: the buffers then grow
            // with the batch size alone, not with how a batch happened to route
            let tokens = self.hn.len() / self.h;
            let width = mats.iter().map(|m| m.gate.rows).max().unwrap_or(0);
            for w in self.work {
                w.lock().unwrap_or_else(|e| e.into_inner()).fit(tokens, self.h, width);
            }
            exec.run(order.len(), &|task, p| {
                let i = order[task];
                let mut w = self.work[p].lock().unwrap_or_else(|e| e.into_inner());
                self.expert(ids[i], &mats[i], exec.serial(), &mut w, hq);
            });
        } else {
            let mut w = self.work[0].lock().unwrap_or_else(|e| e.into_inner());
            for (&e, m) in ids.iter().zip(mats) {
                self.expert(e, m, exec, &mut w, hq);
            }
        }
    }

    /// Expert `e` over its tokens of the batch, weighted into their slots; with `hq` (the batch's
    /// input quantized, as gate and up read it) its rows gathered from there.
    fn expert(&self, e: usize, m: &ExpertMats<'_>, exec: &Exec, w: &mut ExpertWork, hq: Option<&QuantAct>) {
        let (h, users) = (self.h, self.out.routing.uses_of(e));
        let _es = trace::span("expert")
            .arg("layer", self.layer)
            .arg("expert", e)
            .arg("tokens", users.len())
            .arg("bytes", self.blob_bytes);
        let ExpertWork { s, xe, xq, ye, mlp } = w;
        // grown, never shrunk (every value is written below): a resize after a smaller expert
        // zeroed the difference first
        let n_out = users.len() * m.down.rows;
        if ye.len() < n_out {
            ye.resize(n_out, 0.0);
        }
        let ye = &mut ye[..n_out];
        let labels = ["expert_gate_up", "expert_gate", "expert_up", "expert_down"];
        let gating = self.gating.of(e, m.gate.rows);
        let reads = |w: &Mat<'_>, q: &QuantAct| w.cols == q.cols && w.quant_group() == Some(q.group);
        match hq.filter(|q| reads(&m.gate, q) && reads(&m.up, q)) {
            Some(q) => {
                xq.gather_rows(q, users.iter().map(|u| u.token));
                swiglu_mlp_quantized(exec, labels, (m, gating), xq, mlp, ye, s);
            }
            None => {
                xe.clear();
                for u in users {
                    xe.extend_from_slice(&self.hn[u.token * h..(u.token + 1) * h]);
                }
                swiglu_mlp(exec, labels, (m, gating), xe, mlp, ye, s);
            }
        }
        // SAFETY: expert e is computed once per batch, by this task alone
        unsafe { self.out.put(e, ye) };
    }
}

/// One token's experts `mats` (each with its `gating`) over the input `x` (`[H]`) as two
/// parallel sections for all of them: every gate and up row with its activation in one, every
/// down row in the other, each section cut into pieces across the experts' boundaries, so the
/// threads finish together whatever expert they are in. `each(i, y)` gets expert `i`'s output
/// (`[H]`).
fn decode_experts(
    exec: &Exec,
    (mats, gating): (&[ExpertMats<'_>], &[Gating<'_>]),
    x: &[f32],
    w: &mut ExpertWork,
    mut each: impl FnMut(usize, &[f32]),
) {
    let ExpertWork { s, xe: act, ye: y, .. } = w;
    // each expert's activation, [I_e] end to end (one activation for all: the layer's)
    let glu = gating.first().map_or(Glu::Silu, |g| g.glu);
    let pairs: Few<GatePair<'_>> = mats.iter().zip(gating).map(|(m, g)| g.pair(m)).collect();
    act.resize(mats.iter().map(|m| m.gate.rows).sum(), 0.0);
    exec.swiglu_pairs("expert_gate_up", &pairs, glu, x, act, s);
    let mut downs: Few<(&Mat<'_>, &[f32])> = SmallVec::new();
    let mut a0 = 0;
    for m in mats {
        downs.push((&m.down, &act[a0..a0 + m.gate.rows]));
        a0 += m.gate.rows;
    }
    y.resize(mats.iter().map(|m| m.down.rows).sum(), 0.0);
    exec.matvec_each("expert_down", &downs, y, s);
    let mut y0 = 0;
    for (i, (m, g)) in mats.iter().zip(gating).enumerate() {
        let y = &mut y[y0..y0 + m.down.rows];
        if let Some(b) = g.bias {
            add_inplace(y, b.down);
        }
        each(i, y);
        y0 += m.down.rows;
    }
}

/// One token's experts: on the stack (top-k is 16 or fewer in every released model).
type Few<T> = SmallVec<[T; 16]>;
