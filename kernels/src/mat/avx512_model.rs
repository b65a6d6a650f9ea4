//! A scalar model of the AVX-512 kernels' summation order, one (row, token) product at a time,
//! and the tests that hold the kernels to it bit for bit.
//!
//! The AVX-512 kernels sum the same products as the scalar reference (`dot::scalar`) in another
//! order: 16 float lanes, each a fused multiply-add chain over the groups, then one fixed tree.
//! The row-by-row tiers (scalar, AVX2) are held to each other bit for bit and to the f64
//! product within a bound (`dot`'s tests); the AVX-512 tier is held here, bit for bit, to this
//! model of its own order, written from the lanes' definitions rather than from the kernels'
//! code: integer lane sums (exact), `i32 as f32` (the conversion `vcvtdq2ps` makes: round to
//! nearest even), `f32::mul_add` (one rounding, as `vfmadd`), and the tree of `hsum`.
//!
//! Lanes: `vpdpbusd` adds each 4 consecutive bytes' products into one int32 lane.
//! - q4 with symmetric groups (f32 or f16 scales: `avx512_q4_rows.rs`): no lanes of a product;
//!   per group the exact sum of `(n - 8) a`, converted, and one fused multiply-add with the
//!   group's scales, group after group.
//! - q4 with mins or records, and q6 (`q4_lohi32`, `q6_lo4hi2`): a 128-value chunk's low nibbles are the first halves
//!   of its four 32-value blocks, the high nibbles the second halves; lane `l` holds block
//!   `l / 4`'s values `4 (l % 4) ..+ 4` of the low half and the same of the high half. The
//!   codes are stored biased (`n = q + 8`, `q + 32`), and `bias * sum a` comes off at the end
//!   per group (or, with mins, `min * sum a` in its place), group `g` into lane `g % 16`.
//! - q8: a 64-value chunk's lane `l` holds values `4 l ..+ 4`. Groups of whole chunks take
//!   `(w + 128) a` and `-128 sum a` in lane 0, even groups into one set of lanes, odd ones into
//!   another, added before the tree; smaller groups take `w a` exactly and, with mins, their term
//!   last, as q4's.

use crate::act::QuantRow;

/// `hsum`'s tree (and `_mm512_reduce_add_ps`'s): lanes `i` and `i + 8`, then `i + 4`, `i + 2`,
/// then lanes 0 and 1.
fn tree(v: [f32; 16]) -> f32 {
    let s8: [f32; 8] = std::array::from_fn(|i| v[i] + v[i + 8]);
    let s4: [f32; 4] = std::array::from_fn(|i| s8[i] + s8[i + 4]);
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// The lane of value `p` (0..128) of a q4 / q6 chunk, and whether it is a high-nibble value.
fn nibble_lane(p: usize) -> (usize, bool) {
    let (block, at) = (p / 32, p % 32);
    (block * 4 + (at % 16) / 4, at >= 16)
}

/// Group `g`'s bias (or min) term into lane `g % 16`: `f - w * b`, fused.
fn bias_terms(f: &mut [f32; 16], w: impl Fn(usize) -> f32, b: impl Fn(usize) -> f32, ng: usize) {
    for g in 0..ng {
        f[g % 16] = (-w(g)).mul_add(b(g), f[g % 16]);
    }
}

/// A q4 (`six` false: unsigned codes `n` in [0, 15]) or q6 (`n` in [0, 63]) row with `wd`
/// (and, q4 only, `mins`: values `wd * n - min`, else `wd * (n - bias)`) times `a`.
pub fn q_product(six: bool, n: &[i32], wd: &[f32], mins: Option<&[f32]>, group: usize, a: QuantRow<'_>) -> f32 {
    let ng = n.len() / group;
    let s = |g: usize| wd[g] * a.scales[g];
    let prod = |j: usize| n[j] * a.q[j] as i32;
    if !six && mins.is_none() {
        // symmetric q4 groups (`avx512_q4_rows.rs`): each group's exact sum of `(n - 8) a`,
        // converted once, one fused multiply-add per group in order
        return (0..ng).fold(0f32, |f, g| {
            let isum: i32 = (g * group..(g + 1) * group).map(|j| (n[j] - 8) * a.q[j] as i32).sum();
            (isum as f32).mul_add(s(g), f)
        });
    }
    let mut f = [0f32; 16];
    if group >= 128 {
        for g in 0..ng {
            let mut lanes = [0i32; 16];
            for j in g * group..(g + 1) * group {
                lanes[nibble_lane(j % 128).0] += prod(j);
            }
            for (f, l) in f.iter_mut().zip(lanes) {
                *f = (l as f32).mul_add(s(g), *f);
            }
        }
    } else {
        let gpc = 128 / group;
        for ci in 0..n.len() / 128 {
            let (mut lo, mut hi) = ([0i32; 16], [0i32; 16]);
            for p in 0..128 {
                match nibble_lane(p) {
                    (l, false) => lo[l] += prod(ci * 128 + p),
                    (l, true) => hi[l] += prod(ci * 128 + p),
                }
            }
            for l in 0..16 {
                if gpc == 8 {
                    // groups of 16: the low half of block l / 4 is one group, the high half the next
                    let g = ci * 8 + 2 * (l / 4);
                    f[l] = (lo[l] as f32).mul_add(s(g), f[l]);
                    f[l] = (hi[l] as f32).mul_add(s(g + 1), f[l]);
                } else {
                    f[l] = ((lo[l] + hi[l]) as f32).mul_add(s(ci * gpc + l * gpc / 16), f[l]);
                }
            }
        }
    }
    let bias = if six { 32.0 } else { 8.0 };
    match mins {
        Some(m) => bias_terms(&mut f, |g| m[g], |g| a.scaled_sums[g], ng),
        None => bias_terms(&mut f, |g| wd[g], |g| bias * a.scaled_sums[g], ng),
    }
    tree(f)
}

/// A q8 row `w` with `wd` (and, for groups under 64 values, `mins`: values `wd * w - min`)
/// times `a`.
pub fn q8_product(w: &[i8], wd: &[f32], mins: Option<&[f32]>, group: usize, a: QuantRow<'_>) -> f32 {
    let ng = w.len() / group;
    let s = |g: usize| wd[g] * a.scales[g];
    if group.is_multiple_of(64) {
        let mut f = [[0f32; 16]; 2];
        for g in 0..ng {
            let mut lanes = [0i32; 16];
            for j in g * group..(g + 1) * group {
                lanes[(j % 64) / 4] += (w[j] as i32 + 128) * a.q[j] as i32;
            }
            lanes[0] -= 128 * a.sums[g];
            for (f, l) in f[g % 2].iter_mut().zip(lanes) {
                *f = (l as f32).mul_add(s(g), *f);
            }
        }
        return tree(std::array::from_fn(|l| f[0][l] + f[1][l]));
    }
    let gpc = 64 / group;
    let mut f = [0f32; 16];
    for ci in 0..w.len() / 64 {
        for (l, f) in f.iter_mut().enumerate() {
            let lane: i32 = (ci * 64 + 4 * l..ci * 64 + 4 * l + 4).map(|j| w[j] as i32 * a.q[j] as i32).sum();
            *f = (lane as f32).mul_add(s(ci * gpc + l * gpc / 16), *f);
        }
    }
    if let Some(m) = mins {
        bias_terms(&mut f, |g| m[g], |g| a.scaled_sums[g], ng);
    }
    tree(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::QuantAct;
    use crate::isa::Isa;
    use crate::mat::{Input, Mat, MatData};
    use crate::quant::{Format, interleave_rows, q4_value, q6_value};

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u32 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 33) as u32
        }
        /// in [-1, 1)
        fn unit(&mut self) -> f32 {
            self.next() as f32 / (1u64 << 30) as f32 - 1.0
        }
    }

    /// Every product of `m` at the AVX-512 tiers (and AMX where granted), n tokens at once
    /// (prefill tiles) and one at a time (decode), against `model(row, token)`, bit for bit.
    fn check(m: &Mat<'_>, x: &[f32], qa: &QuantAct, n: usize, model: impl Fn(usize, usize) -> f32) {
        for isa in Isa::available().into_iter().filter(|i| *i >= Isa::Avx512) {
            let mut got = vec![0f32; m.rows * n];
            m.matmul_rows(isa, Input::Quant(qa), n, 0..m.rows, &mut got);
            let mut one = vec![0f32; m.rows];
            for t in 0..n {
                let mut single = QuantAct::default();
                single.quantize(&x[t * m.cols..(t + 1) * m.cols], m.cols, qa.row(0).group, isa);
                m.matmul_rows(isa, Input::Quant(&single), 1, 0..m.rows, &mut one);
                for r in 0..m.rows {
                    let want = model(r, t);
                    let tag =
                        format!("{isa} {:?} rows {} cols {} n {n}: row {r} token {t}", m.format(), m.rows, m.cols);
                    assert_eq!(got[r * n + t].to_bits(), want.to_bits(), "{tag}: {} vs {want}", got[r * n + t]);
                    assert_eq!(one[r].to_bits(), want.to_bits(), "{tag} alone: {} vs {want}", one[r]);
                }
            }
        }
    }

    /// `n` rows of activations, and their quantized form.
    fn acts(rng: &mut Rng, n: usize, cols: usize, group: usize) -> (Vec<f32>, QuantAct) {
        let x: Vec<f32> = (0..n * cols).map(|_| 3.0 * rng.unit()).collect();
        let mut qa = QuantAct::default();
        qa.quantize(&x, cols, group, Isa::Avx512);
        (x, qa)
    }

    fn floats(rng: &mut Rng, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| scale * rng.unit()).collect()
    }

    /// (rows, tokens): a token, tiles of the VNNI kernels and their remainders, and the AMX tiles'
    /// (16 tokens a tile, 32 a pass; from 12 tokens, groups of 32 from 24): a tile and a short
    /// one (21, 30), a pass and a short lone tile (45)
    const SHAPES: [(usize, usize); 8] = [(1, 1), (3, 2), (4, 3), (9, 5), (37, 9), (16, 21), (5, 30), (20, 45)];

    #[test]
    fn q4_and_q6_tiles_equal_the_model_bit_for_bit() {
        if !Isa::available().contains(&Isa::Avx512) {
            eprintln!("not run: this CPU has no AVX-512 VNNI tier");
            return;
        }
        let mut rng = Rng(5);
        // GGUF's Q4_0 / Q4_K / Q4_1 (q4 g32, with and without mins), Q6_K (q6 g16), and the
        // package's own q4 and q6 groups
        for (six, group, with_mins) in
            [(false, 32, false), (false, 32, true), (false, 64, false), (false, 128, false), (false, 256, false)]
                .into_iter()
                .chain([(true, 16, false), (true, 128, false)])
        {
            for cols in [128usize, 256, 768] {
                if !cols.is_multiple_of(group) {
                    continue;
                }
                for (rows, n) in SHAPES {
                    for x4 in [false, true] {
                        let rows = if x4 { rows.next_multiple_of(4) } else { rows };
                        let f = if six { Format::Q6 { group } } else { Format::Q4 { group } };
                        let rb = f.data_bytes(1, cols);
                        let q: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
                        let ng = cols / group;
                        let wd = floats(&mut rng, rows * ng, 0.05);
                        let mins = floats(&mut rng, rows * ng, 0.2);
                        let (x, qa) = acts(&mut rng, n, cols, group);
                        let codes: Vec<i32> = (0..rows * cols)
                            .map(|j| {
                                let row = &q[j / cols * rb..][..rb];
                                if six { q6_value(row, j % cols) + 32 } else { q4_value(row, group, j % cols) + 8 }
                            })
                            .collect();
                        let mut stored = q.clone();
                        if x4 {
                            interleave_rows(&q, rb, f.chunk_bytes().unwrap_or(rb), &mut stored);
                        }
                        let m_opt = with_mins.then_some(mins.as_slice());
                        let data = if six {
                            MatData::Q6 { q: &stored, scales: &wd, group, x4, panels: false }
                        } else {
                            MatData::Q4 { q: &stored, scales: &wd, group, x4, panels: false, lanes: false, mins: m_opt }
                        };
                        let m = Mat { rows, cols, data };
                        check(&m, &x, &qa, n, |r, t| {
                            let (w, mn) = (&wd[r * ng..(r + 1) * ng], m_opt.map(|m| &m[r * ng..(r + 1) * ng]));
                            q_product(six, &codes[r * cols..(r + 1) * cols], w, mn, group, qa.row(t))
                        });
                    }
                }
            }
        }
    }

    #[test]
    fn q8_kernels_equal_the_model_bit_for_bit() {
        if !Isa::available().contains(&Isa::Avx512) {
            eprintln!("not run: this CPU has no AVX-512 VNNI tier");
            return;
        }
        let mut rng = Rng(9);
        // GGUF's Q8_0 and Q5_0 (g32), Q5_K (g32 with mins); the package's q8 groups
        for (group, with_mins) in [(16, false), (16, true), (32, false), (32, true), (64, false), (128, false)] {
            for cols in [128usize, 256, 640] {
                if !cols.is_multiple_of(group) {
                    continue;
                }
                for (rows, n) in SHAPES {
                    let w: Vec<i8> = (0..rows * cols).map(|_| rng.next() as i8).collect();
                    let ng = cols / group;
                    let wd = floats(&mut rng, rows * ng, 0.05);
                    let mins = floats(&mut rng, rows * ng, 0.2);
                    let (x, qa) = acts(&mut rng, n, cols, group);
                    let m_opt = with_mins.then_some(mins.as_slice());
                    let m = Mat { rows, cols, data: MatData::Q8 { q: &w, scales: &wd, group, mins: m_opt } };
                    check(&m, &x, &qa, n, |r, t| {
                        let (wr, mn) = (&wd[r * ng..(r + 1) * ng], m_opt.map(|m| &m[r * ng..(r + 1) * ng]));
                        q8_product(&w[r * cols..(r + 1) * cols], wr, mn, group, qa.row(t))
                    });
                }
            }
        }
    }
}
