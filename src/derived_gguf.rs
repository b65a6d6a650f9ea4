//! GGUF files the tests and the fuzz seeds derive from a committed GGUF fixture instead of
//! committing one per quant type (the tracked tree stays under 60 MiB).
//!
//! [low_bit_mix]: a file whose quantized tensors are re-typed in turn by a list of types
//! ([LOW_BIT_TYPES]: Q2_K, Q3_K, IQ4_NL and IQ4_XS; [CODEBOOK_TYPES]: IQ1_S ... IQ3_S), so types mix per tensor and per layer as the "dynamic" quants people download do (an
//! expert's gate, up and down each in its own type). The blocks are seeded random bytes with
//! finite f16 scales sized for weights of about 0.01-0.1: what is tested with it is that every
//! weight is read as the file holds it and that the model runs, not what it says.
//!
//! [with_yarn]: a file with YaRN's `rope.scaling.*` keys added, as llama.cpp's converter writes a
//! checkpoint's `rope_scaling` (tests/gguf_llama_logits.rs holds it to llama.cpp's logits).
//!
//! [write]: a GGUF v3 writer (header, metadata, tensor infos, padding to the alignment, each
//! tensor's data at an aligned offset), for files read by [`crate::convert::gguf::open`] and
//! written back with other tensor data.

use std::path::Path;

use moescope_kernels::ggml::BlockType;

use crate::convert::gguf::Value;
use crate::rng::Rng;

/// One tensor to write: its name, ggml dims (`ne[0]` innermost), ggml type id and bytes.
pub struct Tensor {
    pub name: String,
    pub ne: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
}

/// Low-bit types with scales per sub-block, for [`low_bit_mix`].
pub const LOW_BIT_TYPES: [BlockType; 4] = [BlockType::Q2K, BlockType::Q3K, BlockType::Iq4Nl, BlockType::Iq4Xs];

/// The codebook types (`moescope_kernels::ggml_iq`), for [`low_bit_mix`].
pub const CODEBOOK_TYPES: [BlockType; 7] = moescope_kernels::ggml_iq::TYPES;

/// Every quantized type a file can hold that [`low_bit_mix`] writes, for single-type files
/// (tests/gguf_llama_logits.rs holds each to llama.cpp's logits on the same file).
pub const ONE_TYPE_FILES: [BlockType; 18] = [
    BlockType::Q4_0,
    BlockType::Q4_1,
    BlockType::Q5_0,
    BlockType::Q4K,
    BlockType::Q5K,
    BlockType::Q6K,
    BlockType::Q2K,
    BlockType::Q3K,
    BlockType::Iq4Nl,
    BlockType::Iq4Xs,
    BlockType::Iq2Xxs,
    BlockType::Iq2Xs,
    BlockType::Iq2S,
    BlockType::Iq3Xxs,
    BlockType::Iq3S,
    BlockType::Iq1S,
    BlockType::Iq1M,
    BlockType::Mxfp4,
];

/// The mixes the tests and the fuzz seeds make: a name and the types taken in turn.
pub const MIXES: [(&str, &[BlockType]); 2] =
    [("Q2_K/Q3_K/IQ4_NL/IQ4_XS", &LOW_BIT_TYPES), ("IQ2_XXS/IQ2_XS/IQ2_S/IQ3_XXS/IQ3_S/IQ1_S/IQ1_M", &CODEBOOK_TYPES)];

/// `src` (a GGUF file) written to `out` with each Q8_0 tensor as random blocks of the next of
/// `types` (seeded: the same file every time); returns how many tensors were re-typed.
pub fn low_bit_mix(src: &Path, out: &Path, types: &[BlockType]) -> Result<usize, String> {
    let g = crate::convert::gguf::open(src).map_err(|e| e.to_string())?;
    let bytes = std::fs::read(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let mut rng = Rng::new(44);
    let mut tensors = Vec::with_capacity(g.tensors.len());
    let mut k = 0;
    for t in &g.tensors {
        let n = t.ne.iter().product::<u64>() as usize;
        let ty = types[k % types.len()];
        if t.ty.name != "Q8_0" || !n.is_multiple_of(ty.block()) {
            tensors.push(as_it_is(t, &bytes)?);
            continue;
        }
        k += 1;
        let data = random_blocks(ty, n / ty.block(), &mut rng);
        tensors.push(Tensor { name: t.name.clone(), ne: t.ne.clone(), ty: ty.ggml_id(), data });
    }
    write(out, &g.metadata, &tensors, g.alignment)?;
    Ok(k)
}

/// YaRN as [`with_yarn`] states it: factor 4 over 16 original positions, so the tiny prompt's
/// 40 tokens run past them and the ramp between the fast and slow dims falls inside a head.
pub const YARN_FACTOR: f32 = 4.0;
pub const YARN_ORIGINAL_CONTEXT: u32 = 16;

/// `src` written to `out` with `ARCH.rope.scaling.type` "yarn", `.factor` [YARN_FACTOR] and
/// `.original_context_length` [YARN_ORIGINAL_CONTEXT] (ARCH from `general.architecture`),
/// replacing any scaling keys it had; tensors unchanged.
pub fn with_yarn(src: &Path, out: &Path) -> Result<(), String> {
    let g = crate::convert::gguf::open(src).map_err(|e| e.to_string())?;
    let bytes = std::fs::read(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let arch = match g.metadata.iter().find(|(k, _)| k == "general.architecture") {
        Some((_, Value::Str(a))) => a.clone(),
        _ => return Err(format!("{}: no general.architecture", src.display())),
    };
    let key = |s: &str| format!("{arch}.rope.scaling.{s}");
    let mut metadata: Vec<(String, Value)> =
        g.metadata.iter().filter(|(k, _)| !k.starts_with(&key(""))).cloned().collect();
    metadata.push((key("type"), Value::Str("yarn".into())));
    metadata.push((key("factor"), Value::F32(YARN_FACTOR)));
    metadata.push((key("original_context_length"), Value::U32(YARN_ORIGINAL_CONTEXT)));
    let tensors = g.tensors.iter().map(|t| as_it_is(t, &bytes)).collect::<Result<Vec<_>, String>>()?;
    write(out, &metadata, &tensors, g.alignment)
}

/// Tensor `t` of the file whose bytes are `bytes`, as the file holds it.
fn as_it_is(t: &crate::convert::gguf::TensorInfo, bytes: &[u8]) -> Result<Tensor, String> {
    let raw = bytes.get(t.offset as usize..(t.offset + t.bytes) as usize).ok_or(format!("{}: bounds", t.name))?;
    Ok(Tensor { name: t.name.clone(), ne: t.ne.clone(), ty: t.ty.id, data: raw.to_vec() })
}

/// `n` blocks of `t`: random bytes, each f16 scale (Q2_K's d and dmin, the others' d) set to a
/// finite value of the size that gives weights of about 0.01-0.1.
fn random_blocks(t: BlockType, n: usize, rng: &mut Rng) -> Vec<u8> {
    // (offset, size) of each f16 scale; where a type has mins, their size centres the weights
    // near zero (mean code x mean scale x d = mean min x dmin)
    let scales: &[(usize, f32)] = match t {
        // d, dmin: codes 0..3 times 4-bit scales (mean 1.5 x 7.5) less 4-bit mins (mean 7.5)
        BlockType::Q2K => &[(80, 2e-3), (82, 3e-3)],
        BlockType::Q3K => &[(108, 6e-4)],
        BlockType::Iq4Nl => &[(0, 3e-4)],
        BlockType::Iq2Xxs | BlockType::Iq2Xs | BlockType::Iq2S => &[(0, 2e-4)],
        BlockType::Iq3Xxs | BlockType::Iq3S => &[(0, 1e-4)],
        BlockType::Iq1S => &[(0, 3e-3)],
        // IQ1_M's d (about 3e-3) is in the top nibbles of its scales, set below
        BlockType::Iq1M => &[],
        // d, dmin: codes 0..15 (Q4_K) or 0..31 (Q5_K) times 6-bit scales, less 6-bit mins
        BlockType::Q4K => &[(0, 1e-4), (2, 7.5e-4)],
        BlockType::Q5K => &[(0, 5e-5), (2, 7.75e-4)],
        // d after ql, qh and the i8 scales: codes -32..31 times scales to +-128
        BlockType::Q6K => &[(208, 1e-5)],
        BlockType::Q4_0 | BlockType::Q5_0 => &[(0, 4e-3)],
        // d and the block's offset m: d q + m with q 0..15
        BlockType::Q4_1 => &[(0, 4e-3), (2, -3e-2)],
        // MXFP4's scale is one E8M0 byte, set below
        BlockType::Mxfp4 => &[],
        _ => &[(0, 2e-5)],
    };
    let mut out = Vec::with_capacity(n * t.block_bytes());
    for _ in 0..n {
        let at = out.len();
        out.extend((0..t.block_bytes()).map(|_| rng.next_u64() as u8));
        for &(s, size) in scales {
            let d = size * (1.0 + rng.next_f64() as f32);
            out[at + s..at + s + 2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        }
        if t == BlockType::Mxfp4 {
            // 2^(e - 127) for e in 118..=121: E2M1 values up to 6 give weights up to 0.05
            out[at] = 118 + (rng.next_u64() % 4) as u8;
        }
        if t == BlockType::Iq1M {
            let d = half::f16::from_f32(3e-3 * (1.0 + rng.next_f64() as f32)).to_bits();
            for k in 0..4 {
                let s = &mut out[at + 48 + 2 * k..at + 50 + 2 * k];
                let v = u16::from_le_bytes([s[0], s[1]]) & 0x0FFF | ((d >> (4 * k)) & 15) << 12;
                s.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    out
}

fn put_str(o: &mut Vec<u8>, s: &str) {
    o.extend((s.len() as u64).to_le_bytes());
    o.extend(s.as_bytes());
}

/// GGUF's value type id of a type name as the reader spells it.
fn type_id(name: &str) -> Result<u32, String> {
    const NAMES: [&str; 13] = [
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64",
        "float64",
    ];
    NAMES.iter().position(|n| *n == name).map(|i| i as u32).ok_or(format!("value type {name}"))
}

fn put_value(o: &mut Vec<u8>, v: &Value) -> Result<(), String> {
    match v {
        Value::U8(x) => o.push(*x),
        Value::I8(x) => o.push(*x as u8),
        Value::U16(x) => o.extend(x.to_le_bytes()),
        Value::I16(x) => o.extend(x.to_le_bytes()),
        Value::U32(x) => o.extend(x.to_le_bytes()),
        Value::I32(x) => o.extend(x.to_le_bytes()),
        Value::F32(x) => o.extend(x.to_le_bytes()),
        Value::Bool(x) => o.push(*x as u8),
        Value::Str(s) => put_str(o, s),
        Value::Array(ty, items) => {
            o.extend(type_id(ty)?.to_le_bytes());
            o.extend((items.len() as u64).to_le_bytes());
            for x in items {
                put_value(o, x)?;
            }
        }
        Value::U64(x) => o.extend(x.to_le_bytes()),
        Value::I64(x) => o.extend(x.to_le_bytes()),
        Value::F64(x) => o.extend(x.to_le_bytes()),
    }
    Ok(())
}

/// Write `metadata` and `tensors` to `path` as GGUF v3 with `alignment` (a power of two).
pub fn write(path: &Path, metadata: &[(String, Value)], tensors: &[Tensor], alignment: u64) -> Result<(), String> {
    let mut o = b"GGUF".to_vec();
    o.extend(3u32.to_le_bytes());
    o.extend((tensors.len() as u64).to_le_bytes());
    o.extend((metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_str(&mut o, k);
        o.extend(type_id(v.type_name())?.to_le_bytes());
        put_value(&mut o, v)?;
    }
    let align = |x: u64| x.div_ceil(alignment.max(1)) * alignment.max(1);
    let mut at = 0u64;
    for t in tensors {
        put_str(&mut o, &t.name);
        o.extend((t.ne.len() as u32).to_le_bytes());
        t.ne.iter().for_each(|d| o.extend(d.to_le_bytes()));
        o.extend(t.ty.to_le_bytes());
        o.extend(at.to_le_bytes());
        at = align(at + t.data.len() as u64);
    }
    o.resize(align(o.len() as u64) as usize, 0);
    for t in tensors {
        o.extend(&t.data);
        o.resize(align(o.len() as u64) as usize, 0);
    }
    std::fs::write(path, &o).map_err(|e| format!("{}: {e}", path.display()))
}
