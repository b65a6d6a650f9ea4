//! DeepSeek-V3's latent keys and values expanded for one head, the form a prompt's attention
//! can run in: `out[d, p] = Σ_i w[i, d] c[i, p]` for every cached position `p` of the
//! compressed kv `c` (as the KV cache keeps it: blocks of [`KEY_BLOCK`] positions, `[dims,
//! KEY_BLOCK]` each, the first `r` dims the compressed kv) and a head's up-projection `w`
//! (`[r, n]`: its key part `W_UK_h` transposed, or its value part `W_UV_h` transposed), into
//! blocks of the same layout (`[out_dims, KEY_BLOCK]`, the first `n` dims written).
//!
//! Each output is one chain of fused multiply-adds over `i` in order, whatever the tier, so the
//! AVX-512 path, the AVX2 path and the scalar one give the same bits. The weights are packed
//! once per head as `[n / J, r, J]`, so a pass over a block's kv reads them in order, while
//! `J x KEY_BLOCK` outputs stay in registers.

use super::KEY_BLOCK;
use crate::Isa;

/// Output dims one pass over a block's compressed kv computes (`J x KEY_BLOCK` accumulators:
/// 16 AVX-512 registers).
const J: usize = 4;

/// One head's up-projection `w` (`[r, n]`) packed for [`Expansion::apply`].
#[derive(Debug, Default, Clone)]
pub struct Expansion {
    /// `[n.div_ceil(J), r, J]`, zeros past `n`
    w: Vec<f32>,
    r: usize,
    n: usize,
}

impl Expansion {
    /// `w[i, ..]` from `row(i, out)` (`out`: `[n]`), for `i` in `0..r`: a matrix stored `[r, n]`
    /// (k_b_proj's rows of one head). `buf` is scratch.
    pub fn set_rows(&mut self, shape: (usize, usize), buf: &mut Vec<f32>, row: impl FnMut(usize, &mut [f32])) {
        self.fill(shape, true, buf, row);
    }

    /// `w[.., j]` from `col(j, out)` (`out`: `[r]`), for `j` in `0..n`: a matrix stored `[n, r]`
    /// (v_b_proj's rows of one head). `buf` is scratch.
    pub fn set_cols(&mut self, shape: (usize, usize), buf: &mut Vec<f32>, col: impl FnMut(usize, &mut [f32])) {
        self.fill(shape, false, buf, col);
    }

    /// `w` packed from the lines `read` gives: its rows (`by_rows`) or its columns.
    fn fill(
        &mut self,
        (r, n): (usize, usize),
        by_rows: bool,
        buf: &mut Vec<f32>,
        mut read: impl FnMut(usize, &mut [f32]),
    ) {
        (self.r, self.n) = (r, n);
        self.w.clear();
        self.w.resize(n.div_ceil(J) * r * J, 0.0);
        let (lines, len) = if by_rows { (r, n) } else { (n, r) };
        buf.resize(len, 0.0);
        for a in 0..lines {
            read(a, buf);
            for (b, &x) in buf.iter().enumerate() {
                let (i, j) = if by_rows { (a, b) } else { (b, a) };
                self.w[(j / J * r + i) * J + j % J] = x;
            }
        }
    }

    /// Every block of `c` (`[blocks, c_dims, KEY_BLOCK]`, `c_dims >= r`) expanded into the same
    /// block of `out` (`[blocks, out_dims, KEY_BLOCK]`, `out_dims >= n`; dims `n..` untouched).
    pub fn apply(&self, isa: Isa, (c, c_dims): (&[f32], usize), (out, out_dims): (&mut [f32], usize)) {
        assert!(c_dims >= self.r && out_dims >= self.n, "expansion of {} into {} dims", self.r, self.n);
        let blocks = c.len() / (c_dims * KEY_BLOCK);
        assert!(out.len() >= blocks * out_dims * KEY_BLOCK, "output of {} floats for {blocks} blocks", out.len());
        for b in 0..blocks {
            let cb = &c[b * c_dims * KEY_BLOCK..][..self.r * KEY_BLOCK];
            let ob = &mut out[b * out_dims * KEY_BLOCK..][..self.n * KEY_BLOCK];
            #[cfg(target_arch = "x86_64")]
            {
                if isa >= Isa::Avx512 {
                    // SAFETY: the tier says AVX-512 F is present; the slices are sized above
                    unsafe { block_avx512(&self.w, self.r, cb, ob) };
                    continue;
                }
                if isa.has_avx2() {
                    // SAFETY: the tier says AVX2 and FMA are present
                    unsafe { block_avx2(&self.w, self.r, cb, ob) };
                    continue;
                }
            }
            block_body(&self.w, self.r, cb, ob);
        }
    }
}

/// One block: `ob[d, p] = Σ_i w[i, d] cb[i, p]` (`cb`: `[r, KEY_BLOCK]`, `ob`: `[n, KEY_BLOCK]`),
/// each a chain of fused multiply-adds from 0 over `i` in order.
#[inline(always)]
fn block_body(w: &[f32], r: usize, cb: &[f32], ob: &mut [f32]) {
    let n = ob.len() / KEY_BLOCK;
    for (jt, wt) in w.chunks_exact(r * J).enumerate() {
        let mut acc = [[0f32; KEY_BLOCK]; J];
        for (i, (wi, ci)) in wt.chunks_exact(J).zip(cb.chunks_exact(KEY_BLOCK)).enumerate() {
            debug_assert!(i < r);
            for (a, &wv) in acc.iter_mut().zip(wi) {
                for (a, &cv) in a.iter_mut().zip(ci) {
                    *a = wv.mul_add(cv, *a);
                }
            }
        }
        for (jj, a) in acc.iter().enumerate().take(n.saturating_sub(jt * J)) {
            ob[(jt * J + jj) * KEY_BLOCK..][..KEY_BLOCK].copy_from_slice(a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(w: &[f32], r: usize, cb: &[f32], ob: &mut [f32]) {
    block_body(w, r, cb, ob)
}

/// [`block_body`] with its `J x KEY_BLOCK` accumulators in registers: per kv dim, the block's
/// four vectors of positions loaded once and each weight broadcast once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn block_avx512(w: &[f32], r: usize, cb: &[f32], ob: &mut [f32]) {
    use std::arch::x86_64::*;
    const V: usize = KEY_BLOCK / 16;
    let n = ob.len() / KEY_BLOCK;
    debug_assert!(cb.len() >= r * KEY_BLOCK && w.len() >= n.div_ceil(J) * r * J);
    for jt in 0..n.div_ceil(J) {
        let wt = &w[jt * r * J..(jt + 1) * r * J];
        let mut acc = [[_mm512_setzero_ps(); V]; J];
        for i in 0..r {
            // SAFETY: kv dim i of the block holds KEY_BLOCK positions
            let cv: [__m512; V] =
                std::array::from_fn(|u| unsafe { _mm512_loadu_ps(cb.as_ptr().add(i * KEY_BLOCK + u * 16)) });
            for (jj, acc) in acc.iter_mut().enumerate() {
                let wv = _mm512_set1_ps(wt[i * J + jj]);
                for (a, &c) in acc.iter_mut().zip(&cv) {
                    *a = _mm512_fmadd_ps(wv, c, *a);
                }
            }
        }
        for (jj, acc) in acc.iter().enumerate().take(n - jt * J) {
            for (u, &a) in acc.iter().enumerate() {
                // SAFETY: output dim jt J + jj < n holds KEY_BLOCK positions
                unsafe { _mm512_storeu_ps(ob.as_mut_ptr().add((jt * J + jj) * KEY_BLOCK + u * 16), a) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::uniform;

    /// `r` kv dims, `n` outputs, `blocks` blocks of `c_dims` dims; `w` as `[r, n]`.
    fn case(r: usize, n: usize, c_dims: usize, blocks: usize) -> (Vec<f32>, Vec<f32>) {
        let mut u = uniform((r * 31 + n) as u64);
        let w: Vec<f32> = (0..r * n).map(|_| u()).collect();
        let c: Vec<f32> = (0..blocks * c_dims * KEY_BLOCK).map(|_| u()).collect();
        (w, c)
    }

    #[test]
    fn every_tier_gives_the_fused_chains_bits_and_both_packings_agree() {
        // n not a multiple of J, c wider than r (the cache's rotary dims after the kv)
        for (r, n, c_dims, out_dims) in [(32, 16, 40, 24), (24, 6, 24, 7), (512, 128, 576, 192)] {
            let blocks = 2;
            let (w, c) = case(r, n, c_dims, blocks);
            let mut buf = Vec::new();
            let (mut by_rows, mut by_cols) = (Expansion::default(), Expansion::default());
            by_rows.set_rows((r, n), &mut buf, |i, out| out.copy_from_slice(&w[i * n..(i + 1) * n]));
            by_cols
                .set_cols((r, n), &mut buf, |j, out| out.iter_mut().enumerate().for_each(|(i, o)| *o = w[i * n + j]));
            // the scalar model: one fused chain per output, i in order; f64 for the bound
            let mut want = vec![-1f32; blocks * out_dims * KEY_BLOCK];
            let mut err = 0f64;
            for b in 0..blocks {
                for d in 0..n {
                    for p in 0..KEY_BLOCK {
                        let (mut s, mut e) = (0f32, 0f64);
                        for i in 0..r {
                            let (wv, cv) = (w[i * n + d], c[(b * c_dims + i) * KEY_BLOCK + p]);
                            s = wv.mul_add(cv, s);
                            e += wv as f64 * cv as f64;
                        }
                        want[(b * out_dims + d) * KEY_BLOCK + p] = s;
                        err = err.max((s as f64 - e).abs());
                    }
                }
            }
            assert!(err < r as f64 * 1e-7, "f32 chains {err} from the f64 sums");
            for isa in Isa::available() {
                for e in [&by_rows, &by_cols] {
                    let mut out = vec![-1f32; blocks * out_dims * KEY_BLOCK];
                    e.apply(isa, (&c, c_dims), (&mut out, out_dims));
                    assert!(out == want, "{isa} r {r} n {n}: differs from the fused chains");
                }
            }
        }
    }
}
