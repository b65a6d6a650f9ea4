//! Element-wise and per-row operations of a transformer layer, in f32.

/// RMSNorm of one row: `out = x / sqrt(mean(x^2) + eps) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss = sum_squares(x);
    let inv = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = g * (v * inv);
    }
}

/// RMSNorm of one row in place.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let ss = sum_squares(x);
    let inv = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v = g * (*v * inv);
    }
}

/// `x <- x / sqrt(sum(x^2) + eps) * scale` (Gated DeltaNet's query and key normalisation: the sum,
/// not the mean, with its own eps; the scale applied after).
pub fn l2_norm_inplace(x: &mut [f32], eps: f32, scale: f32) {
    let inv = 1.0 / (sum_squares(x) as f32 + eps).sqrt();
    for v in x.iter_mut() {
        *v = (*v * inv) * scale;
    }
}

/// `sum(x^2)` in f64, over 8 interleaved lanes added in a fixed order at the end: the same bits
/// on every CPU, and vector code (one chain of dependent adds is slow, and a layer's decode runs
/// many norms, q's and k's heads among them, on the engine thread between sections).
fn sum_squares(x: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v as f64 * v as f64;
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &v in chunks.remainder() {
        s += v as f64 * v as f64;
    }
    s
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// sigmoid(x) as straight-line arithmetic the compiler vectorizes in a loop (no libm call per
/// value): from e = exp(-|x|) <= 1, 1 / (1 + e) or e / (1 + e). Within a few ulp of
/// `1 / (1 + exp(-x))`.
#[inline(always)]
pub fn sigmoid_lanes(x: f32) -> f32 {
    let e = crate::attn::exp_le0(-x.abs());
    if x >= 0.0 { 1.0 / (1.0 + e) } else { e / (1.0 + e) }
}

/// `x <- silu(x)` over a row: x * [`sigmoid_lanes`]`(x)`, within a few ulp of [`silu`].
pub fn silu_inplace(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v *= sigmoid_lanes(*v);
    }
}

/// `y <- y * silu(g)` over a row (a gated norm's gate), as [`silu_inplace`] computes silu.
pub fn mul_silu(y: &mut [f32], g: &[f32]) {
    for (y, &g) in y.iter_mut().zip(g) {
        *y *= g * sigmoid_lanes(g);
    }
}

/// `y <- y * sigmoid(g)` over a row (gated attention's output gate).
pub fn mul_sigmoid(y: &mut [f32], g: &[f32]) {
    for (y, &g) in y.iter_mut().zip(g) {
        *y *= sigmoid_lanes(g);
    }
}

/// How an MLP's gate and up results become its down product's input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Glu {
    /// `silu(g) * u`: the SwiGLU of Qwen's MLPs and experts
    Silu,
    /// gpt-oss's experts: `g = min(g, limit)`, `u = clamp(u, -limit, limit)`,
    /// `(u + 1) * g * sigmoid(alpha g)`
    Clamped { alpha: f32, limit: f32 },
}

impl Glu {
    /// `out[i] = act(gate[i] + bg[i], up[i] + bu[i])`, the biases `(bg, bu)` where given.
    pub fn apply(self, gate: &[f32], up: &[f32], bias: Option<(&[f32], &[f32])>, out: &mut [f32]) {
        match (self, bias) {
            (Glu::Silu, None) => swiglu(gate, up, out),
            (Glu::Silu, Some((bg, bu))) => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = silu(gate[i] + bg[i]) * (up[i] + bu[i]);
                }
            }
            (Glu::Clamped { alpha, limit }, bias) => {
                for (i, o) in out.iter_mut().enumerate() {
                    let (g, u) = match bias {
                        Some((bg, bu)) => (gate[i] + bg[i], up[i] + bu[i]),
                        None => (gate[i], up[i]),
                    };
                    let (g, u) = (g.min(limit), u.clamp(-limit, limit));
                    *o = (u + 1.0) * (g / (1.0 + (-alpha * g).exp()));
                }
            }
        }
    }
}

/// `out[i] = silu(gate[i]) * up[i]` (the SwiGLU of Qwen's MLPs and experts), silu as
/// [`silu_inplace`] computes it.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g * sigmoid_lanes(g) * u;
    }
}

/// Softmax in place, max-subtracted.
pub fn softmax_inplace(x: &mut [f32]) {
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// The indices of the `k` largest values of `p`, largest first, ties to the lower index (by
/// `total_cmp`): the first `k` of all indices sorted that way, found in one pass that keeps the
/// best `k` in order (a sort of all of a router's probabilities runs on the engine thread while
/// the compute threads wait).
pub fn top_k(p: &[f32], k: usize, out: &mut Vec<usize>) {
    use std::cmp::Ordering;
    out.clear();
    if k == 0 {
        return;
    }
    for (i, v) in p.iter().enumerate() {
        // every index kept is lower than i, so it stays ahead of i on a tie
        if out.len() == k && v.total_cmp(&p[out[k - 1]]) != Ordering::Greater {
            continue;
        }
        let at = out.partition_point(|&j| p[j].total_cmp(v) != Ordering::Less);
        out.insert(at, i);
        out.truncate(k);
    }
}

/// `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Rotary embedding tables, computed the way transformers does in f32 so the angles round
/// the same: `inv_freq[i] = 1 / theta^(2i / rot_dim)`, `angle = pos * inv_freq[i]`.
#[derive(Debug, Clone)]
pub struct Rope {
    pub rot_dim: usize,
    inv_freq: Vec<f32>,
    /// What cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
    scale: f32,
}

impl Rope {
    pub fn new(theta: f64, rot_dim: usize) -> Rope {
        let inv_freq =
            (0..rot_dim / 2).map(|i| 1.0f32 / (theta as f32).powf((2 * i) as f32 / rot_dim as f32)).collect();
        Rope { rot_dim, inv_freq, scale: 1.0 }
    }

    /// Frequencies made elsewhere (a scaled RoPE such as YaRN: `rot_dim / 2` of them), cos and
    /// sin multiplied by `scale`.
    pub fn with_freqs(inv_freq: Vec<f32>, scale: f32) -> Rope {
        Rope { rot_dim: 2 * inv_freq.len(), inv_freq, scale }
    }

    /// cos and sin of position `pos`, each `rot_dim / 2` long.
    pub fn cos_sin(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let a = pos as f32 * f;
            cos[i] = a.cos() * self.scale;
            sin[i] = a.sin() * self.scale;
        }
    }
}

/// Rotate-half (NeoX) RoPE on the first `2 * cos.len()` dims of one head vector.
pub fn apply_rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i] + a * sin[i];
    }
}

/// DeepSeek's rotary layout (`rope_interleave`): pair i is `(x[2i], x[2i + 1])`, and the result
/// comes out in halves as transformers' `apply_rotary_pos_emb_interleave` gives it: `x[i] =
/// x0 cos - x1 sin`, `x[i + half] = x1 cos + x0 sin` (queries and keys alike, so their dot
/// products are those of the interleaved pairs). `scratch` holds `x.len()` values.
pub fn apply_rope_interleaved(x: &mut [f32], cos: &[f32], sin: &[f32], scratch: &mut [f32]) {
    let half = cos.len();
    let s = &mut scratch[..2 * half];
    s.copy_from_slice(&x[..2 * half]);
    for i in 0..half {
        let (a, b) = (s[2 * i], s[2 * i + 1]);
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i] + a * sin[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vector_silu_follows_the_scalar_one() {
        let mut x: Vec<f32> = (-2000..2000).map(|i| i as f32 * 0.01).chain([-100.0, 100.0, 0.0, -0.0]).collect();
        let want: Vec<f32> = x.iter().map(|&v| silu(v)).collect();
        let ones = vec![1.0; x.len()];
        let (mut gated, mut glu) = (ones.clone(), vec![0.0; x.len()]);
        mul_silu(&mut gated, &x);
        swiglu(&x, &ones, &mut glu);
        let mut sig = ones.clone();
        mul_sigmoid(&mut sig, &x);
        for (s, &v) in sig.iter().zip(&x) {
            let want = 1.0 / (1.0 + (-v as f64).exp());
            // (exp_le0 flushes what would be subnormal to zero)
            assert!((*s as f64 - want).abs() <= 1e-6 * want + 1e-37, "sigmoid({v}) = {s}, not {want}");
        }
        silu_inplace(&mut x);
        for (i, (a, b)) in x.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
            assert!(gated[i] == *a && glu[i] == *a, "{i}: the gate's and the GLU's silu are silu_inplace's");
        }
    }

    #[test]
    fn rope_rotates_pairs_by_the_angle() {
        let r = Rope::new(10000.0, 4);
        let (mut c, mut s) = (vec![0.0; 2], vec![0.0; 2]);
        r.cos_sin(3, &mut c, &mut s);
        // pair (0, 2) turns by 3 rad, pair (1, 3) by 3 / 100 rad
        let mut x = vec![1.0, 1.0, 0.0, 0.0];
        apply_rope(&mut x, &c, &s);
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[2] - 3f32.sin()).abs() < 1e-6);
        assert!((x[1] - 0.03f32.cos()).abs() < 1e-6 && (x[3] - 0.03f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut x = vec![1.0, 3.0, -2.0, 3.0];
        softmax_inplace(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] == x[3] && x[1] > x[0] && x[0] > x[2]);
    }

    #[test]
    fn rms_norm_unit_rows() {
        let x = vec![3.0, -4.0];
        let mut o = vec![0.0; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut o);
        let r = (12.5f32).sqrt();
        assert!((o[0] - 3.0 / r).abs() < 1e-6 && (o[1] + 8.0 / r).abs() < 1e-6);
    }

    #[test]
    fn rms_norm_matches_the_f64_formula_at_awkward_widths() {
        // widths around the 8 lanes and a model's 2048 (+3); values spanning 6 decades
        let mut seed = 9u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 40) as f64 / (1u64 << 24) as f64 - 0.5) * 10f64.powi((seed % 7) as i32 - 3)
        };
        for n in [1usize, 7, 8, 9, 17, 128, 2051] {
            let x: Vec<f32> = (0..n).map(|_| next() as f32).collect();
            let w: Vec<f32> = (0..n).map(|_| 1.0 + next() as f32).collect();
            let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let inv = 1.0 / (ms + 1e-6).sqrt();
            let (mut out, mut inplace) = (vec![0f32; n], x.clone());
            rms_norm(&x, &w, 1e-6, &mut out);
            rms_norm_inplace(&mut inplace, &w, 1e-6);
            for i in 0..n {
                let want = w[i] as f64 * x[i] as f64 * inv;
                let tol = 4.0 * f32::EPSILON as f64 * want.abs() + 1e-30;
                assert!((out[i] as f64 - want).abs() <= tol, "width {n}, value {i}: {} vs {want}", out[i]);
                assert_eq!(out[i].to_bits(), inplace[i].to_bits(), "width {n}, value {i}: in place differs");
            }
        }
    }

    #[test]
    fn top_k_is_the_head_of_the_full_sort_ties_to_the_lower_index() {
        let mut seed = 5u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            seed >> 33
        };
        let mut out = Vec::new();
        for n in [0usize, 1, 5, 128] {
            for round in 0..20 {
                // few distinct values (many ties), then spread ones, with -0.0 beside 0.0
                let p: Vec<f32> = (0..n)
                    .map(|_| match round % 3 {
                        0 => (next() % 4) as f32,
                        1 => (next() % 1000) as f32 / 7.0,
                        _ => [0.0, -0.0, 1.0][(next() % 3) as usize],
                    })
                    .collect();
                let mut all: Vec<usize> = (0..n).collect();
                all.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
                for k in [0, 1, 3, 8, n, n + 2] {
                    top_k(&p, k, &mut out);
                    assert_eq!(out[..], all[..k.min(n)], "n {n} k {k}: {p:?}");
                }
            }
        }
    }
}
