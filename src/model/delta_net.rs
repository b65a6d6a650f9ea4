//! Gated DeltaNet, the linear-attention mixer of Qwen3-Next and Qwen3.5 (transformers'
//! `Qwen3NextGatedDeltaNet`), for T tokens of one sequence:
//! ```text
//! p = h W_qkv [T, conv]   (conv = 2 nk dk + nv dv: q of every key head, k, v of every value head)
//! z = h W_z [T, nv dv];  b = h W_b, a = h W_a [T, nv]
//! c_t = silu( sum_j w_conv[:, j] * p_{t-K+1+j} )   (depthwise, causal; p before the batch comes
//!                                                   from the conv state, zero at the start)
//! q_i = l2norm(q_i) * dk^-0.5, k_i = l2norm(k_i)    (eps 1e-6 under the root, per key head)
//! beta_h = sigmoid(b_h), decay_h = exp(-exp(A_log_h) * softplus(a_h + dt_bias_h))
//! per value head h (key head h / r, r = nv / nk): the delta rule (`kernels::delta`) over S_h
//! y_h = rms_norm(o_h) * w_norm * silu(z_h)          (plain w, shared by the heads)
//! out = y W_out [T, H]
//! ```
//! The tokens of a batch run through the recurrence one after another, exactly as decode feeds
//! them, so a prompt in one pass gives what its tokens give one by one; the value heads are
//! spread over the compute threads, each head wholly on one thread, so the result does not
//! depend on how many there are.

use std::sync::Mutex;

use moescope_kernels::delta::{self, Step};
use moescope_kernels::ops::{l2_norm_inplace, mul_silu, rms_norm, silu_inplace};

use super::error::ModelError;
use super::pass::Pass;
use super::run_state::RunState;
use crate::exec::{Chunks, Exec};
use crate::model_config::HybridConfig;
use crate::package::{Package, TensorId};
use crate::trace;

/// The L2 norm's eps: fixed, whatever `rms_norm_eps` says.
const L2_EPS: f32 = 1e-6;

/// One layer's tensors (package names under `model.layers.{l}.linear_attn.`).
pub struct DeltaNet {
    qkv: TensorId,
    z: TensorId,
    b: TensorId,
    a: TensorId,
    /// `[conv, K]` f32
    conv: TensorId,
    /// `[nv]` f32 each
    a_log: TensorId,
    dt_bias: TensorId,
    /// `[dv]` f32
    norm: TensorId,
    out: TensorId,
    dims: Dims,
    hidden: usize,
}

impl DeltaNet {
    /// The mixer under `prefix`; `eps` is the gated norm's (`rms_norm_eps`).
    pub fn load(
        pkg: &Package,
        prefix: &str,
        hy: &HybridConfig,
        hidden: usize,
        eps: f32,
    ) -> Result<DeltaNet, ModelError> {
        let (conv, vd, nv) = (hy.conv_dim(), hy.value_dim(), hy.value_heads);
        let m = |name: &str, shape: &[usize]| pkg.require(&format!("{prefix}{name}"), shape, false);
        let f = |name: &str, shape: &[usize]| pkg.require(&format!("{prefix}{name}"), shape, true);
        Ok(DeltaNet {
            qkv: m("in_proj_qkv.weight", &[conv, hidden])?,
            z: m("in_proj_z.weight", &[vd, hidden])?,
            b: m("in_proj_b.weight", &[nv, hidden])?,
            a: m("in_proj_a.weight", &[nv, hidden])?,
            conv: f("conv1d.weight", &[conv, hy.conv_kernel])?,
            a_log: f("A_log", &[nv])?,
            dt_bias: f("dt_bias", &[nv])?,
            norm: f("norm.weight", &[hy.value_head_dim])?,
            out: m("out_proj.weight", &[hidden, vd])?,
            dims: Dims::new(hy, eps),
            hidden,
        })
    }

    /// Layer `l`'s mixer over the pass's normed rows (`st.hn`), advancing the layer's state in
    /// the cache; the result (before the residual add) in `st.delta`.
    pub fn forward(&self, pass: &mut Pass<'_, '_>, l: usize) -> Result<(), ModelError> {
        let (exec, pkg, t_n, d) = (pass.exec, pass.pkg, pass.t_n, self.dims);
        let _s = trace::span("linear_attention").arg("layer", l).arg("tokens", t_n);
        let RunState { hn, delta, linear, scratch: s, .. } = &mut *pass.st;
        let no_state = || {
            ModelError::Unsupported(format!(
                "layer {l} is linear attention, but the model's cache or buffers have no linear-attention state"
            ))
        };
        let bufs = linear.as_mut().ok_or_else(no_state)?;
        if pass.seqs.iter_mut().any(|seq| seq.kv.linear_mut(l).is_none()) {
            return Err(no_state());
        }
        let (hn, out) = (&hn[..t_n * self.hidden], &mut delta[..t_n * self.hidden]);
        let (cd, vd, nv) = (d.conv_dim(), d.value_dim(), d.nv);
        let (wqkv, wz, wb, wa) =
            (pkg.mat_by_index(self.qkv), pkg.mat_by_index(self.z), pkg.mat_by_index(self.b), pkg.mat_by_index(self.a));
        let Buffers { p, z, b, a, proj, c, beta, decay, y, tasks } = bufs;
        if tasks.len() < exec.threads() {
            // what the largest task needs: a conv block's taps and state columns, or a head's
            // outputs over a chunk and the delta rule's scratch
            let chunk = p.len() / cd.max(1);
            let most = (2 * d.kernel - 1) * CONV_BLOCK.min(cd);
            let heads = chunk * d.dv + delta::steps_scratch(d.dk, d.dv);
            tasks.resize_with(exec.threads(), || Mutex::new(Vec::with_capacity(most.max(heads))));
        }
        let (p, z, b, a) = (&mut p[..t_n * cd], &mut z[..t_n * vd], &mut b[..t_n * nv], &mut a[..t_n * nv]);
        if t_n == 1 {
            // decode: the four in one parallel section, one quantization of the input
            exec.matvec_concat("in_proj", &[&wqkv, &wz, &wb, &wa], hn, proj, s);
            let (pp, rest) = proj.split_at(cd);
            let (zp, rest) = rest.split_at(vd);
            p.copy_from_slice(pp);
            z.copy_from_slice(zp);
            b.copy_from_slice(&rest[..nv]);
            a.copy_from_slice(&rest[nv..]);
        } else {
            let mut prods = [
                ("in_proj_qkv", &wqkv, &mut *p),
                ("in_proj_z", &wz, &mut *z),
                ("in_proj_b", &wb, &mut *b),
                ("in_proj_a", &wa, &mut *a),
            ];
            exec.matmul_shared(hn, t_n, &mut prods, s);
        }
        let weights = Weights {
            conv: pkg.f32_by_index(self.conv),
            a_log: pkg.f32_by_index(self.a_log),
            dt_bias: pkg.f32_by_index(self.dt_bias),
            norm: pkg.f32_by_index(self.norm),
        };
        // each sequence's rows through its own state (the conv and the recurrence run along
        // a sequence)
        for seq in pass.seqs.iter_mut() {
            let inputs = Inputs { p: seq.of(p, cd), z: seq.of(z, vd), b: seq.of(b, nv), a: seq.of(a, nv) };
            let (c, beta, decay) = (seq.of_mut(c, cd), seq.of_mut(beta, nv), seq.of_mut(decay, nv));
            let work = Work { c, beta, decay, tasks };
            let y = seq.of_mut(y, vd);
            let state = seq.kv.linear_mut(l).ok_or_else(no_state)?;
            core(exec, &weights, d, state, inputs, work, y);
        }
        let y = &y[..t_n * vd];
        exec.matmul("out_proj", &pkg.mat_by_index(self.out), y, t_n, out, s);
        Ok(())
    }
}

/// Shapes of the mixer.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub nk: usize,
    pub dk: usize,
    pub nv: usize,
    pub dv: usize,
    /// conv kernel K
    pub kernel: usize,
    /// the gated norm's eps (`rms_norm_eps`)
    pub eps: f32,
    /// value heads in the tiled order: value head h reads key head h mod nk (else h / (nv / nk))
    pub tiled: bool,
    /// `A_log` holds -exp(A_log) ([`HybridConfig::a_stored_negated_exp`])
    pub neg_exp_a: bool,
}

impl Dims {
    pub fn new(hy: &HybridConfig, eps: f32) -> Dims {
        Dims {
            nk: hy.key_heads,
            dk: hy.key_head_dim,
            nv: hy.value_heads,
            dv: hy.value_head_dim,
            kernel: hy.conv_kernel,
            eps,
            tiled: hy.value_heads_tiled,
            neg_exp_a: hy.a_stored_negated_exp,
        }
    }

    pub fn conv_dim(&self) -> usize {
        2 * self.nk * self.dk + self.nv * self.dv
    }

    pub fn value_dim(&self) -> usize {
        self.nv * self.dv
    }
}

/// One layer's state for the sequence so far: what replaces the KV cache. f32, as the model
/// was trained; zero at the start of a sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearState {
    /// The last K - 1 conv inputs (pre-conv, pre-SiLU), oldest first: `[K - 1, conv]`.
    pub conv: Vec<f32>,
    /// The recurrent state of every value head: `[nv, dk, dv]`.
    pub s: Vec<f32>,
}

impl LinearState {
    pub fn new(hy: &HybridConfig) -> LinearState {
        LinearState { conv: vec![0.0; hy.conv_state_len()], s: vec![0.0; hy.state_len()] }
    }

    /// Back to the start of a sequence.
    pub fn reset(&mut self) {
        self.conv.fill(0.0);
        self.s.fill(0.0);
    }

    pub fn bytes(&self) -> u64 {
        ((self.conv.len() + self.s.len()) * 4) as u64
    }
}

/// The mixer's buffers for batches of up to `chunk` tokens.
pub struct Buffers {
    /// projections `[chunk, conv]`, `[chunk, nv dv]`, `[chunk, nv]`, `[chunk, nv]`
    p: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
    /// one token's four projections from one section `[conv + nv dv + 2 nv]`
    proj: Vec<f32>,
    /// the conv's output `[chunk, conv]`
    c: Vec<f32>,
    /// beta and decay per token and value head `[chunk, nv]` each
    beta: Vec<f32>,
    decay: Vec<f32>,
    /// the gated heads' output, `out_proj`'s input `[chunk, nv dv]`
    y: Vec<f32>,
    /// one per compute thread: its tasks' temporaries (grown to the largest so far)
    tasks: Vec<Mutex<Vec<f32>>>,
}

impl Buffers {
    pub fn new(d: Dims, chunk: usize) -> Buffers {
        let (cd, vd, nv) = (d.conv_dim(), d.value_dim(), d.nv);
        let buf = |n: usize| vec![0f32; chunk * n];
        Buffers {
            p: buf(cd),
            z: buf(vd),
            b: buf(nv),
            a: buf(nv),
            proj: vec![0f32; cd + vd + 2 * nv],
            c: buf(cd),
            beta: buf(nv),
            decay: buf(nv),
            y: buf(vd),
            tasks: Vec::new(),
        }
    }

    pub fn bytes(&self) -> u64 {
        // the tasks' buffers, one per compute thread, come on top (see `RunState::bytes`)
        let f = [&self.p, &self.z, &self.b, &self.a, &self.proj, &self.c, &self.beta, &self.decay, &self.y];
        f.iter().map(|v| v.capacity() as u64 * 4).sum()
    }
}

/// The mixer's small f32 tensors.
pub struct Weights<'a> {
    /// `[conv, K]`
    pub conv: &'a [f32],
    /// `[nv]`
    pub a_log: &'a [f32],
    pub dt_bias: &'a [f32],
    /// `[dv]`
    pub norm: &'a [f32],
}

/// The projections of T tokens: `p [T, conv]`, `z [T, nv dv]`, `b`, `a` `[T, nv]`.
pub struct Inputs<'a> {
    pub p: &'a [f32],
    pub z: &'a [f32],
    pub b: &'a [f32],
    pub a: &'a [f32],
}

/// Buffers of [`core`]: `c [T, conv]`, `beta`, `decay` `[T, nv]`, and one buffer per compute
/// thread for its tasks (a conv block's taps and state columns, a value head's outputs and scratch), grown as needed.
pub struct Work<'a> {
    pub c: &'a mut [f32],
    pub beta: &'a mut [f32],
    pub decay: &'a mut [f32],
    pub tasks: &'a [Mutex<Vec<f32>>],
}

/// Everything between the projections and `out_proj`: conv, SiLU, L2 norms, gates, the delta
/// rule and the gated norm, advancing `st`; `y` gets `[T, nv dv]`.
pub fn core(exec: &Exec, w: &Weights, d: Dims, st: &mut LinearState, x: Inputs, work: Work, y: &mut [f32]) {
    let (cd, vd, nk, dk, nv, dv) = (d.conv_dim(), d.value_dim(), d.nk, d.dk, d.nv, d.dv);
    let t_n = x.b.len() / nv;
    let _m = trace::span("delta_net").arg("tokens", t_n).arg("heads", nv);
    let Work { c, beta, decay, tasks } = work;
    debug_assert!(tasks.len() >= exec.threads());
    // causal depthwise conv over [conv state (K - 1 rows); p (T rows)], then SiLU, a block of
    // channels per task (each channel alone: the split does not change a bit)
    conv_silu(exec, w.conv, d, &mut st.conv, (x.p, t_n), c, tasks);
    // per token: L2-normalised q (then scaled) and k of every key head; the gates (runs of
    // tokens in parallel: each token alone)
    let scale = 1.0 / (dk as f32).sqrt();
    {
        let _g = trace::span("qk_norms_gates").arg("tokens", t_n);
        let (cs, bs, ds) = (Chunks::new(c), Chunks::new(beta), Chunks::new(decay));
        exec.run(t_n.div_ceil(GATE_TOKENS), &|task, _| {
            for t in task * GATE_TOKENS..((task + 1) * GATE_TOKENS).min(t_n) {
                // SAFETY: task `task` alone touches its tokens' rows of c, beta and decay
                let (ct, beta, decay) =
                    unsafe { (cs.slice(t * cd, 2 * nk * dk), bs.slice(t * nv, nv), ds.slice(t * nv, nv)) };
                for (i, head) in ct.chunks_exact_mut(dk).enumerate() {
                    l2_norm_inplace(head, L2_EPS, if i < nk { scale } else { 1.0 });
                }
                for h in 0..nv {
                    let i = t * nv + h;
                    beta[h] = 1.0 / (1.0 + (-x.b[i]).exp());
                    let neg_a = if d.neg_exp_a { w.a_log[h] } else { -w.a_log[h].exp() };
                    let g = neg_a * softplus(x.a[i] + w.dt_bias[h]);
                    decay[h] = g.exp();
                }
            }
        });
    }
    // the delta rule and the gated norm, a value head per task
    let (c, beta, decay) = (&*c, &*beta, &*decay);
    let r = nv / nk;
    let isa = exec.isa;
    let states = Chunks::new(&mut st.s);
    let ys = Chunks::new(y);
    let _k = trace::span("delta_rule").arg("tokens", t_n).arg("heads", nv);
    exec.run(nv, &|h, p| {
        let _h = trace::span("delta_head");
        // SAFETY: task h alone touches value head h's state and its columns of y, both inside
        // buffers that outlive the section
        let s = unsafe { states.slice(h * dk * dv, dk * dv) };
        let mut buf = tasks[p].lock().unwrap_or_else(|e| e.into_inner());
        buf.resize(t_n * dv + delta::steps_scratch(dk, dv), 0.0);
        let (outs, scratch) = buf.split_at_mut(t_n * dv);
        let kh = if d.tiled { h % nk } else { h / r };
        let (qo, ko, vo) = (kh * dk, nk * dk + kh * dk, 2 * nk * dk + h * dv);
        let step = |t: usize| {
            let ct = &c[t * cd..(t + 1) * cd];
            Step {
                q: &ct[qo..qo + dk],
                k: &ct[ko..ko + dk],
                v: &ct[vo..vo + dv],
                beta: beta[t * nv + h],
                decay: decay[t * nv + h],
            }
        };
        // all the tokens through the state, then each token's output normed and gated
        delta::steps(isa, s, t_n, step, scratch, outs);
        for (t, o) in outs.chunks_exact(dv).enumerate() {
            // SAFETY: as above
            let yh = unsafe { ys.slice(t * vd + h * dv, dv) };
            rms_norm(o, w.norm, d.eps, yh);
            mul_silu(yh, &x.z[t * vd + h * dv..t * vd + (h + 1) * dv]);
        }
    });
}

/// Channels per task of the conv.
const CONV_BLOCK: usize = 512;

/// Tokens per task of the L2 norms and gates.
const GATE_TOKENS: usize = 16;

/// `c[t] = silu(sum_j w[:, j] * x_{t-K+1+j})` over the sequence [state (K - 1 rows); p (T
/// rows)] (`[_, conv]` each), and the state <- its last K - 1 rows; blocks of channels on the
/// compute threads, each in its thread's buffer of `tasks`.
fn conv_silu(
    exec: &Exec,
    w: &[f32],
    d: Dims,
    state: &mut [f32],
    (p, t_n): (&[f32], usize),
    c: &mut [f32],
    tasks: &[Mutex<Vec<f32>>],
) {
    let (cd, kk) = (d.conv_dim(), d.kernel);
    let past = kk - 1;
    let blocks = cd.div_ceil(CONV_BLOCK);
    let _c = trace::span("conv_silu").arg("tokens", t_n).arg("channels", cd);
    let (cs, ss) = (Chunks::new(c), Chunks::new(state));
    exec.run(blocks, &|b, task| {
        let (c0, c1) = (b * CONV_BLOCK, ((b + 1) * CONV_BLOCK).min(cd));
        let n = c1 - c0;
        // this block's taps, tap-major (`[K, n]`: the products below run along the channels),
        // then its columns of the state (`[K - 1, n]`, copied out before it is rewritten); the
        // chunk's rows are read where they lie (a copy of them all doubled the section's
        // memory traffic, and it scaled to 2.5x at 8 threads)
        let mut buf = tasks[task].lock().unwrap_or_else(|e| e.into_inner());
        buf.clear();
        for j in 0..kk {
            buf.extend((c0..c1).map(|ch| w[ch * kk + j]));
        }
        for m in 0..past {
            // SAFETY: task b alone touches columns c0..c1 of the state and of c
            buf.extend_from_slice(unsafe { ss.slice(m * cd + c0, n) });
        }
        let (taps, old) = buf.split_at(kk * n);
        // row m of the sequence [state; p], this block's columns
        let seq = |m: usize| if m < past { &old[m * n..(m + 1) * n] } else { &p[(m - past) * cd + c0..][..n] };
        for t in 0..t_n {
            // SAFETY: as above
            let out = unsafe { cs.slice(t * cd + c0, n) };
            out.fill(0.0);
            for (j, tap) in taps.chunks_exact(n).enumerate() {
                for ((o, &x), &wj) in out.iter_mut().zip(seq(t + j)).zip(tap) {
                    *o += wj * x;
                }
            }
            silu_inplace(out);
        }
        for m in 0..past {
            // SAFETY: as above
            unsafe { ss.slice(m * cd + c0, n) }.copy_from_slice(seq(t_n + m));
        }
    });
}

/// softplus as torch computes it: x itself above 20, where exp would overflow the sum's use.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moescope_kernels::Isa;

    /// The mixer's core as the formulas read it, in f64, from the start of a sequence (indexed
    /// by position, as the formulas are).
    #[allow(clippy::needless_range_loop)]
    fn textbook(w: &Weights, d: Dims, x: &Inputs) -> Vec<f64> {
        let (cd, vd, nk, dk, nv, dv, kk) = (d.conv_dim(), d.value_dim(), d.nk, d.dk, d.nv, d.dv, d.kernel);
        let t_n = x.b.len() / nv;
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
        let mut s = vec![0f64; nv * dk * dv];
        let mut y = vec![0f64; t_n * vd];
        for t in 0..t_n {
            let mut c = vec![0f64; cd];
            for ch in 0..cd {
                let mut acc = 0.0;
                for j in 0..kk {
                    if t + j + 1 >= kk {
                        acc += w.conv[ch * kk + j] as f64 * x.p[(t + j + 1 - kk) * cd + ch] as f64;
                    }
                }
                c[ch] = acc * sig(acc);
            }
            for i in 0..2 * nk {
                let head = &mut c[i * dk..(i + 1) * dk];
                let n = (head.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
                let sc = if i < nk { 1.0 / (dk as f64).sqrt() } else { 1.0 };
                head.iter_mut().for_each(|v| *v = *v / n * sc);
            }
            for h in 0..nv {
                let i = h / (nv / nk);
                let (q, k, v) = (&c[i * dk..], &c[nk * dk + i * dk..], &c[2 * nk * dk + h * dv..]);
                let beta = sig(x.b[t * nv + h] as f64);
                let sp = (1.0 + (x.a[t * nv + h] as f64 + w.dt_bias[h] as f64).exp()).ln();
                let decay = (-(w.a_log[h] as f64).exp() * sp).exp();
                let sh = &mut s[h * dk * dv..(h + 1) * dk * dv];
                sh.iter_mut().for_each(|e| *e *= decay);
                let u: Vec<f64> =
                    (0..dv).map(|j| beta * (v[j] - (0..dk).map(|a| sh[a * dv + j] * k[a]).sum::<f64>())).collect();
                for a in 0..dk {
                    for j in 0..dv {
                        sh[a * dv + j] += k[a] * u[j];
                    }
                }
                let o: Vec<f64> = (0..dv).map(|j| (0..dk).map(|a| sh[a * dv + j] * q[a]).sum()).collect();
                let rms = (o.iter().map(|v| v * v).sum::<f64>() / dv as f64 + d.eps as f64).sqrt();
                for j in 0..dv {
                    let g = x.z[t * vd + h * dv + j] as f64;
                    y[t * vd + h * dv + j] = o[j] / rms * w.norm[j] as f64 * g * sig(g);
                }
            }
        }
        y
    }

    struct Case {
        d: Dims,
        conv: Vec<f32>,
        a_log: Vec<f32>,
        dt_bias: Vec<f32>,
        norm: Vec<f32>,
        p: Vec<f32>,
        z: Vec<f32>,
        b: Vec<f32>,
        a: Vec<f32>,
    }

    fn case(t_n: usize) -> Case {
        // nv / nk = 3 (not a power of two), dk != dv, K = 4
        let d = Dims { nk: 2, dk: 16, nv: 6, dv: 20, kernel: 4, eps: 1e-6, tiled: false, neg_exp_a: false };
        let mut rng = crate::rng::Rng::new(7);
        let mut v = |n: usize, s: f32| (0..n).map(|_| s * (2.0 * rng.next_f64() as f32 - 1.0)).collect::<Vec<f32>>();
        let (cd, vd, nv) = (d.conv_dim(), d.value_dim(), d.nv);
        Case {
            conv: v(cd * d.kernel, 0.6),
            a_log: v(nv, 1.0),
            dt_bias: v(nv, 1.0),
            norm: v(d.dv, 1.0).iter().map(|x| 1.0 + 0.3 * x).collect(),
            p: v(t_n * cd, 2.0),
            z: v(t_n * vd, 2.0),
            b: v(t_n * nv, 3.0),
            a: v(t_n * nv, 3.0),
            d,
        }
    }

    /// `core` over `c`'s tokens fed `split` at a time from a fresh state.
    fn run(c: &Case, exec: &Exec, split: usize) -> Vec<f32> {
        let (cd, vd, nv) = (c.d.conv_dim(), c.d.value_dim(), c.d.nv);
        let hy = HybridConfig {
            layer_types: vec![],
            rotary_dim: 0,
            conv_kernel: c.d.kernel,
            key_heads: c.d.nk,
            key_head_dim: c.d.dk,
            value_heads: nv,
            value_head_dim: c.d.dv,
            shared_expert_intermediate_size: 1,
            value_heads_tiled: false,
            a_stored_negated_exp: false,
        };
        let mut st = LinearState::new(&hy);
        let w = Weights { conv: &c.conv, a_log: &c.a_log, dt_bias: &c.dt_bias, norm: &c.norm };
        let t_n = c.b.len() / nv;
        let mut y = vec![0f32; t_n * vd];
        let mut t0 = 0;
        while t0 < t_n {
            let n = split.min(t_n - t0);
            let x = Inputs {
                p: &c.p[t0 * cd..(t0 + n) * cd],
                z: &c.z[t0 * vd..(t0 + n) * vd],
                b: &c.b[t0 * nv..(t0 + n) * nv],
                a: &c.a[t0 * nv..(t0 + n) * nv],
            };
            let (mut cb, mut beta, mut decay) = (vec![0f32; n * cd], vec![0f32; n * nv], vec![0f32; n * nv]);
            let tasks: Vec<Mutex<Vec<f32>>> = (0..exec.threads()).map(|_| Mutex::default()).collect();
            let work = Work { c: &mut cb, beta: &mut beta, decay: &mut decay, tasks: &tasks };
            core(exec, &w, c.d, &mut st, x, work, &mut y[t0 * vd..(t0 + n) * vd]);
            t0 += n;
        }
        y
    }

    #[test]
    fn core_follows_the_f64_textbook_the_same_at_any_split_threads_and_tier() {
        let c = case(23);
        let w = Weights { conv: &c.conv, a_log: &c.a_log, dt_bias: &c.dt_bias, norm: &c.norm };
        let want = textbook(&w, c.d, &Inputs { p: &c.p, z: &c.z, b: &c.b, a: &c.a });
        let mut first: Option<Vec<f32>> = None;
        for isa in Isa::available() {
            for threads in [1, 2, 3] {
                let exec = Exec::new(threads, isa).expect("exec");
                // one pass, token by token, and splits that leave fewer than K - 1 tokens in
                // the conv state's reach
                for split in [23, 1, 2, 5] {
                    let y = run(&c, &exec, split);
                    let tag = format!("{isa} {threads}T split {split}");
                    for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                        assert!((*a as f64 - b).abs() < 1e-4, "{tag}: y[{i}] {a} vs {b}");
                    }
                    match &first {
                        None => first = Some(y),
                        Some(f) => assert!(f == &y, "{tag}: not the same bits as the first run"),
                    }
                }
            }
        }
    }
}
