//! `moescope plan`: the decode and prefill speed a model should reach on this machine within a
//! memory allowance, before downloading it. Every constant is a byte count of the model or a
//! probe of this machine; none is fitted to measured runs.
//!
//! Decode, per token (2 cores overlap little of a read with compute, so the terms add):
//!
//! ```text
//! memory = (dense weights a token reads + layers x top-k expert blobs) / memory bandwidth
//! disk   = miss rate x layers x top-k expert blobs / disk bandwidth (O_DIRECT, random blobs)
//! time   = memory + disk
//! ```
//!
//! The miss rate comes from the simulator (the foresight policy, no prefetch) at the pool `auto`
//! would size, over a routing trace: one the user gives (never the run being predicted), or
//! uniform random routing, the worst case for a cache, when none is given.
//!
//! Prefill, per chunk of `PREFILL_CHUNK` tokens: compute (2 x active parameters x tokens / the probed
//! throughput of the q4 kernels) plus the chunk's expert reads (a chunk touches nearly every
//! expert of a layer: the non-resident ones are read once per chunk) plus its weight traffic.

use serde::Serialize;

use crate::convert::QuantMode;
use crate::convert::plan::{self as tensors, Kind};
use crate::engine::sizing::{self, Allowance};
use crate::experts::PolicyKind;
use crate::experts::routing_log::{Header, Record};
use crate::experts::sim::{self, SimPolicy};
use crate::model::KvTypes;
use crate::model_config::ModelConfig;
use crate::package::Package;
use crate::package::layout::{DENSE_ALIGN, EXPERT_ALIGN, align_up};

/// What a model costs, in bytes, whatever it is described by.
#[derive(Debug, Clone, Serialize)]
pub struct ModelSizes {
    #[serde(skip)]
    pub cfg: ModelConfig,
    /// All dense tensors (what stays in memory).
    pub dense_bytes: u64,
    /// What a decode token reads of them (one embedding row, the rest whole).
    pub dense_decode_bytes: u64,
    /// One expert blob (gate, up, down, scales, padding): the longest, what a pool slot holds.
    pub blob_bytes: u64,
    /// Every expert blob (layers' blob lengths may differ: a GGUF's mixes).
    pub experts_total: u64,
    pub moe_layers: usize,
    /// Parameters one token uses (dense without the embedding, plus top-k experts per layer).
    pub active_params: u64,
    /// Bytes of the package's metadata (the tokenizer is most of it), for the runtime estimate.
    pub meta_bytes: u64,
}

impl ModelSizes {
    pub fn experts_bytes(&self) -> u64 {
        self.experts_total
    }

    /// Expert blobs a decode token reads (top-k of every MoE layer).
    pub fn expert_token_bytes(&self) -> u64 {
        self.experts_total * self.cfg.num_experts_per_tok as u64 / self.cfg.num_experts.max(1) as u64
    }

    /// From a package's index.
    pub fn of_package(pkg: &Package) -> ModelSizes {
        let c = pkg.meta.model.clone();
        let h = c.hidden_size;
        let mut dense_decode = 0;
        let mut params = 0u64;
        for t in &pkg.meta.tensors {
            let n: usize = t.shape.iter().product();
            if t.name == "model.embed_tokens.weight" {
                let f = t.format().unwrap_or(moescope_kernels::Format::F32);
                dense_decode += (f.data_bytes(1, h) + f.scale_bytes(1, h)) as u64;
                if c.tie_word_embeddings {
                    dense_decode += t.length;
                    params += n as u64;
                }
            } else {
                dense_decode += t.length;
                params += n as u64;
            }
        }
        let moe_layers = pkg.meta.experts.as_ref().map_or(0, |e| e.layers.len());
        params += (moe_layers * c.num_experts_per_tok * 3 * h * c.moe_intermediate_size) as u64;
        ModelSizes {
            dense_bytes: pkg.sizes().dense,
            dense_decode_bytes: dense_decode,
            blob_bytes: pkg.sizes().blob,
            experts_total: pkg.meta.experts.as_ref().map_or(0, |e| e.total_len()),
            moe_layers,
            active_params: params,
            meta_bytes: pkg.header.meta_len,
            cfg: c,
        }
    }

    /// From a configuration and the quantization a package of it would use (the converter's
    /// plan: the same formats, alignments and blob layout).
    pub fn of_config(c: &ModelConfig, q: QuantMode) -> ModelSizes {
        let h = c.hidden_size;
        let bytes = |k: Kind, shape: &[usize]| -> u64 {
            let (rows, cols) = match shape {
                [r, cc] => (*r, *cc),
                _ => (1, shape.iter().product()),
            };
            // GGUF blocks (`--quant q4_k | q2_k | iq4_xs`) take the type's bytes where rows are
            // whole super-blocks, as `convert::requant_blocks` writes them
            if let QuantMode::Ggml(t) = q
                && matches!(k, Kind::Linear | Kind::Expert)
                && cols.is_multiple_of(moescope_kernels::ggml::QK_K)
            {
                return align_up(t.bytes_of(rows * cols) as u64, DENSE_ALIGN);
            }
            let f = q.format(k, cols);
            align_up((f.data_bytes(rows, cols) + f.scale_bytes(rows, cols)) as u64, DENSE_ALIGN)
        };
        let (mut dense, mut dense_decode, mut params) = (0, 0, 0u64);
        for t in tensors::dense_tensors(c) {
            let b = bytes(t.kind, &t.shape);
            dense += b;
            if t.kind == Kind::Embedding {
                dense_decode += bytes(t.kind, &[1, h]);
            } else {
                dense_decode += b;
                params += t.shape.iter().product::<usize>() as u64;
            }
        }
        let moe = c.moe_layers();
        let blob = moe.first().map_or(0, |&l| {
            let parts: u64 = tensors::expert_tensors(c, l, 0).iter().map(|(_, s)| bytes(Kind::Expert, s)).sum();
            align_up(parts, EXPERT_ALIGN)
        });
        params += (moe.len() * c.num_experts_per_tok * 3 * h * c.moe_intermediate_size) as u64;
        // the tokenizer a package embeds: ~12 MB (Qwen3) to ~15 MB (Qwen3.5, minified)
        let meta = if c.vocab_size > 200_000 { 15 << 20 } else { 12 << 20 };
        ModelSizes {
            cfg: c.clone(),
            dense_bytes: dense,
            dense_decode_bytes: dense_decode,
            blob_bytes: blob,
            experts_total: blob * (moe.len() * c.num_experts) as u64,
            moe_layers: moe.len(),
            active_params: params,
            meta_bytes: meta,
        }
    }
}

/// This machine's figures.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
pub struct Probes {
    /// Random expert-sized O_DIRECT reads, bytes/s.
    pub disk_bps: f64,
    /// Memory read bandwidth at the thread count, bytes/s.
    pub mem_bps: f64,
    /// q4 matrix products on a batch of 64 tokens at the thread count, FLOP/s.
    pub flops: f64,
    pub threads: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Forecast {
    pub allowance_bytes: u64,
    pub pool_bytes: u64,
    pub pool_fraction: f64,
    pub ctx: usize,
    /// The simulator's hit rate at that pool (0..1).
    pub hit_rate: f64,
    pub routing: String,
    pub decode_tps: f64,
    pub decode_ms: DecodeTerms,
    pub decode_binding: &'static str,
    pub prefill_tps: f64,
    pub prefill_binding: &'static str,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct DecodeTerms {
    pub memory: f64,
    pub disk: f64,
}

/// The hit rate of a pool holding `fraction` of the experts, replaying `trace` (or uniform
/// routing of the model's shape over 128 tokens, seed 1: the pool fills within a few).
pub fn hit_rate(s: &ModelSizes, fraction: f64, trace: Option<(&Header, &[Record])>) -> (f64, String) {
    let owned;
    let (h, recs, what) = match trace {
        Some((h, r)) => (h, r, format!("the given trace ({} records)", r.len())),
        None => {
            owned = sim::synthetic(
                s.moe_layers.max(1),
                s.cfg.num_experts.max(1),
                s.cfg.num_experts_per_tok.max(1),
                128,
                0.0,
                0.0,
                1,
                s.blob_bytes,
            );
            (&owned.0, owned.1.as_slice(), "uniform random routing (the worst case; none given)".to_string())
        }
    };
    let capacity = (fraction * (h.moe_layers.len() * h.num_experts) as f64).floor() as usize;
    if capacity == 0 {
        return (0.0, what);
    }
    let steps = sim::steps(recs);
    let r = sim::simulate(h, &steps, capacity, SimPolicy::Policy(PolicyKind::Foresight));
    (r.hit_pct / 100.0, what)
}

/// The forecast at allowance `a` (a context of `ctx`, or what `auto` would choose).
pub fn forecast(
    s: &ModelSizes,
    p: &Probes,
    a: &Allowance,
    (ctx, kv): (Option<usize>, KvTypes),
    trace: Option<(&Header, &[Record])>,
) -> Result<Forecast, String> {
    let c = &s.cfg;
    let all = s.experts_bytes();
    let default_ctx = c.max_position_embeddings.min(8192);
    let fixed = sizing::fixed_before_load(c, (s.dense_bytes, s.meta_bytes), kv, sizing::Sequences::default());
    // as Engine::load: no pool when the model fits in half the allowance
    let fits = s.dense_bytes + all <= a.bytes / 2;
    let (pool, ctx) = if fits {
        (all, ctx.unwrap_or(default_ctx))
    } else {
        let useful = (s.moe_layers * c.num_experts_per_tok) as u64;
        let z = sizing::auto(&fixed, ctx, default_ctx, a, s.blob_bytes, useful, all)?;
        (z.pool_bytes, z.ctx)
    };
    let fraction = pool as f64 / all.max(1) as f64;
    let (hit, routing) = if fits { (1.0, "all experts resident".into()) } else { hit_rate(s, fraction, trace) };
    let mem_s = (s.dense_decode_bytes + s.expert_token_bytes()) as f64 / p.mem_bps;
    let disk_s = (1.0 - hit) * s.expert_token_bytes() as f64 / p.disk_bps;
    let decode_tps = 1.0 / (mem_s + disk_s);
    // prefill: a chunk of PREFILL_CHUNK tokens
    let chunk = crate::engine::PREFILL_CHUNK as f64;
    let compute_s = 2.0 * s.active_params as f64 * chunk / p.flops;
    let per_layer =
        c.num_experts as f64 * (1.0 - (1.0 - c.num_experts_per_tok as f64 / c.num_experts as f64).powf(chunk));
    let touched = per_layer * s.experts_total as f64 / c.num_experts.max(1) as f64;
    let read_s = (1.0 - hit) * touched / p.disk_bps;
    let traffic_s = (s.dense_decode_bytes as f64 + touched) / p.mem_bps;
    let prefill_tps = chunk / (compute_s + read_s + traffic_s);
    let prefill_binding = if read_s > compute_s.max(traffic_s) {
        "disk"
    } else if traffic_s > compute_s {
        "memory bandwidth"
    } else {
        "compute"
    };
    Ok(Forecast {
        allowance_bytes: a.bytes,
        pool_bytes: pool,
        pool_fraction: fraction,
        ctx,
        hit_rate: hit,
        routing,
        decode_tps,
        decode_ms: DecodeTerms { memory: mem_s * 1e3, disk: disk_s * 1e3 },
        decode_binding: if disk_s > mem_s { "disk" } else { "memory bandwidth" },
        prefill_tps,
        prefill_binding,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_from_a_config_match_the_package_written_from_it() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("s.moe");
        let spec = crate::synth::SynthSpec {
            shape: crate::synth::shapes::find("qwen3-next-80b-a3b").unwrap(),
            layers: Some(4),
            experts: Some(10),
            vocab: Some(1024),
            quant: QuantMode::Q4 { max_group: 32 },
            seed: 0,
        };
        crate::synth::synthesize(&spec, &out, false, None).unwrap();
        let pkg = Package::open(&out).unwrap();
        let (a, b) = (ModelSizes::of_package(&pkg), ModelSizes::of_config(&spec.config().unwrap(), spec.quant));
        assert_eq!(a.blob_bytes, b.blob_bytes);
        assert_eq!(a.dense_decode_bytes, b.dense_decode_bytes);
        assert_eq!(a.active_params, b.active_params);
        // the package pads between tensors and regions; the plan counts each tensor's padding
        assert!(a.dense_bytes.abs_diff(b.dense_bytes) < 4096, "{} vs {}", a.dense_bytes, b.dense_bytes);
    }

    #[test]
    fn uniform_routing_hits_about_the_pool_fraction() {
        let c = crate::synth::shapes::find("qwen3-30b-a3b").unwrap().config();
        let s = ModelSizes::of_config(&c, QuantMode::Q4 { max_group: 32 });
        // with no reuse to exploit, any policy hits about as often as the pool is large
        for f in [0.1, 0.5] {
            let (h, _) = hit_rate(&s, f, None);
            assert!((h - f).abs() < 0.06, "pool {f}: hit {h}");
        }
    }
}
