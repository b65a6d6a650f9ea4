//! How much memory a run may use, and how it is split before anything is loaded: the dense
//! weights, the KV cache (and a hybrid's recurrent state) at the context, the forward pass's
//! buffers and the runtime are fixed; the expert pool gets what is left less headroom for the page
//! cache and the kernel. An explicit pool that does not fit is refused with the largest that
//! does (the kernel's OOM killer gives no message at all); `auto` picks that largest pool, and a
//! shorter context when the default one would leave no useful pool.

use super::{EngineError, EngineOptions, PREFILL_CHUNK};
use crate::model::{KvCache, RunState};
use crate::model_config::ModelConfig;
use crate::package::Package;

/// What the process may use, and where the figure comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Allowance {
    pub bytes: u64,
    /// In words: "the memory cgroup's limit (/sys/fs/cgroup/memory/x)" or "MemAvailable".
    pub source: String,
    /// A cgroup limit counts the page cache (its share of the package's reads) as this
    /// process's; MemAvailable already leaves it out.
    pub cgroup: bool,
}

pub use crate::sysinfo::cgroup_limit;

/// What this process may use now.
pub fn allowance() -> Allowance {
    if let Some(dir) = crate::sysinfo::memory_cgroup_dir()
        && let Some(limit) = cgroup_limit(&dir)
    {
        return Allowance {
            bytes: limit,
            source: format!("the memory cgroup's limit ({})", dir.display()),
            cgroup: true,
        };
    }
    // what is free now, plus what this process already holds
    let avail = crate::sysinfo::available_memory_bytes() + crate::sysinfo::current_rss_bytes();
    Allowance { bytes: avail, source: "MemAvailable".into(), cgroup: false }
}

/// Memory kept free of the plan: the page cache's share (a cgroup charges the pages the
/// process's reads cache) and the kernel's, 4% and at least 256 MiB.
pub fn headroom(a: &Allowance) -> u64 {
    (a.bytes / 25).max(256 << 20)
}

/// The parts of the plan that do not depend on the pool, at a context of `ctx` positions.
pub trait FixedCost {
    fn fixed(&self, ctx: usize) -> u64;
}

impl<F: Fn(usize) -> u64> FixedCost for F {
    fn fixed(&self, ctx: usize) -> u64 {
        self(ctx)
    }
}

/// The pool and context chosen, and why, in one line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sizing {
    pub pool_bytes: u64,
    pub ctx: usize,
    pub line: String,
}

const MIB: f64 = (1u64 << 20) as f64;

/// Whole MiB, rounded down (a pool named as fitting must fit when asked for).
fn mib(b: u64) -> String {
    format!("{} MiB", b >> 20)
}

/// The shortest context `auto` goes down to.
pub const MIN_AUTO_CTX: usize = 2048;

/// The largest pool that fits beside `fixed` at `ctx`, in whole blobs (0 if none fits).
pub fn largest_pool(fixed: &dyn FixedCost, ctx: usize, a: &Allowance, blob: u64) -> u64 {
    let room = a.bytes.saturating_sub(fixed.fixed(ctx) + headroom(a));
    room / blob.max(1) * blob
}

/// `--cache-mb auto`: the largest pool that fits, at most all experts (`all`). With no context
/// asked for (`ctx` None), the default `default_ctx` is halved, down to [`MIN_AUTO_CTX`], while the
/// pool would hold fewer than `useful` blobs (one token's routes: layers x top-k).
pub fn auto(
    fixed: &dyn FixedCost,
    ctx: Option<usize>,
    default_ctx: usize,
    a: &Allowance,
    blob: u64,
    useful: u64,
    all: u64,
) -> Result<Sizing, String> {
    let mut c = ctx.unwrap_or(default_ctx);
    let mut pool = largest_pool(fixed, c, a, blob);
    let mut shortened = false;
    while ctx.is_none() && pool < useful * blob && c / 2 >= MIN_AUTO_CTX {
        c /= 2;
        pool = largest_pool(fixed, c, a, blob);
        shortened = true;
    }
    let pool = pool.min(all.div_ceil(blob) * blob);
    let rest = fixed.fixed(c);
    if pool < blob * useful.clamp(1, 8) {
        return Err(format!(
            "--cache-mb auto: {} may use {}, and the dense weights, KV at context {c}, buffers and runtime take {} plus {} headroom: no room for an expert pool (raise the limit, or lower --ctx-size)",
            a.source,
            mib(a.bytes),
            mib(rest),
            mib(headroom(a))
        ));
    }
    let line = format!(
        "pool {} ({:.0}% of the experts) = {} from {} less {} for dense weights, KV, buffers and runtime at context {c}{} less {} headroom",
        mib(pool),
        100.0 * pool as f64 / all.max(1) as f64,
        mib(a.bytes),
        a.source,
        mib(rest),
        if shortened {
            format!(" (shortened from {default_ctx} so the pool holds a token's {useful} experts)")
        } else {
            String::new()
        },
        mib(headroom(a)),
    );
    Ok(Sizing { pool_bytes: pool, ctx: c, line })
}

/// An explicit pool of `pool` bytes: refused (unless `force`) when the plan exceeds the
/// allowance; with `force`, a warning.
pub fn check_explicit(
    fixed: &dyn FixedCost,
    ctx: usize,
    pool: u64,
    a: &Allowance,
    blob: u64,
    force: bool,
) -> Result<Option<String>, String> {
    let plan = fixed.fixed(ctx) + pool + headroom(a);
    if plan <= a.bytes {
        return Ok(None);
    }
    let fits = largest_pool(fixed, ctx, a, blob);
    let msg = format!(
        "--cache-mb {:.0}: the memory plan ({} pool + {} dense+KV+buffers+runtime at context {ctx} + {} headroom = {}) exceeds the {} that {} allows; the largest pool that fits is {} ({})",
        pool as f64 / MIB,
        mib(pool),
        mib(fixed.fixed(ctx)),
        mib(headroom(a)),
        mib(plan),
        mib(a.bytes),
        a.source,
        mib(fits),
        if fits > 0 { "or --cache-mb auto" } else { "lower --ctx-size" },
    );
    if force {
        Ok(Some(format!("{msg}; running anyway (--force)")))
    } else {
        Err(format!("{msg}; --force runs it anyway"))
    }
}

/// The plan's parts that do not depend on the pool, before loading, as a function of the
/// context: `dense` bytes of dense weights, the KV cache (and recurrent state), the forward pass's
/// buffers and the runtime: code, tokenizer and metadata, ~10x the metadata's `meta_len` bytes of
/// JSON (measured: 179 MiB for the Qwen3 tokenizer's 12 MB; measured again after load for the
/// plan `Engine::memory_plan` reports).
pub fn fixed_before_load(cfg: &ModelConfig, dense: u64, meta_len: u64) -> impl Fn(usize) -> u64 + '_ {
    let runtime = (64 << 20) + 10 * meta_len;
    let buffers = RunState::new(cfg, PREFILL_CHUNK).bytes() + 4 * cfg.vocab_size as u64;
    move |ctx| dense + KvCache::bytes_at_capacity(cfg, ctx) + buffers + runtime
}

/// Before anything is loaded: check an explicit pool against the memory the process may use
/// (refused unless `--force`), or size an `auto` one (the default when the package does not fit
/// in half of it), choosing a shorter context when the default would leave no useful pool.
/// Returns the auto sizing's line and whether the pool is auto-sized.
pub(super) fn plan_memory(
    pkg: &Package,
    opts: &mut EngineOptions,
    a: &Allowance,
    fits: bool,
    warnings: &mut Vec<String>,
) -> Result<(Option<String>, bool), EngineError> {
    let Some(sc) = opts.stream.as_mut() else { return Ok((None, false)) };
    let Some(ex) = pkg.meta.experts.as_ref() else { return Ok((None, false)) };
    let cfg = &pkg.meta.model;
    let sizes = pkg.sizes();
    let fixed = fixed_before_load(cfg, sizes.dense, pkg.header.meta_len);
    let default_ctx = cfg.max_position_embeddings.min(8192);
    let ctx = opts.ctx_size.unwrap_or(default_ctx);
    let useful = (ex.layers.len() * cfg.num_experts_per_tok) as u64;
    match sc.budget_bytes {
        Some(b) => {
            if let Some(w) = check_explicit(&fixed, ctx, b, a, sizes.blob, sc.force).map_err(EngineError::Setup)? {
                warnings.push(w);
            }
            Ok((None, false))
        }
        None if sc.auto || (!fits && pkg.meta.default_pool_fraction.is_none()) => {
            let s = auto(&fixed, opts.ctx_size, default_ctx, a, sizes.blob, useful, sizes.experts)
                .map_err(EngineError::Setup)?;
            sc.budget_bytes = Some(s.pool_bytes);
            opts.ctx_size = Some(s.ctx);
            Ok((Some(s.line), true))
        }
        None => Ok((None, false)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn cap(bytes: u64) -> Allowance {
        Allowance { bytes, source: "test".into(), cgroup: true }
    }

    #[test]
    fn auto_takes_what_is_left_and_shortens_the_context_only_when_it_must() {
        let blob = 3 << 20;
        // 1 GiB fixed + 1 MiB per 16 positions of context
        let fixed = |ctx: usize| GIB + (ctx as u64) * (1 << 16);
        let all = 6144 * blob;
        // 8 GiB: 8192 positions cost 512 MiB; 8 GiB - 1.5 GiB - 327 MiB headroom
        let s = auto(&fixed, None, 8192, &cap(8 * GIB), blob, 384, all).unwrap();
        assert_eq!(s.ctx, 8192);
        let want = (8 * GIB - GIB - 512 * (1 << 20) - 8 * GIB / 25) / blob * blob;
        assert_eq!(s.pool_bytes, want);
        // 2.5 GiB less 256 MiB headroom: at 8192 the pool would hold (2560 - 1536 - 256) / 3 =
        // 256 blobs < 384, so the context halves to 4096 (341 < 384), then 2048 (384), the floor
        let s = auto(&fixed, None, 8192, &cap(5 * GIB / 2), blob, 384, all).unwrap();
        assert_eq!(s.ctx, 2048);
        assert!(s.line.contains("shortened from 8192"), "{}", s.line);
        // an explicit context is kept
        let s = auto(&fixed, Some(8192), 8192, &cap(5 * GIB / 2), blob, 384, all).unwrap();
        assert_eq!(s.ctx, 8192);
        // never more than all experts
        let s = auto(&fixed, None, 8192, &cap(100 * GIB), blob, 384, all).unwrap();
        assert_eq!(s.pool_bytes, all);
        // nothing left
        assert!(auto(&fixed, None, 8192, &cap(GIB), blob, 384, all).is_err());
    }

    #[test]
    fn explicit_pools_past_the_allowance_are_refused_with_the_largest_that_fits() {
        let blob = 1 << 20;
        let fixed = |_: usize| GIB;
        let a = cap(4 * GIB);
        // 4 GiB - 1 GiB - 256 MiB headroom = 2816 MiB
        assert_eq!(check_explicit(&fixed, 4096, 2816 << 20, &a, blob, false), Ok(None));
        let e = check_explicit(&fixed, 4096, 2817 << 20, &a, blob, false).unwrap_err();
        assert!(e.contains("largest pool that fits is 2816 MiB") && e.contains("--force"), "{e}");
        let w = check_explicit(&fixed, 4096, 3000 << 20, &a, blob, true).unwrap();
        assert!(w.is_some_and(|w| w.contains("running anyway")));
    }

    #[test]
    fn cgroup_limits_are_read_from_either_version() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(cgroup_limit(d.path()), None);
        std::fs::write(d.path().join("memory.limit_in_bytes"), "4294967296\n").unwrap();
        assert_eq!(cgroup_limit(d.path()), Some(4 * GIB));
        // v1 without a limit
        std::fs::write(d.path().join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(cgroup_limit(d.path()), None);
        std::fs::write(d.path().join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit(d.path()), None);
        std::fs::write(d.path().join("memory.max"), "1073741824\n").unwrap();
        assert_eq!(cgroup_limit(d.path()), Some(GIB));
    }
}
