//! GGUF's K-quant scales as the file stores them, so a Q4_K matrix costs its 4.5 bits a weight
//! rather than the 6 of f32 scales and mins per 32 values, and a Q6_K one its 6.5625 rather than
//! the 8 of f32 scales per 16.
//!
//! A "k4" record is the first 16 bytes of ggml's `block_q4_K` (and `block_q5_K`): f16 `d`,
//! f16 `dmin`, then 12 bytes packing eight 6-bit scales `sc` and eight 6-bit mins `m`
//! ([`crate::ggml::k_scale_min`]). It covers a super-block of 256 values, eight groups of 32:
//! group `j`'s value is `d * sc_j * n - dmin * m_j` of its unsigned code `n`. A matrix keeps one
//! record per 256 values of each row, `[rows, cols / 256]` records row-major, beside its q4 codes
//! (`q4_lohi32`, groups of 32, as ever).
//!
//! `d * sc_j` is an f16 value (11 significant bits) times an integer below 64: exact in f32,
//! whatever computes it. So the kernels, which decode the records as they go, give the bits of
//! the same matrix with f32 scales `d * sc_j` and mins `dmin * m_j` (what the converter wrote
//! before), and those equal gguf-py's dequantized values.
//!
//! A "k6" record holds `block_q6_K`'s scales in another order: f16 `d`, then its 16 signed
//! 8-bit scales (the block keeps them after its codes, `d` last). It covers 256 values, sixteen
//! groups of 16 beside q6 codes: group `j`'s value is `d * sc_j * q`; `d * sc_j` is exact in f32
//! too (11 + 8 significant bits).

use half::f16;

/// Values a record covers.
pub const K_BLOCK: usize = 256;
/// Bytes of one k4 record.
pub const K4_RECORD: usize = 16;
/// Values per group (sub-block) of a k4 record.
pub const K4_GROUP: usize = 32;

/// Bytes of one k6 record.
pub const K6_RECORD: usize = 18;
/// Values per group of a k6 record.
pub const K6_GROUP: usize = 16;

/// Bytes of the k6 records of a `[rows, cols]` matrix (`cols` a multiple of [`K_BLOCK`]).
pub fn k6_bytes(rows: usize, cols: usize) -> usize {
    rows * cols / K_BLOCK * K6_RECORD
}

/// The sixteen scales of one k6 record, as f32.
pub fn k6_decode(rec: &[u8]) -> [f32; 16] {
    let d = f16::from_le_bytes([rec[0], rec[1]]).to_f32();
    std::array::from_fn(|j| d * rec[2 + j] as i8 as f32)
}

/// The k6 records of rows (whole rows, one after another) as f32 scales, `recs.len() / 18 * 16`.
pub fn k6_scales(recs: &[u8], scales: &mut [f32]) {
    for (rec, s) in recs.chunks_exact(K6_RECORD).zip(scales.chunks_exact_mut(16)) {
        s.copy_from_slice(&k6_decode(rec));
    }
}

/// Bytes of the k4 records of a `[rows, cols]` matrix (`cols` a multiple of [`K_BLOCK`]).
pub fn k4_bytes(rows: usize, cols: usize) -> usize {
    rows * cols / K_BLOCK * K4_RECORD
}

/// The eight scales and eight mins of one record, as f32.
pub fn k4_decode(rec: &[u8]) -> ([f32; 8], [f32; 8]) {
    let (d, dmin) = (f16::from_le_bytes([rec[0], rec[1]]).to_f32(), f16::from_le_bytes([rec[2], rec[3]]).to_f32());
    let (mut s, mut m) = ([0f32; 8], [0f32; 8]);
    for j in 0..8 {
        let (sc, mn) = crate::ggml::k_scale_min(&rec[4..16], j);
        s[j] = d * sc as f32;
        m[j] = dmin * mn as f32;
    }
    (s, m)
}

/// The records of rows (whole rows, one after another) as f32 scales and mins, `recs.len() / 16
/// * 8` of each.
pub fn k4_scales_mins(recs: &[u8], scales: &mut [f32], mins: &mut [f32]) {
    for (i, rec) in recs.chunks_exact(K4_RECORD).enumerate() {
        let (s, m) = k4_decode(rec);
        scales[8 * i..8 * i + 8].copy_from_slice(&s);
        mins[8 * i..8 * i + 8].copy_from_slice(&m);
    }
}

/// A record from eight scales and mins (each below 64) and `d`, `dmin` as f16: ggml's packing.
pub fn k4_encode(d: f16, dmin: f16, sc: &[u8; 8], m: &[u8; 8]) -> [u8; K4_RECORD] {
    let mut r = [0u8; K4_RECORD];
    r[0..2].copy_from_slice(&d.to_le_bytes());
    r[2..4].copy_from_slice(&dmin.to_le_bytes());
    let p = &mut r[4..16];
    for j in 0..4 {
        p[j] = (sc[j] & 63) | (sc[j + 4] >> 4) << 6;
        p[j + 4] = (m[j] & 63) | (m[j + 4] >> 4) << 6;
        p[j + 8] = (sc[j + 4] & 15) | (m[j + 4] & 15) << 4;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_ggml_packing() {
        // every 6-bit value in every slot: scale j = (j * 7 + k) % 64, min j = (j * 5 + 3k) % 64
        for k in 0..64u8 {
            let sc: [u8; 8] = std::array::from_fn(|j| (j as u8 * 7 + k) % 64);
            let m: [u8; 8] = std::array::from_fn(|j| (j as u8 * 5 + 3 * k) % 64);
            let rec = k4_encode(f16::from_f32(0.5), f16::from_f32(0.25), &sc, &m);
            for j in 0..8 {
                assert_eq!(crate::ggml::k_scale_min(&rec[4..16], j), (sc[j], m[j]), "slot {j}, k {k}");
            }
            let (s, mm) = k4_decode(&rec);
            assert_eq!(s, std::array::from_fn(|j| 0.5 * sc[j] as f32));
            assert_eq!(mm, std::array::from_fn(|j| 0.25 * m[j] as f32));
        }
    }
}
