//! Seeded random weights with a trained model's scales.
//!
//! Dense tensors are drawn as f32 and go through the converter's own quantizers (they are ~7%
//! of a 30B package). Expert blobs (the rest) are drawn directly in their stored format, which
//! is what lets `synth` run at the disk's speed: int4 / int8 codes from a table of a discretized
//! normal distribution indexed by random bytes, with per-group scales that are exact f16 values
//! (so a llama.cpp Q4_0 / Q8_0 file holds the very same weights; `tests/reference/moe_to_gguf.py`).
//!
//! Every value is a function of (seed, tensor, row) or (seed, layer, expert), never of the order
//! of work: the same seed gives the same file on any number of threads.
//!
//! | tensor                          | values                                                    |
//! |---------------------------------|-----------------------------------------------------------|
//! | norms (all), GDN gated norm     | 1                                                         |
//! | matrices, embedding, lm_head    | N(0, 0.02)                                                |
//! | token mixers' output projections| N(0, (0.02 / sqrt(2 layers))^2), GPT-2's scaled init.     |
//! |   (attention o_proj, GDN        | Random attention averages over positions, so at 0.02 its  |
//! |   out_proj)                     | common term drowned the tokens over 48 layers and every   |
//! |                                 | position predicted one of 3 tokens; scaling the experts'  |
//! |                                 | down_proj too (their term is per token) made it 4 again   |
//! | routers                         | N(0, (2.5 / sqrt(hidden))^2): logits of a unit-RMS input   |
//! |                                 | have std 2.5, so the top-8 of 128 take about 60% of the   |
//! |                                 | softmax, as a trained router's do                          |
//! | shared-expert gate              | N(0, 1 / hidden): its sigmoid input has std 1             |
//! | GDN conv1d                      | N(0, 1 / K)                                               |
//! | GDN A_log                       | ln U(1, 16) (transformers' init)                          |
//! | GDN dt_bias                     | softplus^-1 of exp U(ln 0.001, ln 0.1) (transformers')    |
//! | expert q4 codes                 | N(0, 3.3^2) rounded, in [-8, 7]: what q4 of a normal group of 32 gives |
//! | expert q8 codes                 | N(0, 42^2) rounded, in [-127, 127]                        |
//! | expert group scales             | +-(std / code std) x U(0.8, 1.2), rounded to f16          |

use moescope_kernels::Format;
use moescope_kernels::quant::f32_to_bf16;
use rayon::prelude::*;

use crate::convert::source::TensorSource;
use crate::convert::{BlobSource, ConvertError, plan};
use crate::model_config::ModelConfig;
use crate::package::layout::ExpertRegion;
use crate::rng::Rng;

/// Standard deviation of the matrices (the usual initializer range of Qwen configs).
pub const WEIGHT_STD: f32 = 0.02;

/// Standard deviation of matrix `name` of a model of `layers` layers: [`WEIGHT_STD`], over
/// sqrt(2 layers) for the token mixers' output projections.
pub fn matrix_std(name: &str, layers: usize) -> f32 {
    let out = ["self_attn.o_proj.weight", "linear_attn.out_proj.weight"].iter().any(|s| name.ends_with(s));
    if out { WEIGHT_STD / ((2 * layers.max(1)) as f32).sqrt() } else { WEIGHT_STD }
}
/// Router logits' standard deviation for a unit-RMS input.
pub const ROUTER_LOGIT_STD: f32 = 2.5;
/// Standard deviation of the q4 codes: a normal group of 32 quantized with its largest
/// magnitude at -8 (E|max| of 32 normals ~ 2.4 sigma) has codes of std 8 / 2.4.
const Q4_CODE_STD: f64 = 3.3;
const Q8_CODE_STD: f64 = 42.0;

/// The weight distributions in words, for the package's metadata.
pub fn description() -> String {
    format!(
        "seeded random: matrices N(0, {WEIGHT_STD}^2), norms 1, biases N(0, {WEIGHT_STD}^2), router logits of std {ROUTER_LOGIT_STD}; experts drawn as q4/q8/MXFP4 codes of a discretized normal with f16-exact group scales or power-of-two block scales (see src/synth/weights.rs)"
    )
}

/// A seed for one stream of numbers: the run's seed mixed with a tensor and a row.
fn stream_seed(seed: u64, a: u64, b: u64) -> u64 {
    let mut h = seed ^ 0x5851_F42D_4C95_7F2D;
    for v in [a, b] {
        h = (h ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 29;
    }
    h
}

/// FNV-1a of a tensor name.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Normal(0, 1) pairs by Box-Muller.
fn fill_normal(rng: &mut Rng, std: f32, out: &mut [f32]) {
    for pair in out.chunks_mut(2) {
        let u1 = rng.next_f64().max(1e-300);
        let u2 = rng.next_f64();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        pair[0] = (r * t.cos()) as f32 * std;
        if let Some(x) = pair.get_mut(1) {
            *x = (r * t.sin()) as f32 * std;
        }
    }
}

/// How a dense tensor's values are drawn, by its name.
enum Dist {
    Const(f32),
    Normal(f32),
    /// ln U(lo, hi)
    LnUniform(f32, f32),
    /// softplus^-1(exp U(ln lo, ln hi))
    DtBias(f32, f32),
}

fn dist_of(name: &str, kind: plan::Kind, c: &ModelConfig) -> Dist {
    let h = c.hidden_size as f32;
    let conv = c.hybrid.as_ref().map_or(4, |hy| hy.conv_kernel) as f32;
    if name.ends_with("A_log") {
        Dist::LnUniform(1.0, 16.0)
    } else if name.ends_with("dt_bias") {
        Dist::DtBias(0.001, 0.1)
    } else if name.ends_with("conv1d.weight") {
        Dist::Normal(1.0 / conv.sqrt())
    } else if name.ends_with("shared_expert_gate.weight") {
        Dist::Normal(1.0 / h.sqrt())
    } else if name.ends_with(".bias") {
        // gpt-oss's projection, router and expert biases
        Dist::Normal(WEIGHT_STD)
    } else if name.ends_with("self_attn.sinks") {
        Dist::Const(0.0)
    } else {
        match kind {
            plan::Kind::Norm | plan::Kind::Exact => Dist::Const(1.0),
            plan::Kind::Router => Dist::Normal(ROUTER_LOGIT_STD / h.sqrt()),
            _ => Dist::Normal(matrix_std(name, c.num_hidden_layers)),
        }
    }
}

/// The dense tensors of a synthetic model as a converter source (the expert tensors are
/// described too, for the converter's shape check, but drawn by [`SynthBlobs`]).
pub struct SynthSource {
    cfg: ModelConfig,
    seed: u64,
    dense: Vec<plan::DenseTensor>,
    codes: Codes,
}

impl SynthSource {
    pub fn new(cfg: &ModelConfig, seed: u64) -> SynthSource {
        SynthSource { cfg: cfg.clone(), seed, dense: plan::dense_tensors(cfg), codes: Codes::new() }
    }

    fn tensor(&self, name: &str) -> Option<&plan::DenseTensor> {
        self.dense.iter().find(|t| t.name == name)
    }

    fn expert_shape(&self, name: &str) -> Option<Vec<usize>> {
        let (h, i) = (self.cfg.hidden_size, self.cfg.moe_intermediate_size);
        let part = name.split(".mlp.experts.").nth(1)?.split_once('.')?.1;
        match part {
            "gate_proj.weight" | "up_proj.weight" => Some(vec![i, h]),
            "down_proj.weight" => Some(vec![h, i]),
            _ => None,
        }
    }
}

impl TensorSource for SynthSource {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensor(name).map(|t| t.shape.clone()).or_else(|| self.expert_shape(name))
    }

    fn read_rows(&self, name: &str, r0: usize, n: usize, out: &mut Vec<f32>) -> Result<(), ConvertError> {
        let t = self.tensor(name).ok_or_else(|| ConvertError::Tensor {
            file: "synthetic".into(),
            name: name.into(),
            msg: "expert tensors are drawn as blobs, not rows".into(),
        })?;
        let cols = if t.shape.len() == 2 { t.shape[1] } else { t.shape.iter().product() };
        let dist = dist_of(name, t.kind, &self.cfg);
        let id = name_hash(name);
        out.clear();
        out.resize(n * cols, 0.0);
        out.par_chunks_mut(cols).enumerate().for_each(|(i, row)| {
            let mut rng = Rng::new(stream_seed(self.seed, id, (r0 + i) as u64));
            match dist {
                Dist::Const(v) => row.fill(v),
                Dist::Normal(s) => fill_normal(&mut rng, s, row),
                Dist::LnUniform(lo, hi) => {
                    row.iter_mut().for_each(|x| *x = (lo + (hi - lo) * rng.next_f64() as f32).ln())
                }
                Dist::DtBias(lo, hi) => row.iter_mut().for_each(|x| {
                    let dt = (lo.ln() + (hi.ln() - lo.ln()) * rng.next_f64() as f32).exp();
                    // softplus^-1(dt) = dt + ln(1 - e^-dt)
                    *x = dt + (-(-dt).exp_m1()).ln();
                }),
            }
        });
        Ok(())
    }

    /// N(0, 0.02) matrices in q4 / q8 are drawn as codes, a row per stream (at disk speed;
    /// through f32 and the quantizers they take ~10x longer).
    fn encoded_rows(
        &self,
        name: &str,
        f: Format,
        r0: usize,
        n: usize,
        vals: &mut Vec<u8>,
        scales: &mut Vec<f32>,
        mins: Option<&mut Vec<f32>>,
    ) -> Result<bool, ConvertError> {
        let Some(t) = self.tensor(name).filter(|_| mins.is_none()) else { return Ok(false) };
        let (Dist::Normal(std), [_, cols], Some(g)) = (dist_of(name, t.kind, &self.cfg), t.shape.as_slice(), f.group())
        else {
            return Ok(false);
        };
        if !matches!(f, Format::Q4 { .. } | Format::Q8 { .. }) {
            return Ok(false);
        }
        let (rb, sg) = (f.data_bytes(1, *cols), cols / g);
        vals.clear();
        vals.resize(n * rb, 0);
        scales.clear();
        scales.resize(n * sg, 0.0);
        let id = name_hash(name);
        vals.par_chunks_mut(rb).zip(scales.par_chunks_mut(sg)).enumerate().for_each(|(i, (v, s))| {
            let mut rng = Rng::new(stream_seed(self.seed, id, (r0 + i) as u64));
            self.codes.draw(f, &mut rng, std, v, s);
        });
        Ok(true)
    }

    fn origin(&self, _name: &str) -> String {
        "synthetic".into()
    }

    fn source_name(&self, name: &str) -> String {
        name.into()
    }
}

/// The standard normal CDF (Abramowitz & Stegun 7.1.26 for erf: error < 1.5e-7).
fn normal_cdf(z: f64) -> f64 {
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly =
        t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-x * x).exp();
    if z >= 0.0 { 0.5 * (1.0 + erf) } else { 0.5 * (1.0 - erf) }
}

/// 256 codes in `[lo, hi]` whose frequencies are N(0, std^2) rounded to integers (the tails
/// clamped into the end codes): a random byte indexes a code of that distribution.
pub fn code_table(std: f64, lo: i32, hi: i32) -> [i32; 256] {
    let mass = |q: i32| {
        let a = if q == lo { 0.0 } else { normal_cdf((q as f64 - 0.5) / std) };
        let b = if q == hi { 1.0 } else { normal_cdf((q as f64 + 0.5) / std) };
        b - a
    };
    // largest remainder, so the counts sum to 256 exactly
    let exact: Vec<(i32, f64)> = (lo..=hi).map(|q| (q, mass(q) * 256.0)).collect();
    let mut counts: Vec<(i32, usize, f64)> =
        exact.iter().map(|&(q, m)| (q, m.floor() as usize, m - m.floor())).collect();
    let short = 256 - counts.iter().map(|c| c.1).sum::<usize>();
    let mut by_rest: Vec<usize> = (0..counts.len()).collect();
    by_rest.sort_by(|&a, &b| counts[b].2.total_cmp(&counts[a].2).then(a.cmp(&b)));
    for &i in by_rest.iter().take(short) {
        counts[i].1 += 1;
    }
    let mut t = [0i32; 256];
    let mut at = 0;
    for (q, n, _) in counts {
        t[at..at + n].fill(q);
        at += n;
    }
    t
}

/// Lookup tables from a random byte to a q4 code (biased by 8), a q8 code and an MXFP4 code.
struct Codes {
    q4: [u8; 256],
    q8: [i8; 256],
    mx: [u8; 256],
}

/// Standard deviation of the MXFP4 values in units of the block scale: a normal block of 32
/// with its largest magnitude (~2.4 sigma) near 4.
const MX_VALUE_STD: f64 = 1.7;

impl Codes {
    fn new() -> Codes {
        let (t4, t8) = (code_table(Q4_CODE_STD, -8, 7), code_table(Q8_CODE_STD, -127, 127));
        // the e2m1 code of each of 256 equiprobable points of N(0, MX_VALUE_STD)
        let mx = std::array::from_fn(|j| {
            let u = (j as f64 + 0.5) / 256.0;
            let (mut lo, mut hi) = (-10.0, 10.0);
            for _ in 0..60 {
                let mid = 0.5 * (lo + hi);
                if normal_cdf(mid) < u { lo = mid } else { hi = mid }
            }
            let mut b = [0u8; moescope_kernels::mxfp4::BLOCK_BYTES];
            let mut x = [0f32; 32];
            x[0] = (0.5 * (lo + hi) * MX_VALUE_STD) as f32;
            x[1] = 4.0; // pins the block's scale at 1
            moescope_kernels::mxfp4::quantize_row(&x, &mut b);
            b[1] & 0x0F
        });
        Codes { q4: t4.map(|q| (q + 8) as u8), q8: t8.map(|q| q as i8), mx }
    }

    /// MXFP4 blocks into `vals` (17 bytes each): codes from the table, and exponents that put
    /// the values' standard deviation near `std` (one of two neighbouring powers of two).
    fn draw_mxfp4(&self, rng: &mut Rng, std: f32, vals: &mut [u8]) {
        let e0 = (std as f64 / MX_VALUE_STD).log2().floor() as i32 + 127;
        for b in vals.chunks_exact_mut(moescope_kernels::mxfp4::BLOCK_BYTES) {
            let r = rng.next_u64().to_le_bytes();
            b[0] = (e0 + i32::from(r[7] & 1)).clamp(1, 254) as u8;
            for eight in b[1..].chunks_exact_mut(8) {
                let (lo, hi) = (rng.next_u64().to_le_bytes(), rng.next_u64().to_le_bytes());
                for (j, byte) in eight.iter_mut().enumerate() {
                    *byte = self.mx[lo[j] as usize] | (self.mx[hi[j] as usize] << 4);
                }
            }
        }
    }

    /// Codes of format `f` into `vals` and their group scales into `scales` (sized by the
    /// caller), or None for a format not drawn as codes. Values are independent draws, so the
    /// stored row order (interleaved or not) does not change what they are.
    fn draw(&self, f: Format, rng: &mut Rng, std: f32, vals: &mut [u8], scales: &mut [f32]) -> Option<()> {
        let code_std = match f {
            Format::Q4 { .. } => {
                // two codes per byte, low nibble first
                for chunk in vals.chunks_mut(4) {
                    let r = rng.next_u64().to_le_bytes();
                    for (j, b) in chunk.iter_mut().enumerate() {
                        *b = self.q4[r[2 * j] as usize] | (self.q4[r[2 * j + 1] as usize] << 4);
                    }
                }
                Q4_CODE_STD
            }
            Format::Q8 { .. } => {
                for chunk in vals.chunks_mut(8) {
                    let r = rng.next_u64().to_le_bytes();
                    for (b, &x) in chunk.iter_mut().zip(&r) {
                        *b = self.q8[x as usize] as u8;
                    }
                }
                Q8_CODE_STD
            }
            _ => return None,
        };
        fill_scales(rng, std as f64 / code_std, scales);
        Some(())
    }
}

/// Expert blobs drawn in their stored formats.
pub struct SynthBlobs {
    seed: u64,
    layers: usize,
    codes: Codes,
}

impl SynthBlobs {
    pub fn new(cfg: &ModelConfig, seed: u64) -> SynthBlobs {
        SynthBlobs { seed, layers: cfg.num_hidden_layers, codes: Codes::new() }
    }
}

/// Group scales: +-base x U(0.8, 1.2), exact f16 values.
fn fill_scales(rng: &mut Rng, base: f64, out: &mut [f32]) {
    for s in out {
        let r = rng.next_u64();
        let mag = base * (0.8 + 0.4 * (r >> 11) as f64 / (1u64 << 53) as f64);
        let v = if r & 1 == 0 { mag } else { -mag };
        *s = half::f16::from_f64(v).to_f32();
    }
}

impl BlobSource for SynthBlobs {
    fn blob(&self, region: &ExpertRegion, layer: usize, expert: usize) -> Result<Vec<u8>, ConvertError> {
        let li = region.index_of(layer).ok_or_else(|| crate::convert::no_experts_in(layer))?;
        let mut buf = vec![0u8; region.len_of(li) as usize];
        let mut rng = Rng::new(stream_seed(self.seed, 0xE4_0000 + layer as u64, expert as u64));
        let mut scales = Vec::new();
        for part in region.parts_of(li) {
            let f = part.format().unwrap_or(Format::F32);
            let (rows, cols) = part.rows_cols();
            let at = part.offset as usize;
            let vals = &mut buf[at..at + f.data_bytes(rows, cols)];
            let std = matrix_std(&part.name, self.layers);
            if f == Format::Mxfp4 {
                self.codes.draw_mxfp4(&mut rng, std, vals);
                continue;
            }
            if f == Format::Bf16 {
                let mut x = vec![0f32; rows * cols];
                fill_normal(&mut rng, std, &mut x);
                for (b, v) in vals.chunks_exact_mut(2).zip(&x) {
                    b.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
                }
                continue;
            }
            scales.resize(f.group().map_or(0, |g| rows * cols / g), 0.0);
            self.codes.draw(f, &mut rng, std, vals, &mut scales).ok_or_else(|| ConvertError::Tensor {
                file: "synthetic".into(),
                name: part.name.clone(),
                msg: format!("experts in {} are not drawn directly", f.name()),
            })?;
            if let Some(so) = part.scales_offset {
                let so = so as usize;
                buf[so..so + scales.len() * 4].copy_from_slice(bytemuck::cast_slice(&scales));
            }
        }
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_matches_tabulated_values() {
        // standard normal table values
        for (z, p) in [(0.0, 0.5), (1.0, 0.841_344_7), (-1.96, 0.024_997_9), (2.5, 0.993_790_3)] {
            assert!((normal_cdf(z) - p).abs() < 2e-7, "Phi({z})");
        }
    }

    #[test]
    fn code_tables_have_the_asked_spread() {
        let t = code_table(Q4_CODE_STD, -8, 7);
        let mean = t.iter().sum::<i32>() as f64 / 256.0;
        let var = t.iter().map(|&q| (q as f64 - mean).powi(2)).sum::<f64>() / 256.0;
        assert!(mean.abs() < 0.05, "mean {mean}");
        // clamping the tails and rounding to 1/256 move the spread by a few percent
        assert!((var.sqrt() - Q4_CODE_STD).abs() / Q4_CODE_STD < 0.05, "std {}", var.sqrt());
        assert!(t.windows(2).all(|w| w[0] <= w[1]) && t[0] == -8 && t[255] == 7);
    }
}
