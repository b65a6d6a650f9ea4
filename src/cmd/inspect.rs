//! `moescope inspect FILE [--json]`: what a package holds and how it is laid out.

use std::collections::BTreeMap;

use anyhow::Result;
use moescope::convert::gguf::exact::{package_bytes, runs_as};
use moescope::convert::gguf::{self, Value};
use moescope::model::LayerKind;
use moescope::model_config::{ExpertAct, ModelConfig};
use moescope::package::layout::ScaleForm;
use moescope::package::{OpenOptions, Package};
use serde_json::json;

use crate::cli::InspectArgs;

pub fn run(a: &InspectArgs) -> Result<()> {
    if gguf::is_gguf(&a.file) {
        return inspect_gguf(a);
    }
    let pkg = Package::open_with(&a.file, OpenOptions { verify_dense: true })?;
    pkg.verify_mtp()?;
    let m = &pkg.meta;
    let moescope::package::PackageSizes { dense, experts, blob } = pkg.sizes();
    // per type: tensors, bytes, weights
    let mut by_type: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
    for t in &m.tensors {
        // a GGUF file's blocks by their own type's name, not the q8 matrix they compute as
        let key = match t.scale_form() {
            ScaleForm::Blocks(bt) => bt.name().to_string(),
            _ => format!("{:?}", t.dtype).to_lowercase(),
        };
        let e = by_type.entry(key).or_default();
        e.0 += 1;
        e.1 += t.length;
        e.2 += t.shape.iter().product::<usize>() as u64;
    }
    let ex = m.experts.as_ref();
    // parts of their own per layer (formats that differ by layer) carry their layer
    let parts: Vec<_> = ex
        .map(|e| {
            e.parts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let w = p.shape.iter().product::<usize>() as u64;
                    let mut v = json!({"name": p.name, "dtype": p.dtype, "shape": p.shape, "group": p.group, "layout": p.layout,
                                       "bytes": p.length, "bits_per_weight": bits(p.length, w)});
                    if e.per_layer() {
                        v["layer"] = json!(e.layers[i / 3]);
                    }
                    v
                })
                .collect()
        })
        .unwrap_or_default();
    let v = json!({
        "file": a.file.display().to_string(),
        "file_bytes": pkg.file_size(),
        "format_version": pkg.header.version,
        "name": m.name,
        "converter": m.converter,
        "config": m.model,
        "ignored": m.ignored,
        "synthetic": m.synthetic,
        "quant": m.quant,
        "tokenizer": m.tokenizer.tokenizer_json.is_some(),
        "chat_template": m.tokenizer.chat_template.is_some(),
        "regions": {
            "metadata": {"offset": pkg.header.meta_offset, "bytes": pkg.header.meta_len},
            "dense": {"offset": pkg.header.dense_offset, "bytes": dense, "tensors": m.tensors.len()},
            "experts": {"offset": pkg.header.expert_offset, "bytes": experts,
                        "layers": ex.map(|e| e.layers.len()).unwrap_or(0),
                        "experts_per_layer": ex.map(|e| e.num_experts).unwrap_or(0),
                        "bytes_per_expert": blob,
                        "bytes_per_expert_by_layer": ex.map(|e| (0..e.layers.len()).map(|i| e.len_of(i)).collect::<Vec<_>>()),
                        "parts": parts},
            "mtp": m.mtp.as_ref().map(|s| json!({
                "layers": s.layers, "tensors": s.tensors.len(), "offset": s.extent().0, "bytes": s.extent().1})),
        },
        "dense_by_type": by_type.iter().map(|(k, (n, b, w))| (k.clone(), json!({"tensors": n, "bytes": b, "weights": w, "bits_per_weight": bits(*b, *w)}))).collect::<serde_json::Map<_, _>>(),
    });
    if a.json {
        println!("{v}");
        return Ok(());
    }
    let c = &m.model;
    let mb = |b: u64| format!("{:.2} MB", b as f64 / 1e6);
    println!("{}  ({}, format v{}, {})", a.file.display(), m.name, pkg.header.version, mb(pkg.file_size()));
    if let Some(s) = &m.synthetic {
        println!(
            "SYNTHETIC     shape {}, seed {}: {} (the text is noise; sizes and speed are real)",
            s.shape, s.seed, s.weights
        );
    }
    println!(
        "architecture  {} ({}), {} layers ({} MoE), hidden {}, vocab {}",
        c.arch.name(),
        c.arch.hf_class(),
        c.num_hidden_layers,
        c.moe_layers().len(),
        c.hidden_size,
        c.vocab_size
    );
    println!(
        "attention     {}{} query heads, {} kv heads, head_dim {}, rope_theta {}{}",
        if c.hybrid.is_some() { "gated, " } else { "" },
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.rope_theta,
        if c.rotary_dim() < c.head_dim {
            format!(", RoPE on {} of {} dims", c.rotary_dim(), c.head_dim)
        } else {
            String::new()
        }
    );
    print_features(c);
    if let Some(hy) = &c.hybrid {
        // one letter a layer: L linear attention (Gated DeltaNet), F full attention
        let kinds: String = hy
            .layer_types
            .iter()
            .map(|k| match k {
                LayerKind::LinearAttention => 'L',
                LayerKind::FullAttention => 'F',
            })
            .collect();
        println!(
            "layer kinds   {kinds} ({} linear attention, {} full attention)",
            c.num_hidden_layers - c.attention_layers(),
            c.attention_layers()
        );
        println!(
            "linear attn   Gated DeltaNet: {} key heads x {}, {} value heads x {}, conv kernel {}; state {} per layer",
            hy.key_heads,
            hy.key_head_dim,
            hy.value_heads,
            hy.value_head_dim,
            hy.conv_kernel,
            mb(((hy.state_len() + hy.conv_state_len()) * 4) as u64)
        );
        println!("shared expert intermediate {}, gated", hy.shared_expert_intermediate_size);
    }
    println!(
        "experts       {} per layer, top-{}, intermediate {}, norm_topk_prob {}",
        c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.norm_topk_prob
    );
    println!("context       max {} positions; eos ids {:?}", c.max_position_embeddings, c.eos_token_ids);
    println!("quantization  {}: {}", m.quant.mode, m.quant.description);
    for i in &m.ignored {
        println!("not converted {i}");
    }
    println!(
        "tokenizer     {}; chat template {}",
        if m.tokenizer.tokenizer_json.is_some() { "yes" } else { "none (token ids only)" },
        if m.tokenizer.chat_template.is_some() { "yes" } else { "no" }
    );
    println!("metadata      {} at offset {}", mb(pkg.header.meta_len), pkg.header.meta_offset);
    println!("dense         {} in {} tensors at offset {}", mb(dense), m.tensors.len(), pkg.header.dense_offset);
    for (k, (n, b, w)) in &by_type {
        println!("  {k:<6} {n:>5} tensors  {}  {:.2} bits a weight", mb(*b), bits(*b, *w));
    }
    if let Some(e) = ex {
        println!(
            "experts       {} in {} blobs ({} layers x {}) at offset {}",
            mb(experts),
            e.table.len(),
            e.layers.len(),
            e.num_experts,
            pkg.header.expert_offset
        );
        if e.layer_lens.is_empty() {
            println!("  per expert  {blob} bytes (one read), 4096-aligned");
        } else {
            let lens: Vec<String> = e.layer_lens.iter().map(u64::to_string).collect();
            println!(
                "  per expert  {} bytes by layer (one read, 4096-aligned; a pool slot holds {blob})",
                lens.join(" ")
            );
        }
        for (i, p) in e.parts.iter().enumerate() {
            let at = if e.per_layer() { format!("layer {:<3} ", e.layers[i / 3]) } else { String::new() };
            let group = p.group.map_or(String::new(), |g| format!(" group {g}"));
            let w = p.shape.iter().product::<usize>() as u64;
            let form = match p.scale_form() {
                ScaleForm::K4 => " (k4 records)".to_string(),
                ScaleForm::K6 => " (k6 records)".to_string(),
                ScaleForm::F16 => " (f16 scales)".to_string(),
                ScaleForm::F16Mins => " (f16 scales and mins)".to_string(),
                ScaleForm::Mins => " (mins)".to_string(),
                ScaleForm::Plain => String::new(),
                ScaleForm::Blocks(t) => format!(" ({} blocks)", t.name()),
            };
            println!(
                "  {at}{:<10} {:?} {:?}{group}{form}: {} bytes, {:.2} bits a weight",
                p.name,
                p.dtype,
                p.shape,
                p.length,
                bits(p.length, w)
            );
        }
    }
    if let Some(s) = &m.mtp {
        let (offset, bytes) = s.extent();
        println!(
            "mtp           {} in {} tensors of layer(s) {:?} at offset {offset} (multi-token prediction: kept, not run)",
            mb(bytes),
            s.tensors.len(),
            s.layers,
        );
    }
    Ok(())
}

/// A GGUF file, read without converting: its metadata (long arrays summed up) and tensors, by
/// type and one by one.
fn inspect_gguf(a: &InspectArgs) -> Result<()> {
    let g = gguf::open(&a.file)?;
    // per type: tensors, bytes, ggml id, weights, bytes in a package
    let mut by_type: BTreeMap<&str, (usize, u64, u32, u64, Option<u64>)> = BTreeMap::new();
    for t in &g.tensors {
        let e = by_type.entry(t.ty.name).or_insert((0, 0, t.ty.id, 0, Some(0)));
        e.0 += 1;
        e.1 += t.bytes;
        e.3 += t.ne.iter().product::<u64>();
        e.4 = e.4.zip(package_bytes(t.ty.id, &t.ne)).map(|(a, b)| a + b);
    }
    // a tokenizer's 150k tokens are not for the terminal
    let short = |v: &Value| match v {
        Value::Array(ty, items) if items.len() > 16 => json!(format!("[{} {ty} values]", items.len())),
        v => v.to_json(),
    };
    if a.json {
        let v = json!({
            "file": a.file.display().to_string(),
            "file_bytes": g.file_size,
            "format": "gguf",
            "version": g.version,
            "architecture": g.architecture(),
            "alignment": g.alignment,
            "data_offset": g.data_start,
            "metadata": g.metadata.iter().map(|(k, v)| (k.clone(), short(v))).collect::<serde_json::Map<_, _>>(),
            "tensors": g.tensors.iter().map(|t| json!({"name": t.name, "type": t.ty.name, "ne": t.ne, "offset": t.offset, "bytes": t.bytes})).collect::<Vec<_>>(),
            "by_type": by_type.iter().map(|(k, (n, b, id, w, pb))| (k.to_string(), json!({
                "tensors": n, "bytes": b, "weights": w, "runs_as": runs_as(*id),
                "bits_per_weight": bits(*b, *w),
                "package_bytes": pb, "package_bits_per_weight": pb.map(|pb| bits(pb, *w)),
            }))).collect::<serde_json::Map<_, _>>(),
        });
        println!("{v}");
        return Ok(());
    }
    let mb = |b: u64| format!("{:.2} MB", b as f64 / 1e6);
    println!(
        "{}  (GGUF v{}, {}, {}, {} tensors)",
        a.file.display(),
        g.version,
        g.architecture().unwrap_or("no architecture"),
        mb(g.file_size),
        g.tensors.len()
    );
    println!("metadata:");
    for (k, v) in &g.metadata {
        println!("  {k} = {}", short(v));
    }
    println!("tensors by type (bits a weight in the file, and how moescope runs them keeping its values):");
    for (t, (n, b, id, w, pb)) in &by_type {
        let package = pb.map_or(String::new(), |pb| format!(": {:.2} bits a weight", bits(pb, *w)));
        println!("  {t:<8} {n:>6} tensors  {:>10}  {:>5.2} bits  {}{package}", mb(*b), bits(*b, *w), runs_as(*id));
    }
    // the first layer's and the rest's (every layer has the same tensors; --json lists all)
    println!("tensors (blk.0 and outside the layers):");
    for t in g.tensors.iter().filter(|t| !t.name.starts_with("blk.") || t.name.starts_with("blk.0.")) {
        println!("  {:<36} {:<8} {:?}  {}", t.name, t.ty.name, t.ne, mb(t.bytes));
    }
    Ok(())
}

/// What a family adds to the common layer (gpt-oss's windows, sinks, biases, YaRN, activation).
fn print_features(c: &ModelConfig) {
    let f = &c.features;
    if let Some(s) = &f.sliding {
        // one letter a layer: S sliding window, F full attention
        let kinds: String = (0..c.num_hidden_layers).map(|l| if c.window(l).is_some() { 'S' } else { 'F' }).collect();
        println!("layer kinds   {kinds} (window {} in {} of {} layers)", s.window, s.layers.len(), c.num_hidden_layers);
    }
    let mut extras = vec![];
    if f.attention_bias {
        extras.push("q/k/v/o biases".to_string());
    }
    if f.attention_sinks {
        extras.push("a sink per head".to_string());
    }
    if let Some(y) = &f.rope_yarn {
        extras.push(format!(
            "YaRN x{} over {} positions (attention factor {:.4})",
            y.factor, y.original_max_position_embeddings, y.attention_factor
        ));
    }
    if !extras.is_empty() {
        println!("attention +   {}", extras.join(", "));
    }
    if let ExpertAct::ClampedSwiglu { alpha, limit } = f.expert_act {
        let bias = if f.expert_bias { "biases on gate, up and down; " } else { "" };
        println!("experts +     {bias}clamped SwiGLU (limit {limit}, alpha {alpha}, (up + 1) * glu)");
    }
}

/// Bits a weight of `bytes` holding `weights` weights.
fn bits(bytes: u64, weights: u64) -> f64 {
    8.0 * bytes as f64 / weights.max(1) as f64
}
