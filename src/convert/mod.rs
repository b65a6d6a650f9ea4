//! HuggingFace checkpoint -> `.moe` package, streamed tensor by tensor (and row chunk by row
//! chunk), so peak memory is a few tensors whatever the model size.

pub mod byte_level_bpe;
mod encode;
pub mod error;
pub mod gguf;
pub mod gpt_oss;
pub mod hf_config;
pub mod hybrid;
pub mod mla;
pub mod mtp;
pub mod plan;
pub mod requant_blocks;
pub mod requant_cost;
pub mod safetensors;
pub mod source;
pub mod tiktoken;
pub mod tokenizer_files;

use encode::EncodedRows;
pub use encode::encode_rows;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use moescope_kernels::Format;
use moescope_kernels::quant::ROW_BLOCK;
use rayon::prelude::*;

/// Bumped when the converter writes a different package from the same checkpoint that readers
/// still take (2: q4/q6 rows interleaved by 4), so a cached conversion is made again.
pub const WRITER_REVISION: u32 = 2;

pub use error::ConvertError;
pub use plan::QuantMode;
pub use source::TensorSource;

use crate::engine::tokenizer::Tok;
use crate::model_config::ModelConfig;
use crate::package::layout::{
    DType, ExpertRegion, FIRST_VERSION, FORMAT_NAME, Meta, QuantInfo, ScaleForm, TensorEntry, TokenizerInfo,
};
use crate::package::writer::{BlobBuilder, PackageWriter, plan as plan_offsets};

#[derive(Debug, Clone, Copy)]
pub struct ConvertOptions {
    pub quant: QuantMode,
    /// Draw a progress bar (only ever on a terminal).
    pub progress: bool,
    /// Checked between tensors: when set, the conversion stops and removes its partial file.
    pub cancel: Option<&'static AtomicBool>,
    /// Recorded in the package: the default expert pool as a fraction of all experts.
    pub default_pool_fraction: Option<f64>,
    /// The progress bar's verb.
    pub verb: &'static str,
}

impl ConvertOptions {
    pub fn new(quant: QuantMode) -> ConvertOptions {
        ConvertOptions { quant, progress: false, cancel: None, default_pool_fraction: None, verb: "converting" }
    }

    fn check_cancel(&self) -> Result<(), ConvertError> {
        match self.cancel {
            Some(c) if c.load(Ordering::Relaxed) => Err(ConvertError::Interrupted),
            _ => Ok(()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ConvertReport {
    pub out: PathBuf,
    pub bytes: u64,
    pub seconds: f64,
    pub warnings: Vec<String>,
}

/// Convert the HuggingFace model directory `dir` into the package `out`.
pub fn convert_hf(dir: &Path, out: &Path, opts: ConvertOptions) -> Result<ConvertReport, ConvertError> {
    let t0 = Instant::now();
    let mut cfg = hf_config::read_config(dir)?;
    let ck = safetensors::HfCheckpoint::open(dir)?;
    let mut warnings = vec![];
    let tok = or_no_tokenizer(tokenizer_files::read_tokenizer(dir)?, dir, "no tokenizer.json", &mut warnings);
    add_tokenizer_eos(&mut cfg, &tok);
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string());
    // the vision tower and the multi-token-prediction block are not part of the text model
    let mut ignored = vec![];
    for (what, prefix) in [("vision tower", "model.visual."), ("multi-token prediction block", "mtp.")] {
        let n = ck.names().filter(|t| t.starts_with(prefix)).count();
        if n > 0 {
            ignored.push(format!("{prefix}* ({what}): {n} tensors"));
        }
    }
    if !ignored.is_empty() {
        warnings.push(format!("{}: not converted (text model only): {}", dir.display(), ignored.join("; ")));
    }
    let hybrid = hybrid::HybridSource::new(&ck, &cfg);
    let gpt_oss = gpt_oss::GptOssSource::new(&ck);
    let mla = mla::MlaSource::new(&ck, &cfg);
    let src: &dyn TensorSource = match (&hybrid, &mla, cfg.arch) {
        (Some(h), _, _) => h,
        (None, Some(m), _) => m,
        (None, None, crate::model_config::Arch::GptOss) => &gpt_oss,
        (None, None, _) => &ck,
    };
    mtp::notes(src, &cfg, dir, &mut ignored, &mut warnings);
    let origin = Origin { name: &name, ignored, synthetic: None };
    let bytes = write_package(src, &cfg, tok, origin, opts, out)?;
    if let QuantMode::Ggml(_) = opts.quant {
        warnings.push(requant_cost::requant_cost(src, out, "quantized from the checkpoint's")?);
    }
    Ok(ConvertReport { out: out.to_path_buf(), bytes, seconds: t0.elapsed().as_secs_f64(), warnings })
}

/// The quantization for a HuggingFace checkpoint when none is asked for: q4, or `mxfp4` for a
/// checkpoint released with MXFP4 experts (gpt-oss), whose experts it then keeps as they are.
pub fn default_hf_quant(dir: &Path) -> QuantMode {
    let method = hf_config::read_json(&dir.join("config.json"))
        .ok()
        .and_then(|v| v.pointer("/quantization_config/quant_method").and_then(|m| m.as_str()).map(String::from));
    match method.as_deref() {
        Some("mxfp4") => QuantMode::Mxfp4,
        _ => QuantMode::Q4 { max_group: 128 },
    }
}

/// Convert the GGUF file `path` (or the split model whose first part it is) into the package
/// `out`. With [`QuantMode::File`] every tensor keeps the file's values exactly; another mode
/// requantizes from them.
pub fn convert_gguf(path: &Path, out: &Path, opts: ConvertOptions) -> Result<ConvertReport, ConvertError> {
    let t0 = Instant::now();
    let src = gguf::source::GgufSource::open(path)?;
    let mut cfg = src.model.config()?;
    // every tensor's type is one moescope reads, before a byte is written
    for t in src.model.tensors() {
        src.model.block_type(&t.name)?;
    }
    let mut warnings = vec![];
    let tok = or_no_tokenizer(gguf::vocab::tokenizer(&src.model)?, path, "no tokenizer metadata", &mut warnings);
    add_tokenizer_eos(&mut cfg, &tok);
    let name = src
        .model
        .str_key("general.name")?
        .map(String::from)
        .or_else(|| path.file_stem().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into());
    // latent attention's key and value halves: the file's split, or its kv_b split here
    let mla = mla::MlaSource::new(&src, &cfg);
    let view: &dyn TensorSource = match &mla {
        Some(m) => m,
        None => &src,
    };
    let mut ignored = vec![];
    mtp::notes(view, &cfg, path, &mut ignored, &mut warnings);
    let origin = Origin { name: &name, ignored, synthetic: None };
    let bytes = write_package(view, &cfg, tok, origin, opts, out)?;
    if opts.quant != QuantMode::File {
        warnings.push(requant_cost::requant_cost(view, out, "requantized from the file's")?);
    }
    Ok(ConvertReport { out: out.to_path_buf(), bytes, seconds: t0.elapsed().as_secs_f64(), warnings })
}

/// The source's tokenizer, or none with a warning (`missing` says what is absent): such a
/// package takes token ids only.
fn or_no_tokenizer(tok: Option<TokenizerInfo>, src: &Path, missing: &str, warnings: &mut Vec<String>) -> TokenizerInfo {
    tok.unwrap_or_else(|| {
        warnings.push(format!(
            "{}: {missing}: the package takes --prompt-ids only and shows token ids instead of text",
            src.display()
        ));
        TokenizerInfo::default()
    })
}

/// The tokenizer's own end-of-sequence token (`<|im_end|>` for Qwen chat models) also stops
/// generation, beside the ids in config.json / generation_config.json.
pub fn add_tokenizer_eos(cfg: &mut ModelConfig, tok: &TokenizerInfo) {
    let (Some(json), Some(eos)) = (&tok.tokenizer_json, &tok.eos_token) else {
        return;
    };
    if let Ok(t) = Tok::from_json(json)
        && let Some(id) = t.token_id(eos)
        && !cfg.eos_token_ids.contains(&id)
    {
        cfg.eos_token_ids.push(id);
    }
}

/// Where a package's weights come from, as its metadata records it.
pub struct Origin<'a> {
    /// The model's name (the checkpoint's folder).
    pub name: &'a str,
    /// What the source held that the package leaves out, in words.
    pub ignored: Vec<String>,
    /// Set for seeded random weights (`moescope synth`).
    pub synthetic: Option<crate::package::layout::Synthetic>,
}

/// Where a package's expert blobs come from: one blob per (MoE layer, expert), in the region's
/// layout (`region.len_of(layer's place)` bytes). Called from several threads at once.
pub trait BlobSource: Sync {
    fn blob(&self, region: &ExpertRegion, layer: usize, expert: usize) -> Result<Vec<u8>, ConvertError>;
}

/// The error of a blob asked for in a layer the expert region does not hold (a caller's bug).
pub(crate) fn no_experts_in(layer: usize) -> ConvertError {
    ConvertError::Tensor {
        file: PathBuf::new(),
        name: format!("model.layers.{layer}.mlp.experts"),
        msg: "layer is not a MoE layer of the package".into(),
    }
}

/// Blobs encoded from a tensor source's f32 rows (what `convert` does).
struct EncodedBlobs<'a> {
    src: &'a dyn TensorSource,
    cfg: &'a ModelConfig,
}

impl BlobSource for EncodedBlobs<'_> {
    fn blob(&self, region: &ExpertRegion, l: usize, e: usize) -> Result<Vec<u8>, ConvertError> {
        let li = region.index_of(l).ok_or_else(|| no_experts_in(l))?;
        let mut b = BlobBuilder::new(region, li);
        let mut x = Vec::new();
        let mut e_rows = EncodedRows::default();
        for (p, (tname, shape)) in plan::expert_tensors(self.cfg, l, e).iter().enumerate() {
            let part = &region.parts_of(li)[p];
            let f = part.format().unwrap_or(Format::F32);
            if !e_rows.fill(self.src, tname, (f, part.scale_form()), 0, shape[0])? {
                self.src.read_rows(tname, 0, shape[0], &mut x)?;
                encode_rows(f, &x, shape[1], f.interleaves(shape[0], shape[1]), &mut e_rows.vals, &mut e_rows.scales);
            }
            if part.scale_form().records() || matches!(part.scale_form(), ScaleForm::Blocks(_)) {
                b.put_bytes(p, &e_rows.vals, &e_rows.records);
            } else {
                b.put(p, &e_rows.vals, &e_rows.scales, &e_rows.mins);
            }
        }
        Ok(b.buf)
    }
}

/// Write a package of `cfg` with weights from `src`. Returns the package size in bytes.
pub fn write_package(
    src: &dyn TensorSource,
    cfg: &ModelConfig,
    tokenizer: TokenizerInfo,
    origin: Origin<'_>,
    opts: ConvertOptions,
    out: &Path,
) -> Result<u64, ConvertError> {
    let requant = match opts.quant {
        QuantMode::Ggml(t) => Some(requant_blocks::RequantBlocks::new(src, cfg, t)),
        _ => None,
    };
    let src: &dyn TensorSource = requant.as_ref().map_or(src, |r| r);
    write_package_with(src, &EncodedBlobs { src, cfg }, cfg, tokenizer, origin, opts, out)
}

/// [`write_package`] with the expert blobs from `blobs` (the dense tensors still from `src`):
/// the source checked, the package planned, then its dense tensors and its experts written.
pub fn write_package_with(
    src: &dyn TensorSource,
    blobs: &dyn BlobSource,
    cfg: &ModelConfig,
    tokenizer: TokenizerInfo,
    origin: Origin<'_>,
    opts: ConvertOptions,
    out: &Path,
) -> Result<u64, ConvertError> {
    let Planned { dense, moe_layers, mtp } = check_source(src, cfg, out)?;
    let mut meta = plan_meta(src, cfg, &opts, (tokenizer, origin), (&dense, &mtp), &moe_layers);
    let header = plan_offsets(&mut meta);
    let total = header.file_size;
    check_free_space(out, total)?;
    let mut w = PackageWriter::create(out, meta, header)?;
    let bar = progress_bar(&opts, total);
    write_dense(src, &mut w, &dense, &opts, &bar)?;
    if let Some(region) = w.meta().experts.clone() {
        write_experts(blobs, &mut w, (&region, &moe_layers), &opts, &bar)?;
    }
    write_dense(src, &mut w, &mtp, &opts, &bar)?;
    w.finish()?;
    bar.finish_and_clear();
    Ok(total)
}

/// Everything the package needs from `src` is there with the right shape, before a byte is
/// written: its dense tensors, its MoE layers and the multi-token-prediction layers' tensors
/// (none when the source holds no `eh_proj` of the first: checkpoints often leave them out), in
/// the plan's order.
fn check_source(src: &dyn TensorSource, cfg: &ModelConfig, out: &Path) -> Result<Planned, ConvertError> {
    cfg.validate()
        .map_err(|msg| ConvertError::File { path: out.to_path_buf(), msg: format!("model config: {msg}") })?;
    let check = |name: &str, want: &[usize]| -> Result<(), ConvertError> {
        match src.shape(name) {
            None => {
                Err(ConvertError::MissingTensor { dir: PathBuf::from(src.origin(name)), name: src.source_name(name) })
            }
            Some(s) if s != want => Err(ConvertError::Shape {
                file: PathBuf::from(src.origin(name)),
                name: src.source_name(name),
                found: s,
                expected: want.to_vec(),
            }),
            Some(_) => Ok(()),
        }
    };
    // the layer count the config states is checked against the checkpoint before anything is
    // sized by it (a num_hidden_layers of 10^9 planned 10^9 layers' tensors first)
    if let Some(last) = cfg.num_hidden_layers.checked_sub(1) {
        check(&format!("model.layers.{last}.input_layernorm.weight"), &[cfg.hidden_size])?;
    }
    let dense = plan::dense_tensors(cfg);
    let moe_layers = cfg.moe_layers();
    for t in &dense {
        check(&t.name, &t.shape)?;
    }
    for &l in &moe_layers {
        for e in 0..cfg.num_experts {
            for (n, s) in plan::expert_tensors(cfg, l, e) {
                check(&n, &s)?;
            }
        }
    }
    let mtp = if mtp::held(src, cfg) { plan::mtp_tensors(cfg) } else { vec![] };
    for t in &mtp {
        check(&t.name, &t.shape)?;
    }
    Ok(Planned { dense, moe_layers, mtp })
}

/// What a package holds, by [`check_source`]: its dense tensors, its MoE layers and the
/// multi-token-prediction layers' tensors, each in the plan's order.
struct Planned {
    dense: Vec<plan::DenseTensor>,
    moe_layers: Vec<usize>,
    mtp: Vec<plan::DenseTensor>,
}

/// The package's metadata: every dense tensor and the expert region's parts in their formats
/// (offsets still to plan).
fn plan_meta(
    src: &dyn TensorSource,
    cfg: &ModelConfig,
    opts: &ConvertOptions,
    (tokenizer, origin): (TokenizerInfo, Origin<'_>),
    (dense, mtp): (&[plan::DenseTensor], &[plan::DenseTensor]),
    moe_layers: &[usize],
) -> Meta {
    let entry = |name: &str, (f, form): (Format, ScaleForm), shape: &[usize]| TensorEntry {
        name: name.into(),
        dtype: DType::of(f),
        shape: shape.to_vec(),
        group: f.group(),
        layout: {
            let (rows, cols) = match shape {
                [r, c] => (*r, *c),
                _ => (1, shape.iter().product()),
            };
            format!("{}{}", f.layout(rows, cols), form.mark())
        },
        offset: 0,
        length: 0,
        scales_offset: None,
        xxh3: None,
    };
    // the plan's format, or with QuantMode::File the one holding the source's values exactly
    let format = |name: &str, kind: plan::Kind, cols: usize| match (opts.quant, src.exact_format(name)) {
        (QuantMode::File | QuantMode::Ggml(_), Some(f)) => f,
        _ => (opts.quant.format(kind, cols), ScaleForm::Plain),
    };
    let entries = |list: &[plan::DenseTensor]| -> Vec<TensorEntry> {
        list.iter().map(|t| entry(&t.name, format(&t.name, t.kind, *t.shape.last().unwrap_or(&1)), &t.shape)).collect()
    };
    let tensors = entries(dense);
    let mtp = (!mtp.is_empty()).then(|| crate::package::MtpSection {
        layers: (cfg.num_hidden_layers..cfg.num_hidden_layers + cfg.features.nextn_layers).collect(),
        tensors: entries(mtp),
    });
    let experts = (!moe_layers.is_empty()).then(|| {
        // each layer's parts in their formats; one set for all layers where they agree
        let layer_parts = |l: usize| -> Vec<TensorEntry> {
            plan::expert_tensors(cfg, l, 0)
                .iter()
                .zip(["gate_proj", "up_proj", "down_proj"])
                .map(|((name, s), pname)| {
                    let mut e = entry(pname, format(name, plan::Kind::Expert, s[1]), s);
                    e.xxh3 = None;
                    e
                })
                .collect()
        };
        let each: Vec<Vec<TensorEntry>> = moe_layers.iter().map(|&l| layer_parts(l)).collect();
        let parts = if each.iter().all(|p| *p == each[0]) { each[0].clone() } else { each.concat() };
        ExpertRegion::planned(moe_layers.to_vec(), cfg.num_experts, parts)
    });
    Meta {
        format: FORMAT_NAME.into(),
        version: FIRST_VERSION, // raised by the writer's plan where the layout needs it
        name: origin.name.into(),
        converter: format!("moescope {}", env!("CARGO_PKG_VERSION")),
        model: cfg.clone(),
        quant: QuantInfo { mode: opts.quant.name().into(), description: opts.quant.description() },
        tokenizer,
        tensors,
        experts,
        default_pool_fraction: opts.default_pool_fraction,
        ignored: origin.ignored,
        synthetic: origin.synthetic,
        mtp,
    }
}

/// A progress bar of `total` bytes on a terminal (hidden elsewhere).
fn progress_bar(opts: &ConvertOptions, total: u64) -> ProgressBar {
    if !(opts.progress && std::io::stderr().is_terminal()) {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template(&format!(
            "{} {{bar:40}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} eta {{eta}} {{msg}}",
            opts.verb
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b
}

/// The dense tensors, in row chunks of at most ~16 M values.
fn write_dense(
    src: &dyn TensorSource,
    w: &mut PackageWriter,
    dense: &[plan::DenseTensor],
    opts: &ConvertOptions,
    bar: &ProgressBar,
) -> Result<(), ConvertError> {
    let mut x = Vec::new();
    let mut rows_out = EncodedRows::default();
    for t in dense {
        opts.check_cancel()?;
        let e = w.begin_dense()?;
        let form = e.scale_form();
        bar.set_message(t.name.clone());
        let f = e.format().unwrap_or(Format::F32);
        let (rows, cols) = e.rows_cols();
        // whole blocks of interleaved rows per chunk
        let x4 = f.interleaves(rows, cols);
        let chunk = ((16 << 20) / cols.max(1)).max(ROW_BLOCK) / ROW_BLOCK * ROW_BLOCK;
        let mut r0 = 0;
        while r0 < rows {
            let n = chunk.clamp(1, rows - r0);
            if !rows_out.fill(src, &t.name, (f, form), r0, n)? {
                src.read_rows(&t.name, r0, n, &mut x)?;
                encode_rows(f, &x, cols, x4, &mut rows_out.vals, &mut rows_out.scales);
            }
            let EncodedRows { vals, scales, mins, records } = &rows_out;
            w.write_values(vals)?;
            match form {
                ScaleForm::Plain => w.push_scales(scales),
                ScaleForm::Mins => {
                    w.push_scales(scales);
                    w.push_mins(mins);
                }
                ScaleForm::K4 | ScaleForm::K6 | ScaleForm::F16 | ScaleForm::F16Mins => w.push_scale_bytes(records),
                ScaleForm::Blocks(_) => {}
            }
            bar.inc(vals.len() as u64 + scales.len() as u64 * 4);
            r0 += n;
        }
        w.end_dense()?;
    }
    Ok(())
}

/// The experts of `region` (its MoE layers `moe_layers`): made a batch at a time on all cores
/// while the batch before is written, in table order (made, then written, the two took turns
/// and synth wrote at half the disk's speed).
fn write_experts(
    blobs: &dyn BlobSource,
    w: &mut PackageWriter,
    (region, moe_layers): (&ExpertRegion, &[usize]),
    opts: &ConvertOptions,
    bar: &ProgressBar,
) -> Result<(), ConvertError> {
    let batches: Vec<(usize, Vec<usize>)> = moe_layers
        .iter()
        .flat_map(|&l| {
            (0..region.num_experts).collect::<Vec<_>>().chunks(8).map(|c| (l, c.to_vec())).collect::<Vec<_>>()
        })
        .collect();
    type Made = Result<(usize, Vec<Vec<u8>>), ConvertError>;
    std::thread::scope(|scope| -> Result<(), ConvertError> {
        // two batches ahead at most: ~50 MB of blobs at the largest shapes
        let (tx, rx) = std::sync::mpsc::sync_channel::<Made>(2);
        scope.spawn(move || {
            for (l, batch) in batches {
                let made = opts
                    .check_cancel()
                    .and_then(|()| batch.par_iter().map(|&e| blobs.blob(region, l, e)).collect::<Result<Vec<_>, _>>());
                let failed = made.is_err();
                // a closed channel: the writer failed and returned its own error
                if tx.send(made.map(|m| (l, m))).is_err() || failed {
                    return;
                }
            }
        });
        let mut layer = None;
        for made in rx {
            let (l, made) = made?;
            if layer != Some(l) {
                bar.set_message(format!("experts of layer {l}"));
                layer = Some(l);
            }
            for blob in made {
                w.write_expert(&blob)?;
                bar.inc(blob.len() as u64);
            }
        }
        Ok(())
    })
}

/// Fail before writing when the file system holding `out` has less than `bytes` free (a
/// multi-GB package that fills the disk half way would fail late and leave no room).
fn check_free_space(out: &Path, bytes: u64) -> Result<(), ConvertError> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if let Some(free) = crate::sysinfo::free_disk_bytes(&dir)
        && free < bytes
    {
        return Err(ConvertError::File {
            path: out.to_path_buf(),
            msg: format!(
                "needs {:.2} GB but {} has {:.2} GB free",
                bytes as f64 / 1e9,
                dir.display(),
                free as f64 / 1e9
            ),
        });
    }
    Ok(())
}
