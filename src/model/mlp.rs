//! The MLPs that are not routed, and the SwiGLU product every MLP and expert computes:
//! ```text
//! y = down(silu(gate x) * up x)                  gate, up [I, H], down [H, I]
//! gpt-oss's experts: biases on all three, and a clamped activation (`ops::Glu`):
//! y = down(glu(gate x + bg, up x + bu)) + bd
//! dense layer:    delta = y(hn)
//! shared expert:  shared = sigmoid(hn · w_g) * y(hn)   (hybrids: every token, beside the routed ones)
//!                 shared = y(hn)                        (GLM-4.5, DeepSeek-V3: ungated)
//! ```

use moescope_kernels::act::QuantAct;
use moescope_kernels::dot;
use moescope_kernels::mat::Input;
use moescope_kernels::ops::{Glu, add_inplace};

use super::error::ModelError;
use super::pass::Pass;
use super::run_state::RunState;
use crate::exec::{Exec, GatePair, Scratch};
use crate::package::{ExpertMats, Package, TensorId};
use crate::trace;

/// The products' names in a trace: gate and up as one (one token), gate, up (several), down.
pub(super) type Labels = [&'static str; 4];

/// The SwiGLU product's intermediate buffers, grown to the largest batch they have served:
/// `g`, `u` `[n, I]` (several tokens) and `a` `[n, I]`.
#[derive(Default)]
pub struct MlpWork {
    g: Vec<f32>,
    u: Vec<f32>,
    a: Vec<f32>,
}

impl MlpWork {
    /// Buffers for `n` tokens of width `i`, allocated now.
    pub fn new(n: usize, i: usize) -> MlpWork {
        let mut w = MlpWork::default();
        w.fit(n, i);
        w
    }

    pub(super) fn fit(&mut self, n: usize, i: usize) {
        for b in [&mut self.a, &mut self.g, &mut self.u] {
            if b.len() < n * i {
                b.resize(n * i, 0.0);
            }
        }
    }

    pub fn bytes(&self) -> u64 {
        ((self.g.capacity() + self.u.capacity() + self.a.capacity()) * 4) as u64
    }
}

/// An MLP's biases (gpt-oss's experts): gate `[I]`, up `[I]`, down `[H]`.
#[derive(Debug, Clone, Copy)]
pub struct MlpBias<'a> {
    pub gate: &'a [f32],
    pub up: &'a [f32],
    pub down: &'a [f32],
}

/// What an MLP computes besides its three products: the activation between them and the
/// biases, if any.
#[derive(Debug, Clone, Copy)]
pub struct Gating<'a> {
    pub glu: Glu,
    pub bias: Option<MlpBias<'a>>,
}

impl Gating<'_> {
    /// Qwen's MLPs: SwiGLU, no biases.
    pub const PLAIN: Gating<'static> = Gating { glu: Glu::Silu, bias: None };

    /// The gate/up pair of `m` with this MLP's gate and up biases.
    pub fn pair<'a>(&self, m: &'a ExpertMats<'_>) -> GatePair<'a>
    where
        Self: 'a,
    {
        GatePair { gate: &m.gate, up: &m.up, bias: self.bias.map(|b| (b.gate, b.up)) }
    }
}

/// `out = down(glu(gate x, up x))` (with `gating`'s biases) for `x` of `[n, H]`; `out` is
/// `[n, H]`.
pub(super) fn swiglu_mlp(
    exec: &Exec,
    labels: Labels,
    (m, gating): (&ExpertMats<'_>, Gating<'_>),
    x: &[f32],
    work: &mut MlpWork,
    out: &mut [f32],
    s: &mut Scratch,
) {
    let (i, n) = (m.gate.rows, x.len() / m.gate.cols);
    work.fit(n, i);
    if n == 1 {
        // one token (decode): gate and up with their activation in one parallel section, the
        // input quantized once
        exec.swiglu_pairs(labels[0], &[gating.pair(m)], gating.glu, x, &mut work.a[..i], s);
    } else {
        let MlpWork { g, u, .. } = work;
        let (g, u) = (&mut g[..n * i], &mut u[..n * i]);
        exec.matmul_shared(x, n, &mut [(labels[1], &m.gate, &mut *g), (labels[2], &m.up, &mut *u)], s);
        glu(exec, gating, i, n, work);
    }
    down(exec, labels[3], (m, gating), n, work, out, s);
}

/// [`swiglu_mlp`] of several tokens whose input is quantized already, as gate and up read it
/// (`xq`: an expert's rows of its layer's input, quantized once for all its experts).
pub(super) fn swiglu_mlp_quantized(
    exec: &Exec,
    labels: Labels,
    (m, gating): (&ExpertMats<'_>, Gating<'_>),
    xq: &QuantAct,
    work: &mut MlpWork,
    out: &mut [f32],
    s: &mut Scratch,
) {
    let (i, n) = (m.gate.rows, xq.rows());
    work.fit(n, i);
    let MlpWork { g, u, .. } = work;
    let (g, u) = (&mut g[..n * i], &mut u[..n * i]);
    exec.products_of(Input::Quant(xq), n, &mut [(labels[1], &m.gate, &mut *g), (labels[2], &m.up, &mut *u)], s);
    glu(exec, gating, i, n, work);
    down(exec, labels[3], (m, gating), n, work, out, s);
}

/// `a = glu(g, u)` over `n` tokens of width `i`, with the gate and up biases if any; the
/// tokens in parallel (each by itself: the split changes no bit).
fn glu(exec: &Exec, gating: Gating<'_>, i: usize, n: usize, work: &mut MlpWork) {
    let MlpWork { g, u, a } = work;
    let (g, u, a) = (&g[..n * i], &u[..n * i], &mut a[..n * i]);
    exec.rows_mut("glu_rows", a, i, &|r, a| {
        let (g, u) = (&g[r.start * i..r.end * i], &u[r.start * i..r.end * i]);
        match gating.bias {
            None => gating.glu.apply(g, u, None, a),
            Some(b) => {
                for ((g, u), a) in g.chunks_exact(i).zip(u.chunks_exact(i)).zip(a.chunks_exact_mut(i)) {
                    gating.glu.apply(g, u, Some((b.gate, b.up)), a);
                }
            }
        }
    });
}

/// `out = down a` (and its bias) over `n` tokens.
fn down(
    exec: &Exec,
    label: &'static str,
    (m, gating): (&ExpertMats<'_>, Gating<'_>),
    n: usize,
    work: &MlpWork,
    out: &mut [f32],
    s: &mut Scratch,
) {
    exec.matmul(label, &m.down, &work.a[..n * m.gate.rows], n, out, s);
    if let Some(b) = gating.bias {
        out.chunks_exact_mut(b.down.len()).for_each(|o| add_inplace(o, b.down));
    }
}

/// The three matrices of an MLP (package names `{prefix}gate_proj.weight`, ...).
#[derive(Debug, Clone, Copy)]
struct Mats {
    gate: TensorId,
    up: TensorId,
    down: TensorId,
}

impl Mats {
    fn load(pkg: &Package, prefix: &str, hidden: usize, width: usize) -> Result<Mats, ModelError> {
        let m = |name: &str, shape: &[usize]| pkg.require(&format!("{prefix}{name}.weight"), shape, false);
        Ok(Mats {
            gate: m("gate_proj", &[width, hidden])?,
            up: m("up_proj", &[width, hidden])?,
            down: m("down_proj", &[hidden, width])?,
        })
    }

    fn bind<'p>(&self, pkg: &'p Package) -> ExpertMats<'p> {
        ExpertMats {
            gate: pkg.mat_by_index(self.gate),
            up: pkg.mat_by_index(self.up),
            down: pkg.mat_by_index(self.down),
        }
    }
}

/// A dense layer's MLP.
pub struct DenseMlp {
    mats: Mats,
}

impl DenseMlp {
    /// The MLP named `{prefix}gate_proj.weight`, ... of width `width`.
    pub fn load(pkg: &Package, prefix: &str, hidden: usize, width: usize) -> Result<DenseMlp, ModelError> {
        Ok(DenseMlp { mats: Mats::load(pkg, prefix, hidden, width)? })
    }

    /// Layer `l`'s MLP of the pass's normed rows (`st.hn`) into `st.delta`.
    pub fn forward(&self, pass: &mut Pass<'_, '_>, l: usize) {
        let _m = trace::span("mlp").arg("layer", l);
        let m = self.mats.bind(pass.pkg);
        let rows = pass.t_n * m.gate.cols;
        let RunState { hn, delta, mlp, scratch, .. } = &mut *pass.st;
        let labels = ["gate_up_proj", "gate_proj", "up_proj", "down_proj"];
        swiglu_mlp(pass.exec, labels, (&m, Gating::PLAIN), &hn[..rows], mlp, &mut delta[..rows], scratch);
    }
}

/// A shared expert: a SwiGLU MLP every token runs, scaled by sigmoid(h · gate) in the hybrids.
pub struct SharedExpert {
    mats: Mats,
    /// `[1, H]` f32 (the hybrids)
    gate: Option<TensorId>,
}

impl SharedExpert {
    /// The hybrids' shared expert of the MoE block under `prefix` (`{prefix}shared_expert.*`,
    /// `{prefix}shared_expert_gate.weight`), of width `width`.
    pub fn load_gated(pkg: &Package, prefix: &str, hidden: usize, width: usize) -> Result<SharedExpert, ModelError> {
        Ok(SharedExpert {
            mats: Mats::load(pkg, &format!("{prefix}shared_expert."), hidden, width)?,
            gate: Some(pkg.require(&format!("{prefix}shared_expert_gate.weight"), &[1, hidden], true)?),
        })
    }

    /// GLM-4.5's and DeepSeek-V3's shared experts (`{prefix}shared_experts.*`), `width` wide
    /// together, added as they are.
    pub fn load_plain(pkg: &Package, prefix: &str, hidden: usize, width: usize) -> Result<SharedExpert, ModelError> {
        Ok(SharedExpert { mats: Mats::load(pkg, &format!("{prefix}shared_experts."), hidden, width)?, gate: None })
    }

    /// Layer `l`'s shared expert of the pass's normed rows (`st.hn`), scaled by its gate if any, into
    /// `st.shared` (`[T, H]`, to be added to the routed sum).
    pub fn forward(&self, pass: &mut Pass<'_, '_>, l: usize) {
        let (pkg, t_n) = (pass.pkg, pass.t_n);
        let _s = trace::span("shared_expert").arg("layer", l).arg("tokens", t_n);
        let m = self.mats.bind(pkg);
        let h = m.gate.cols;
        let RunState { hn, shared, mlp, scratch, .. } = &mut *pass.st;
        let (hn, y) = (&hn[..t_n * h], &mut shared[..t_n * h]);
        let labels = ["shared_gate_up_proj", "shared_gate_proj", "shared_up_proj", "shared_down_proj"];
        swiglu_mlp(pass.exec, labels, (&m, Gating::PLAIN), hn, mlp, y, scratch);
        let Some(gate) = self.gate else { return };
        let (wg, isa) = (pkg.f32_by_index(gate), pass.exec.isa);
        // each token's gate and scaling by itself, the tokens in parallel
        pass.exec.rows_mut_costed("shared_gate_rows", y, h, 2 * h * 4, &|r, y| {
            for (yt, x) in y.chunks_exact_mut(h).zip(hn[r.start * h..r.end * h].chunks_exact(h)) {
                let z = dot::dot_f32(isa, wg, x);
                let sg = 1.0 / (1.0 + (-z).exp());
                for v in yt.iter_mut() {
                    *v *= sg;
                }
            }
        });
    }
}
