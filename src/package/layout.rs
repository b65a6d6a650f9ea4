//! The `.moe` file layout: header, metadata, tensor index and expert table.
//!
//! ```text
//! 0        header, 4096 bytes (fixed fields below, zero padded)
//! 4096     metadata JSON (model config, quantization, tokenizer, tensor index, expert table)
//! dense    dense tensors, each 64-byte aligned (values, then f32 scales 64-byte aligned)
//! experts  one blob per (MoE layer, expert), 4096-byte aligned and padded: gate, up and down
//!          with their scales, so one expert is exactly one read (O_DIRECT-friendly)
//! mtp      (optional, to the end of the file) the multi-token-prediction layers' tensors,
//!          laid out as dense ones ([`MtpSection`])
//! ```
//! Every offset in the metadata is absolute. Every tensor and every expert blob carries an
//! xxh3-64 checksum of its bytes; the metadata has one in the header; the header has its own.

use serde::{Deserialize, Serialize};

pub use super::scale_form::{BLOCKS, F16, F16_MINS, K4, K6, MINS, ScaleForm, span};
use crate::model_config::ModelConfig;
use moescope_kernels::Format;

pub const MAGIC: [u8; 8] = *b"MOESCOPE";
/// The newest layout written; bumped on any incompatible change of the layout below. Version 2
/// gives each MoE layer's blobs a length of their own ([`ExpertRegion::layer_lens`]); a package
/// without them is written as version 1, which readers from before it still read.
pub const VERSION: u32 = 2;
/// The oldest layout this reader reads.
pub const FIRST_VERSION: u32 = 1;
pub const HEADER_SIZE: u64 = 4096;
pub const DENSE_ALIGN: u64 = 64;
/// Each expert blob starts on a page, so that one O_DIRECT read lands in one aligned buffer.
pub const EXPERT_ALIGN: u64 = crate::aligned_buf::ALIGN as u64;

pub fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// The fixed fields at the start of the file (little endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub version: u32,
    pub file_size: u64,
    pub meta_offset: u64,
    pub meta_len: u64,
    pub meta_xxh3: u64,
    pub dense_offset: u64,
    pub dense_len: u64,
    pub expert_offset: u64,
    pub expert_len: u64,
}

/// Byte offset of the header checksum; it covers bytes `[0, HEADER_SUM_AT)`.
pub const HEADER_SUM_AT: usize = 84;

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_SIZE as usize);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
        for v in [
            self.file_size,
            self.meta_offset,
            self.meta_len,
            self.meta_xxh3,
            self.dense_offset,
            self.dense_len,
            self.expert_offset,
            self.expert_len,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&[0u8; 4]);
        debug_assert_eq!(b.len(), HEADER_SUM_AT);
        let sum = xxhash_rust::xxh3::xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b.resize(HEADER_SIZE as usize, 0);
        b
    }

    /// Parse the fixed fields; `Err` says what is wrong, in words.
    pub fn decode(b: &[u8]) -> Result<Header, HeaderError> {
        if b.len() < HEADER_SIZE as usize {
            return Err(HeaderError::Short(b.len()));
        }
        if b[..8] != MAGIC {
            return Err(HeaderError::Magic);
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let version = u32_at(8);
        if !(FIRST_VERSION..=VERSION).contains(&version) {
            return Err(HeaderError::Version(version));
        }
        if u32_at(12) as u64 != HEADER_SIZE {
            return Err(HeaderError::Corrupt("header size field"));
        }
        if xxhash_rust::xxh3::xxh3_64(&b[..HEADER_SUM_AT]) != u64_at(HEADER_SUM_AT) {
            return Err(HeaderError::Corrupt("header checksum"));
        }
        Ok(Header {
            version,
            file_size: u64_at(16),
            meta_offset: u64_at(24),
            meta_len: u64_at(32),
            meta_xxh3: u64_at(40),
            dense_offset: u64_at(48),
            dense_len: u64_at(56),
            expert_offset: u64_at(64),
            expert_len: u64_at(72),
        })
    }
}

#[derive(Debug)]
pub enum HeaderError {
    Short(usize),
    Magic,
    Version(u32),
    Corrupt(&'static str),
}

/// Storage type of a tensor, as written in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    Bf16,
    Q8,
    Q4,
    Q6,
    Mxfp4,
}

impl DType {
    pub fn format(self, group: Option<usize>) -> Option<Format> {
        Some(match self {
            DType::F32 => Format::F32,
            DType::Bf16 => Format::Bf16,
            DType::Q8 => Format::Q8 { group: group? },
            DType::Q4 => Format::Q4 { group: group? },
            DType::Q6 => Format::Q6 { group: group? },
            DType::Mxfp4 => Format::Mxfp4,
        })
    }

    pub fn of(f: Format) -> DType {
        match f {
            Format::F32 => DType::F32,
            Format::Bf16 => DType::Bf16,
            Format::Q8 { .. } => DType::Q8,
            Format::Q4 { .. } => DType::Q4,
            Format::Q6 { .. } => DType::Q6,
            Format::Mxfp4 => DType::Mxfp4,
        }
    }
}

/// Where one tensor (or one part of an expert blob) lies and how it is stored.
/// Matrices are `[rows, cols]`; vectors are `[n]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<usize>,
    pub layout: String,
    /// Absolute for dense tensors; relative to the blob start for expert parts.
    pub offset: u64,
    pub length: u64,
    /// Start of the f32 scales (same base as `offset`), for quantized types.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scales_offset: Option<u64>,
    /// xxh3-64 of the `length` bytes at `offset` (dense tensors only), 16 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xxh3: Option<String>,
}

impl TensorEntry {
    pub fn rows_cols(&self) -> (usize, usize) {
        match self.shape.as_slice() {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            _ => (0, 0),
        }
    }

    pub fn format(&self) -> Option<Format> {
        self.dtype.format(self.group)
    }

    /// How the entry's scales are stored, from its layout's mark.
    pub fn scale_form(&self) -> ScaleForm {
        ScaleForm::of_layout(&self.layout)
    }

    /// Whether the groups are asymmetric with f32 mins (a value is `scale * n - min`; q4 and q8
    /// only): the layout then ends in [`MINS`] and the scales are followed by as many mins.
    pub fn has_mins(&self) -> bool {
        self.scale_form() == ScaleForm::Mins
    }

    /// The layout without its scales' mark.
    pub fn base_layout(&self) -> &str {
        let mark = self.scale_form().mark();
        self.layout.strip_suffix(mark).unwrap_or(&self.layout)
    }

    /// Bytes this entry must span, from its format and shape; None if inconsistent.
    pub fn expected_len(&self) -> Option<(u64, Option<u64>)> {
        let f = self.format()?;
        let (r, c) = self.rows_cols();
        if r == 0 || c == 0 || !f.fits(c) || !self.scale_form().suits(f, c) {
            return None;
        }
        Some(span(f, r, c, self.scale_form()))
    }
}

/// The routed experts: one blob per (layer in `layers`, expert), all of one length, or of one
/// length per layer (`layer_lens`) where the layers' parts differ in size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpertRegion {
    pub layers: Vec<usize>,
    pub num_experts: usize,
    /// `gate_proj [I, H]`, `up_proj [I, H]`, `down_proj [H, I]`, offsets relative to the blob:
    /// the same three for every layer, or three per layer in `layers` order where formats
    /// differ by layer (a GGUF's Q4_K_M keeps some layers' `ffn_down_exps` in Q6_K; readers
    /// that predate this refuse more than three parts).
    pub parts: Vec<TensorEntry>,
    /// Bytes of one blob including padding (a multiple of 4096): the longest where layers differ,
    /// what one pool slot holds.
    pub blob_len: u64,
    /// Bytes of each layer's blobs (in `layers` order, multiples of 4096), where they differ:
    /// a miss reads its own layer's length (version 2); empty when every blob is `blob_len` long.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_lens: Vec<u64>,
    /// `table[i * num_experts + e]` = (offset, xxh3-64 hex) of layer `layers[i]`, expert `e`.
    pub table: Vec<(u64, String)>,
}

impl ExpertRegion {
    /// A region of these parts, its lengths and table left to the writer's plan.
    pub fn planned(layers: Vec<usize>, num_experts: usize, parts: Vec<TensorEntry>) -> ExpertRegion {
        ExpertRegion { layers, num_experts, parts, blob_len: 0, layer_lens: vec![], table: vec![] }
    }

    /// Whether the layers' blobs have parts of their own (three per layer).
    pub fn per_layer(&self) -> bool {
        self.parts.len() > 3 && self.parts.len() == 3 * self.layers.len()
    }

    /// The place of model layer `layer` among the region's layers (`layers[i] == layer`).
    pub fn index_of(&self, layer: usize) -> Option<usize> {
        self.layers.iter().position(|&l| l == layer)
    }

    /// Bytes of a blob of `layers[i]`.
    pub fn len_of(&self, i: usize) -> u64 {
        self.layer_lens.get(i).copied().unwrap_or(self.blob_len)
    }

    /// Bytes of every blob together.
    pub fn total_len(&self) -> u64 {
        (0..self.layers.len()).map(|i| self.len_of(i)).sum::<u64>() * self.num_experts as u64
    }

    /// The three parts of the blobs of `layers[i]`.
    pub fn parts_of(&self, i: usize) -> &[TensorEntry] {
        if self.per_layer() { &self.parts[3 * i..3 * i + 3] } else { &self.parts[..self.parts.len().min(3)] }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantInfo {
    /// `bf16`, `q8`, `q4` or `q4g32`: the mode the converter ran with.
    pub mode: String,
    /// In words: which tensors got which format.
    pub description: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenizerInfo {
    /// The checkpoint's tokenizer.json, verbatim; None when the checkpoint had none.
    pub tokenizer_json: Option<String>,
    /// The Jinja chat template (tokenizer_config.json or chat_template.jinja).
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub format: String,
    pub version: u32,
    /// Human-readable name of the model (source directory or "moescope demo").
    pub name: String,
    pub converter: String,
    pub model: ModelConfig,
    pub quant: QuantInfo,
    pub tokenizer: TokenizerInfo,
    pub tensors: Vec<TensorEntry>,
    pub experts: Option<ExpertRegion>,
    /// Default expert pool, as a fraction of all experts, when the user gives no budget (the
    /// demo model streams by default so the workbench has cache and I/O activity to show).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_pool_fraction: Option<f64>,
    /// What the checkpoint held that the package leaves out, in words (a vision tower, a
    /// multi-token-prediction block).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<String>,
    /// Set when the weights are seeded random numbers of a real model's shape (`moescope synth`),
    /// not a trained checkpoint: the output is meaningless text, the speed and memory are real.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<Synthetic>,
    /// The checkpoint's multi-token-prediction layers, when it holds them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpSection>,
}

/// A checkpoint's multi-token-prediction layers (DeepSeek-V3's and GLM-4.5's
/// `num_nextn_predict_layers`), kept for speculative decoding but not run: their tensors after
/// the expert region (to the end of the file), each 64-byte aligned like a dense tensor, never
/// made resident. Each layer is a decoder layer (its routed experts as plain tensors,
/// `mlp.experts.{e}.*`) plus `enorm`, `hnorm`, `eh_proj` `[h, 2h]` and `shared_head.norm`, under
/// `model.layers.{L}.` with L from `num_hidden_layers` on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MtpSection {
    pub layers: Vec<usize>,
    pub tensors: Vec<TensorEntry>,
}

impl MtpSection {
    /// Where the section starts in the file, and its tensors' bytes.
    pub fn extent(&self) -> (u64, u64) {
        (self.tensors.first().map_or(0, |t| t.offset), self.tensors.iter().map(|t| t.length).sum())
    }
}

/// How a synthetic package was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Synthetic {
    /// The shape's name (`qwen3-30b-a3b`).
    pub shape: String,
    pub seed: u64,
    /// The weight distributions, in words.
    pub weights: String,
}

impl Meta {
    /// The model's name as reports show it: "synthetic" said where the weights are.
    pub fn display_name(&self) -> String {
        match &self.synthetic {
            Some(s) => format!("{} (synthetic {}, seed {})", self.name, s.shape, s.seed),
            None => self.name.clone(),
        }
    }
}

pub const FORMAT_NAME: &str = "moescope-package";

pub fn hex64(v: u64) -> String {
    format!("{v:016x}")
}

pub fn parse_hex64(s: &str) -> Option<u64> {
    if s.len() != 16 {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::super::scale_form::BLOCK_MARKS;
    use super::*;
    use moescope_kernels::ggml::BlockType;
    use moescope_kernels::ggml_codes::blocks_run_as;

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let h = Header {
            version: VERSION,
            file_size: 123456,
            meta_offset: 4096,
            meta_len: 77,
            meta_xxh3: 0xdead_beef,
            dense_offset: 8192,
            dense_len: 1000,
            expert_offset: 12288,
            expert_len: 4096,
        };
        let b = h.encode();
        assert_eq!(b.len(), HEADER_SIZE as usize);
        assert_eq!(Header::decode(&b).ok(), Some(h));
        let mut bad = b.clone();
        bad[20] ^= 1;
        assert!(matches!(Header::decode(&bad), Err(HeaderError::Corrupt(_))));
        let mut magic = b.clone();
        magic[0] = b'X';
        assert!(matches!(Header::decode(&magic), Err(HeaderError::Magic)));
        assert!(matches!(Header::decode(&b[..100]), Err(HeaderError::Short(100))));
    }

    #[test]
    fn mins_only_for_q4_and_q8() {
        let e = |dtype, group: Option<usize>, layout: &str| TensorEntry {
            name: "w".into(),
            dtype,
            shape: vec![4, 128],
            group,
            layout: layout.into(),
            offset: 0,
            length: 0,
            scales_offset: None,
            xxh3: None,
        };
        let q4 = e(DType::Q4, Some(32), "q4_lohi32_x4+mins");
        assert!(q4.has_mins() && q4.base_layout() == "q4_lohi32_x4");
        assert_eq!(q4.expected_len(), Some(span(Format::Q4 { group: 32 }, 4, 128, ScaleForm::Mins)));
        assert!(e(DType::Q8, Some(16), "row_major+mins").expected_len().is_some());
        assert_eq!(e(DType::Q6, Some(128), "q6_lo4hi2_x4+mins").expected_len(), None);
        assert_eq!(e(DType::Bf16, None, "row_major+mins").expected_len(), None);
        // k4 records: q4 groups of 32 over whole 256-value blocks only
        let k4 =
            |group, cols: usize| TensorEntry { shape: vec![4, cols], ..e(DType::Q4, Some(group), "q4_lohi32_x4+k4") };
        assert!(k4(32, 256).scale_form() == ScaleForm::K4 && k4(32, 256).base_layout() == "q4_lohi32_x4");
        assert_eq!(k4(32, 512).expected_len(), Some(span(Format::Q4 { group: 32 }, 4, 512, ScaleForm::K4)));
        assert_eq!(k4(32, 128).expected_len(), None, "rows of half a block");
        assert_eq!(k4(64, 256).expected_len(), None, "groups of 64");
        assert_eq!(e(DType::Q8, Some(32), "row_major+k4").expected_len(), None);
        // k6 records: q6 groups of 16 over whole blocks, 18 bytes a block
        let k6 = TensorEntry { shape: vec![4, 512], ..e(DType::Q6, Some(16), "q6_lo4hi2_x4+k6") };
        assert_eq!(k6.scale_form(), ScaleForm::K6);
        assert_eq!(k6.expected_len(), Some((4 * 4 * 96 + 4 * 2 * 18, Some(4 * 4 * 96))));
        assert_eq!(TensorEntry { group: Some(128), ..k6 }.expected_len(), None, "groups of 128");
        // a file's blocks: the q8 group its type computes with, whole blocks, nothing after
        let q2k = TensorEntry { shape: vec![4, 512], ..e(DType::Q8, Some(16), "row_major+ggml_q2_k") };
        assert!(q2k.scale_form() == ScaleForm::Blocks(BlockType::Q2K) && q2k.base_layout() == "row_major");
        assert_eq!(q2k.expected_len(), Some((4 * 2 * 84, None)), "84 bytes a block, as ggml's");
        assert!(ScaleForm::Blocks(BlockType::Q2K).asymmetric() && !ScaleForm::Blocks(BlockType::Q3K).asymmetric());
        assert_eq!(TensorEntry { group: Some(32), ..q2k.clone() }.expected_len(), None, "Q2_K in groups of 32");
        assert_eq!(TensorEntry { shape: vec![4, 128], ..q2k.clone() }.expected_len(), None, "half a block");
        assert_eq!(TensorEntry { dtype: DType::Q4, ..q2k }.expected_len(), None, "q4");
        let iq1m = TensorEntry { shape: vec![1, 256], ..e(DType::Q8, Some(16), "row_major+ggml_iq1_m") };
        assert_eq!(iq1m.expected_len(), Some((56, None)));
        assert_eq!(ScaleForm::of_layout("row_major+ggml_q6_k"), ScaleForm::Plain, "Q6_K is never kept as blocks");
        for (t, mark) in BLOCK_MARKS {
            assert_eq!(ScaleForm::of_layout(&format!("row_major{mark}")), ScaleForm::Blocks(t));
            assert_eq!(ScaleForm::Blocks(t).mark(), mark);
            assert_eq!(mark, format!("{BLOCKS}{}", t.name().to_lowercase()));
            assert!(blocks_run_as(t).is_some(), "{mark}");
        }
    }
}
