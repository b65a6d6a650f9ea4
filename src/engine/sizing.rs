//! How much memory a run may use, and how it is split before anything is loaded: the dense
//! weights, the KV cache (and a hybrid's recurrent state) at the context, the forward pass's
//! buffers and the runtime are fixed; the expert pool gets what is left less headroom for the page
//! cache and the kernel. An explicit pool that does not fit is refused with the largest that
//! does (the kernel's OOM killer gives no message at all); `auto` picks that largest pool, and a
//! shorter context when the default one would leave no useful pool.

use super::{EngineError, EngineOptions, PREFILL_CHUNK};
use crate::model::{KvCache, KvTypes, RunState};
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

/// What a server adds to the plan: a KV cache (and recurrent state) per slot, each at the full
/// context, one step's rows for a prompt chunk beside the other slots' tokens, and the prefix
/// cache's budget. One slot and no cache: `run`, `chat`, the workbench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sequences {
    pub slots: usize,
    pub cache_bytes: u64,
    /// Defaults rather than asked for: where they do not fit, the prefix cache and then the
    /// slots shrink to what does (with a warning) instead of being refused.
    pub shrink_slots: bool,
    pub shrink_cache: bool,
}

impl Default for Sequences {
    fn default() -> Sequences {
        Sequences { slots: 1, cache_bytes: 0, shrink_slots: false, shrink_cache: false }
    }
}

impl Sequences {
    /// A server's: `slots` and `cache_bytes` as asked, or by default 4 slots and a prefix cache
    /// of an eighth of what the process may use, at most 1 GiB, which shrink to fit.
    pub fn server(slots: Option<usize>, cache_bytes: Option<u64>, a: &Allowance) -> Sequences {
        Sequences {
            slots: slots.unwrap_or(4),
            cache_bytes: cache_bytes.unwrap_or((a.bytes / 8).min(1 << 30)),
            shrink_slots: slots.is_none(),
            shrink_cache: cache_bytes.is_none(),
        }
    }
}

/// The plan's parts that do not depend on the pool, before loading: `dense` bytes of dense
/// weights, the runtime (code, tokenizer and metadata, ~10x the metadata's `meta_len` bytes of
/// JSON: measured 179 MiB for the Qwen3 tokenizer's 12 MB; measured again after load for the
/// plan `Engine::memory_plan` reports), one position's logits, and a prompt chunk's buffers
/// (made once: a server's plan asks at many slot counts).
pub struct Fixed<'c> {
    cfg: &'c ModelConfig,
    kv: KvTypes,
    base: u64,
    chunk_buffers: u64,
}

impl Fixed<'_> {
    /// `kv`: the KV cache's element types.
    pub fn new(cfg: &ModelConfig, dense: u64, meta_len: u64, kv: KvTypes) -> Fixed<'_> {
        let runtime = (64 << 20) + 10 * meta_len;
        let base = dense + runtime + 4 * cfg.vocab_size as u64;
        Fixed { cfg, kv, base, chunk_buffers: RunState::new(cfg, PREFILL_CHUNK).bytes() }
    }

    /// At a context of `ctx` positions, with `seqs`' slots (each a KV cache and recurrent state
    /// at the full context) and prefix cache; a step holds a prompt chunk beside the other slots'
    /// tokens (the chunk's buffers, scaled).
    pub fn at(&self, ctx: usize, seqs: Sequences) -> u64 {
        let rows = (PREFILL_CHUNK + seqs.slots.saturating_sub(1)) as u64;
        let kv = seqs.slots.max(1) as u64 * KvCache::bytes_at_capacity(self.cfg, ctx, self.kv);
        self.base + kv + seqs.cache_bytes + self.chunk_buffers * rows / PREFILL_CHUNK as u64
    }
}

/// The longest context a model's positions cover: `max_position_embeddings`, or YaRN's reach
/// (`original_max_position_embeddings x factor`) where the config scales RoPE further (Qwen3's
/// 32k x 4 with `rope_scaling` added, as its model card says to).
pub fn context_limit(cfg: &ModelConfig) -> usize {
    let yarn = cfg.features.rope_yarn.as_ref().map_or(0.0, |y| y.original_max_position_embeddings as f64 * y.factor);
    cfg.max_position_embeddings.max(yarn.min(u32::MAX as f64) as usize)
}

/// [`Fixed`] for `seqs`, as a function of the context.
pub fn fixed_before_load(
    cfg: &ModelConfig,
    (dense, meta_len): (u64, u64),
    kv: KvTypes,
    seqs: Sequences,
) -> impl Fn(usize) -> u64 + '_ {
    let f = Fixed::new(cfg, dense, meta_len, kv);
    move |ctx| f.at(ctx, seqs)
}

/// The most slots below `asked` for which `fits` holds (it holds for all fewer than one that
/// fits: the plan grows with the slots).
fn most_slots(fits: &dyn Fn(usize) -> bool, asked: usize) -> Option<usize> {
    let (mut lo, mut hi) = (0, asked);
    // fits(lo) (lo 0: none yet), !fits(hi)
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) { lo = mid } else { hi = mid }
    }
    (lo > 0).then_some(lo)
}

/// `seqs` where it fits beside `rest` bytes (the pool, or the experts held in memory) at `ctx`;
/// flexible defaults shrunk to what does (the prefix cache first, then the slots); otherwise the
/// refusal, naming the most slots that fit with the prefix cache asked for and the largest
/// prefix cache that fits beside the slots asked for.
pub fn fit_sequences(
    need: &dyn Fn(Sequences) -> u64,
    seqs: Sequences,
    rest: u64,
    a: &Allowance,
) -> Result<Sequences, String> {
    let fits = |s: Sequences| need(s) + rest + headroom(a) <= a.bytes;
    if fits(seqs) {
        return Ok(seqs);
    }
    let without_cache = Sequences { cache_bytes: 0, ..seqs };
    let base = need(without_cache) + rest + headroom(a);
    let cache = a.bytes.saturating_sub(base) >> 20 << 20;
    if seqs.shrink_cache && fits(without_cache) {
        return Ok(Sequences { cache_bytes: cache, ..seqs });
    }
    if seqs.shrink_slots {
        let keep = if seqs.shrink_cache { without_cache } else { seqs };
        if let Some(n) = most_slots(&|n| fits(Sequences { slots: n, ..keep }), seqs.slots) {
            return Ok(Sequences { slots: n, ..keep });
        }
    }
    let most = most_slots(&|n| fits(Sequences { slots: n, ..seqs }), seqs.slots);
    let plan = need(seqs) + rest + headroom(a);
    Err(format!(
        "--parallel {} --cache-ram {}: the memory plan ({} for dense weights, {} KV caches at full context, the prefix cache, buffers and runtime + {} pool or experts + {} headroom = {}) exceeds the {} that {} allows; {}",
        seqs.slots,
        seqs.cache_bytes >> 20,
        mib(need(seqs)),
        seqs.slots,
        mib(rest),
        mib(headroom(a)),
        mib(plan),
        mib(a.bytes),
        a.source,
        match (most, base <= a.bytes) {
            (Some(n), true) => format!(
                "the most that fit: --parallel {n} with --cache-ram {}, or --cache-ram {} with --parallel {}",
                seqs.cache_bytes >> 20,
                cache >> 20,
                seqs.slots
            ),
            (Some(n), false) =>
                format!("the most that fit: --parallel {n} with --cache-ram {}", seqs.cache_bytes >> 20),
            (None, true) => format!("the most that fit: --cache-ram {} with --parallel {}", cache >> 20, seqs.slots),
            (None, false) => "not even one slot fits: lower --ctx-size or --cache-mb".to_string(),
        }
    ))
}

/// Before anything is loaded: check an explicit pool against the memory the process may use
/// (refused unless `--force`), or size an `auto` one (the default when the package does not fit
/// in half of it), choosing a shorter context when the default would leave no useful pool.
/// Returns the auto sizing's line and whether the pool is auto-sized.
pub(super) fn plan_memory(
    pkg: &Package,
    opts: &mut EngineOptions,
    seqs: &mut Sequences,
    a: &Allowance,
    fits: bool,
    warnings: &mut Vec<String>,
) -> Result<(Option<String>, bool), EngineError> {
    let cfg = &pkg.meta.model;
    let sizes = pkg.sizes();
    let default_ctx = cfg.max_position_embeddings.min(8192);
    let serving = *seqs != Sequences::default();
    let parts = Fixed::new(cfg, sizes.dense, pkg.header.meta_len, opts.kv);
    // a server's slots and prefix cache at `ctx`, beside `rest` bytes of pool or experts
    let mut fit = |ctx: usize, rest: u64, warnings: &mut Vec<String>| -> Result<(), EngineError> {
        if !serving {
            return Ok(());
        }
        let need = |s: Sequences| parts.at(ctx, s);
        let got = fit_sequences(&need, *seqs, rest, a).map_err(EngineError::Setup)?;
        if got != *seqs {
            warnings.push(format!(
                "{} slots and a prefix cache of {} MiB fit in the memory {} allows at context {ctx} (asked: {} and {} MiB)",
                got.slots,
                got.cache_bytes >> 20,
                a.source,
                seqs.slots,
                seqs.cache_bytes >> 20
            ));
            *seqs = got;
        }
        Ok(())
    };
    let Some(ex) = pkg.meta.experts.as_ref().filter(|_| opts.stream.is_some()) else {
        // experts held in memory when the package fits (read through the mapping otherwise)
        return fit(opts.ctx_size.unwrap_or(default_ctx), if fits { sizes.experts } else { 0 }, warnings)
            .map(|()| (None, false));
    };
    let useful = (ex.layers.len() * cfg.num_experts_per_tok) as u64;
    let least_pool = sizes.blob * useful.clamp(1, 8);
    let Some(sc) = opts.stream.as_mut() else { return Ok((None, false)) };
    match sc.budget_bytes {
        Some(b) => {
            let ctx = opts.ctx_size.unwrap_or(default_ctx);
            fit(ctx, b, warnings)?;
            let fixed = |ctx: usize| parts.at(ctx, *seqs);
            if let Some(w) = check_explicit(&fixed, ctx, b, a, sizes.blob, sc.force).map_err(EngineError::Setup)? {
                warnings.push(w);
            }
            Ok((None, false))
        }
        None if sc.auto || (!fits && pkg.meta.default_pool_fraction.is_none()) => {
            // at the shortest context auto would choose, then auto over the rest
            fit(opts.ctx_size.unwrap_or(MIN_AUTO_CTX.min(default_ctx)), least_pool, warnings)?;
            let fixed = |ctx: usize| parts.at(ctx, *seqs);
            let mut s = auto(&fixed, opts.ctx_size, default_ctx, a, sizes.blob, useful, sizes.experts)
                .map_err(EngineError::Setup)?;
            // a default prefix cache gives way to a pool that holds a token's experts: streamed
            // experts read again cost every token, a prompt computed again only its turn
            let want = useful * sizes.blob;
            if seqs.shrink_cache && seqs.cache_bytes > 0 && s.pool_bytes < want {
                seqs.cache_bytes = seqs.cache_bytes.saturating_sub(want - s.pool_bytes) >> 20 << 20;
                let fixed = |ctx: usize| parts.at(ctx, *seqs);
                s = auto(&fixed, opts.ctx_size, default_ctx, a, sizes.blob, useful, sizes.experts)
                    .map_err(EngineError::Setup)?;
            }
            sc.budget_bytes = Some(s.pool_bytes);
            opts.ctx_size = Some(s.ctx);
            Ok((Some(s.line), true))
        }
        // the package's own share of its experts (the demo's), or every expert through the pool
        None => {
            let share = pkg.meta.default_pool_fraction.map_or(sizes.experts, |f| (sizes.experts as f64 * f) as u64);
            fit(opts.ctx_size.unwrap_or(default_ctx), share.max(least_pool), warnings)?;
            Ok((None, false))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn cap(bytes: u64) -> Allowance {
        Allowance { bytes, source: "test".into(), cgroup: true }
    }

    /// Qwen3-30B-A3B's positions (40960), and with the `rope_scaling` its model card adds
    /// (YaRN, 32768 x 4); a YaRN that reaches less than the config's maximum does not shorten it.
    #[test]
    fn the_context_reaches_yarns_scaled_positions() {
        use crate::model_config::Yarn;
        let mut cfg = crate::model::kv_cache::tests::config_hd(4);
        cfg.max_position_embeddings = 40960;
        assert_eq!(context_limit(&cfg), 40960);
        let yarn = |original, factor| Yarn {
            factor,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max_position_embeddings: original,
            truncate: true,
            attention_factor: 1.0,
        };
        cfg.features.rope_yarn = Some(yarn(32768, 4.0));
        assert_eq!(context_limit(&cfg), 131072);
        cfg.features.rope_yarn = Some(yarn(4096, 4.0));
        assert_eq!(context_limit(&cfg), 40960);
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
    fn a_servers_slots_and_prefix_cache_fit_or_are_refused_with_the_most_that_fit() {
        // 1 GiB fixed + 256 MiB a slot + the cache; 4 GiB - 256 MiB headroom, 1 GiB of pool
        let need = |s: Sequences| GIB + s.slots as u64 * (256 << 20) + s.cache_bytes;
        let (a, pool) = (cap(4 * GIB), GIB);
        let asked = |slots, cache_mib: u64| Sequences::server(Some(slots), Some(cache_mib << 20), &a);
        // slots x 256 MiB + the cache may take 4096 - 256 - 2048 = 1792 MiB
        assert_eq!(fit_sequences(&need, asked(4, 512), pool, &a), Ok(asked(4, 512)));
        assert_eq!(fit_sequences(&need, asked(5, 512), pool, &a), Ok(asked(5, 512)));
        // 8 slots alone take 2048: only fewer slots fit
        let e = fit_sequences(&need, asked(8, 512), pool, &a).unwrap_err();
        assert!(
            e.contains("the most that fit: --parallel 5 with --cache-ram 512") && !e.contains(", or --cache-ram"),
            "{e}"
        );
        let e = fit_sequences(&need, asked(5, 600), pool, &a).unwrap_err();
        assert!(e.contains("--parallel 4 with --cache-ram 600, or --cache-ram 512 with --parallel 5"), "{e}");
        // defaults shrink instead: the cache first, then the slots
        let d = Sequences::server(None, None, &a);
        assert_eq!((d.slots, d.cache_bytes), (4, 512 << 20));
        assert_eq!(fit_sequences(&need, d, pool, &a).map(|s| (s.slots, s.cache_bytes)), Ok((4, 512 << 20)));
        let tight = |s: Sequences| need(s) + GIB;
        // 768 MiB left: 4 slots do not fit even without the cache; 3 do
        assert_eq!(fit_sequences(&tight, d, pool, &a).map(|s| (s.slots, s.cache_bytes)), Ok((3, 0)));
        let small = |s: Sequences| need(s) + 3 * GIB / 4;
        assert_eq!(fit_sequences(&small, d, pool, &a).map(|s| (s.slots, s.cache_bytes)), Ok((4, 0)));
        assert!(fit_sequences(&|_| 5 * GIB, d, pool, &a).unwrap_err().contains("not even one slot"));
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
