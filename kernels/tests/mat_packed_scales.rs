//! Matrices with packed scales against the file's values (ggml's dequantizer) and against the
//! Q4, Q6 or Q8 matrix with f32 scales (and mins) that each stands for: the same products bit for
//! bit at every tier, row order and batch. Q4_K and Q6_K at their own size (`MatData::Q4K`: q4
//! codes and a k4 record per 256 values; `MatData::Q6K`: q6 codes and a k6 record), Q8_0 and
//! Q4_0 at theirs (`MatData::Q8F16`, `MatData::Q4F16`: the codes and an f16 scale per 32), Q4_1
//! (`MatData::Q4F16` with mins: an f16 scale and min per 32).

use half::f16;
use moescope_kernels::Isa;
use moescope_kernels::act::QuantAct;
use moescope_kernels::ggml::{BlockType, dequantize};
use moescope_kernels::kscales::k4_encode;
use moescope_kernels::mat::{Input, Mat, MatData};
use moescope_kernels::quant::{Q6_CHUNK_BYTES, interleave_rows, panel_rows, put_q6};

/// A 64-bit LCG's next value.
fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *s >> 33
}

/// A random K-quant matrix's parts: ggml's blocks, moescope's codes (row-major), records, and
/// f32 scales and mins per group.
struct KParts {
    blocks: Vec<u8>,
    q: Vec<u8>,
    k: Vec<u8>,
    sc: Vec<f32>,
    mn: Vec<f32>,
}

/// A random Q4_K matrix: q4_lohi32 codes, k4 records, f32 scales and mins as `d * sc` and
/// `dmin * m` per group of 32.
fn random_q4k(rows: usize, cols: usize, seed: u64) -> KParts {
    let mut s = seed;
    let (mut blocks, mut q, mut k, mut sc, mut mn) = (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..rows * cols / 256 {
        let d = f16::from_f32((next(&mut s) % 1000) as f32 * 1e-5 + 1e-4);
        let dmin = f16::from_f32((next(&mut s) % 1000) as f32 * 1e-5);
        let scs: [u8; 8] = std::array::from_fn(|_| (next(&mut s) % 64) as u8);
        let ms: [u8; 8] = std::array::from_fn(|_| (next(&mut s) % 64) as u8);
        let codes: Vec<u8> = (0..256).map(|_| (next(&mut s) % 16) as u8).collect();
        let rec = k4_encode(d, dmin, &scs, &ms);
        // ggml's block: the record, then per 64 values 32 bytes (low nibbles the first 32)
        blocks.extend_from_slice(&rec);
        for g in 0..4 {
            blocks.extend((0..32).map(|l| codes[64 * g + l] | codes[64 * g + 32 + l] << 4));
        }
        k.extend_from_slice(&rec);
        // q4_lohi32: per group of 32, byte j holds value j and value j + 16
        for j in 0..8 {
            q.extend((0..16).map(|l| codes[32 * j + l] | codes[32 * j + l + 16] << 4));
            sc.push(d.to_f32() * scs[j] as f32);
            mn.push(dmin.to_f32() * ms[j] as f32);
        }
    }
    KParts { blocks, q, k, sc, mn }
}

/// A random Q6_K matrix: (ggml blocks, q6_lo4hi2 codes row-major, k6 records, f32 scales as
/// `d * sc` per group of 16). The codes come from ggml's dequantizer run on each block with its
/// scales and `d` set to 1.
fn random_q6k(rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<f32>) {
    let mut s = seed;
    let (mut blocks, mut k, mut sc) = (vec![], vec![], vec![]);
    let mut q = vec![0u8; rows * cols / 128 * Q6_CHUNK_BYTES];
    let mut unit_vals = [0f32; 256];
    for b in 0..rows * cols / 256 {
        let mut block: Vec<u8> = (0..192).map(|_| next(&mut s) as u8).collect();
        let scales: Vec<u8> = (0..16).map(|_| next(&mut s) as u8).collect();
        let d = f16::from_f32((next(&mut s) % 1000) as f32 * 1e-5 + 1e-5);
        let mut unit = block.clone();
        unit.extend([1u8; 16]);
        unit.extend(f16::ONE.to_le_bytes());
        dequantize(BlockType::Q6K, &unit, &mut unit_vals);
        for (j, v) in unit_vals.iter().enumerate() {
            put_q6(&mut q, 256 * b + j, (*v as i32 + 32) as u8);
        }
        block.extend(&scales);
        block.extend(d.to_le_bytes());
        blocks.extend(&block);
        k.extend(d.to_le_bytes());
        k.extend(&scales);
        sc.extend(scales.iter().map(|&x| d.to_f32() * x as i8 as f32));
    }
    (blocks, q, k, sc)
}

#[test]
fn q4k_records_give_the_files_values_and_the_f32_scales_products() {
    for (rows, cols, seed) in [(16, 256, 1), (32, 2304, 2), (16, 4096, 3)] {
        let KParts { blocks, q, k, sc, mn } = random_q4k(rows, cols, seed);
        let mut file = vec![0f32; rows * cols];
        dequantize(BlockType::Q4K, &blocks, &mut file);
        for ((x4, panels), qb) in row_orders(q, cols / 2, 64) {
            let qb = &qb[..];
            let kmat = Mat { rows, cols, data: MatData::Q4K { q: qb, k: &k, x4, panels } };
            let data = MatData::Q4 { q: qb, scales: &sc, group: 32, x4, panels, lanes: false, mins: Some(&mn) };
            let fmat = Mat { rows, cols, data };
            same_values(&kmat, &file);
            same_products(&kmat, &fmat, 32, seed);
        }
    }
}

#[test]
fn q6k_records_give_the_files_values_and_the_f32_scales_products() {
    for (rows, cols, seed) in [(16, 256, 4), (32, 2304, 5)] {
        let (blocks, q, k, sc) = random_q6k(rows, cols, seed);
        let mut file = vec![0f32; rows * cols];
        dequantize(BlockType::Q6K, &blocks, &mut file);
        for ((x4, panels), qb) in row_orders(q, cols / 128 * Q6_CHUNK_BYTES, Q6_CHUNK_BYTES) {
            let qb = &qb[..];
            let kmat = Mat { rows, cols, data: MatData::Q6K { q: qb, k: &k, x4, panels } };
            let fmat = Mat { rows, cols, data: MatData::Q6 { q: qb, scales: &sc, group: 16, x4, panels } };
            same_values(&kmat, &file);
            same_products(&kmat, &fmat, 16, seed);
        }
    }
}

/// A random Q8_0 (or, with `four`, Q4_0) matrix: ggml's blocks, moescope's codes (q8 bytes, or
/// q4_lohi32 nibbles: Q4_0's own 16 bytes a block), the f16 scales' bits and the same as f32.
fn random_32s(rows: usize, cols: usize, four: bool, seed: u64) -> (Vec<u8>, Vec<u8>, Vec<u16>, Vec<f32>) {
    let mut s = seed;
    let (mut blocks, mut q, mut h, mut sc) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rows * cols / 32 {
        // scales over many binades, subnormals included, and of either sign
        let d = f16::from_bits((next(&mut s) % 0x7C00) as u16 | (next(&mut s) as u16 & 0x8000));
        let codes: Vec<u8> = (0..if four { 16 } else { 32 }).map(|_| next(&mut s) as u8).collect();
        blocks.extend(d.to_le_bytes());
        blocks.extend(&codes);
        q.extend(&codes);
        h.push(d.to_bits());
        sc.push(d.to_f32());
    }
    (blocks, q, h, sc)
}

#[test]
fn q8_0_f16_scales_give_the_files_values_and_the_f32_scales_products() {
    // 40 rows: blocks of 32 rows and a piece across their boundary
    for (rows, cols, seed) in [(40, 256, 6), (40, 2048, 7)] {
        let (blocks, q, h, sc) = random_32s(rows, cols, false, seed);
        let mut file = vec![0f32; rows * cols];
        dequantize(BlockType::Q8_0, &blocks, &mut file);
        let q: Vec<i8> = q.iter().map(|&b| b as i8).collect();
        let hmat = Mat { rows, cols, data: MatData::Q8F16 { q: &q, scales: &h, group: 32 } };
        let fmat = Mat { rows, cols, data: MatData::Q8 { q: &q, scales: &sc, group: 32, mins: None } };
        same_values(&hmat, &file);
        same_products(&hmat, &fmat, 32, seed);
    }
}

#[test]
fn q4_0_f16_scales_give_the_files_values_and_the_f32_scales_products() {
    for (rows, cols, seed) in [(48, 256, 8), (48, 4096, 9)] {
        let (blocks, q, h, sc) = random_32s(rows, cols, true, seed);
        let mut file = vec![0f32; rows * cols];
        dequantize(BlockType::Q4_0, &blocks, &mut file);
        for ((x4, panels), qb) in row_orders(q, cols / 2, 64) {
            let qb = &qb[..];
            let data = MatData::Q4F16 { q: qb, scales: &h, group: 32, x4, panels, lanes: false, mins: false };
            let hmat = Mat { rows, cols, data };
            let data = MatData::Q4 { q: qb, scales: &sc, group: 32, x4, panels, lanes: false, mins: None };
            let fmat = Mat { rows, cols, data };
            same_values(&hmat, &file);
            same_products(&hmat, &fmat, 32, seed);
        }
    }
}

/// A random Q4_1 matrix: ggml's blocks (`d`, `m`, nibbles), the q4_lohi32 codes (the blocks' 16
/// bytes), each row's f16 scales then its mins (`-m`), and the same as f32 scales and mins.
#[allow(clippy::type_complexity)]
fn random_q4_1(rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<u8>, Vec<u16>, Vec<f32>, Vec<f32>) {
    let mut s = seed;
    let (mut blocks, mut q, mut h, mut sc, mut mn) = (vec![], vec![], vec![], vec![], vec![]);
    let half = |s: &mut u64| f16::from_bits((next(s) % 0x7C00) as u16 | (next(s) as u16 & 0x8000));
    for _ in 0..rows {
        let (mut ds, mut ms) = (vec![], vec![]);
        for _ in 0..cols / 32 {
            let (d, m) = (half(&mut s), half(&mut s));
            let codes: Vec<u8> = (0..16).map(|_| next(&mut s) as u8).collect();
            blocks.extend(d.to_le_bytes());
            blocks.extend(m.to_le_bytes());
            blocks.extend(&codes);
            q.extend(&codes);
            ds.push(d);
            ms.push(-m);
        }
        h.extend(ds.iter().chain(&ms).map(|x| x.to_bits()));
        sc.extend(ds.iter().map(|x| x.to_f32()));
        mn.extend(ms.iter().map(|x| x.to_f32()));
    }
    (blocks, q, h, sc, mn)
}

#[test]
fn q4_1_f16_scales_and_mins_give_the_files_values_and_the_f32_products() {
    for (rows, cols, seed) in [(48, 256, 10), (48, 4096, 11)] {
        let (blocks, q, h, sc, mn) = random_q4_1(rows, cols, seed);
        let mut file = vec![0f32; rows * cols];
        dequantize(BlockType::Q4_1, &blocks, &mut file);
        for ((x4, panels), qb) in row_orders(q, cols / 2, 64) {
            let qb = &qb[..];
            let data = MatData::Q4F16 { q: qb, scales: &h, group: 32, x4, panels, lanes: false, mins: true };
            let hmat = Mat { rows, cols, data };
            let data = MatData::Q4 { q: qb, scales: &sc, group: 32, x4, panels, lanes: false, mins: Some(&mn) };
            let fmat = Mat { rows, cols, data };
            same_values(&hmat, &file);
            same_products(&hmat, &fmat, 32, seed);
        }
    }
}

/// `kmat`'s products equal `fmat`'s bit for bit, at every tier, over 1 to 9 tokens, for all rows
/// and for a piece not starting on a block.
fn same_products(kmat: &Mat<'_>, fmat: &Mat<'_>, group: usize, seed: u64) {
    let (rows, cols) = (kmat.rows, kmat.cols);
    let mut rng = seed;
    for n in [1, 2, 3, 4, 5, 9] {
        let x: Vec<f32> = (0..n * cols).map(|_| (next(&mut rng) % 2001) as f32 / 1000.0 - 1.0).collect();
        for isa in Isa::available() {
            let mut qa = QuantAct::default();
            qa.quantize(&x, cols, group, isa);
            for part in [0..rows, 5..rows - 2] {
                let (mut got, mut want) = (vec![0f32; part.len() * n], vec![0f32; part.len() * n]);
                kmat.matmul_rows(isa, Input::Quant(&qa), n, part.clone(), &mut got);
                fmat.matmul_rows(isa, Input::Quant(&qa), n, part.clone(), &mut want);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "{isa} {:?} n {n} rows {part:?}: product {i}: {g} vs {w}",
                        kmat.format()
                    );
                }
            }
        }
    }
}

/// Row-major codes `q` (rows of `rb` bytes, chunks of `cb`) in the three row orders, each with
/// its flags (x4, panels): row-major, x4 interleaved, panel-major.
fn row_orders(q: Vec<u8>, rb: usize, cb: usize) -> [((bool, bool), Vec<u8>); 3] {
    let (mut x4, mut pan) = (vec![0u8; q.len()], vec![0u8; q.len()]);
    interleave_rows(&q, rb, cb, &mut x4);
    panel_rows(&x4, rb, cb, &mut pan);
    [((false, false), q), ((true, false), x4), ((true, true), pan)]
}

/// Every row `kmat` dequantizes equals `file` (ggml's values) bit for bit.
fn same_values(kmat: &Mat<'_>, file: &[f32]) {
    let (rows, cols) = (kmat.rows, kmat.cols);
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        kmat.dequant_row(r, &mut row);
        for (j, v) in row.iter().enumerate() {
            assert_eq!(v.to_bits(), file[r * cols + j].to_bits(), "{:?} row {r} value {j}", kmat.data);
        }
    }
}
