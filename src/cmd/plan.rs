//! `moescope plan -m FILE | --shape NAME [--quant q4g32] | --config config.json [--mem 8G]
//! [--threads N] [-c CTX] [--trace FILE] [--reuse-probes] [--json]`: expected prefill and decode
//! speed and what binds them, from byte counts, probes of this machine and the simulator
//! (`moescope::forecast` has the model).

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use moescope::convert::QuantMode;
use moescope::engine::sizing::{self, Allowance};
use moescope::experts::store::{AlignedBuf, ExpertStore, IoMode, probe_read_bandwidth};
use moescope::forecast::{ModelSizes, Probes, forecast};
use moescope::package::Package;
use moescope_kernels::Isa;
use moescope_kernels::act::QuantAct;
use moescope_kernels::mat::{Input, Mat, MatData};
use serde_json::json;

use crate::cli::PlanArgs;

/// `8G`, `512M`, `8GiB`, `8192` (MiB): bytes.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.trim_end_matches(['B', 'b']).trim_end_matches('i') {
        x if x.ends_with(['G', 'g']) => (&x[..x.len() - 1], 1u64 << 30),
        x if x.ends_with(['M', 'm']) => (&x[..x.len() - 1], 1u64 << 20),
        x if x.ends_with(['T', 't']) => (&x[..x.len() - 1], 1u64 << 40),
        x => (x, 1u64 << 20),
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok((v * mult as f64) as u64),
        _ => bail!("--mem: '{s}' is not a size (e.g. 8G, 512M)"),
    }
}

pub fn run(a: &PlanArgs) -> Result<()> {
    let cores = moescope::sysinfo::logical_cores();
    let asked = super::thread_count("--threads", a.threads, cores)?;
    // threads past the cores measure nothing more, the probes only take longer (64 threads on 2
    // cores: 67 s rather than 7); the figures are for as many threads as run at once
    let threads = asked.min(cores);
    if threads < asked {
        eprintln!("moescope plan: {asked} threads on {cores} logical cores: probing at {threads}");
    }
    let (sizes, pkg, label) = match (&a.model, &a.shape, &a.config) {
        (Some(m), None, None) => {
            let pkg = Package::open(m).with_context(|| format!("opening {}", m.display()))?;
            let label = format!("{} ({})", pkg.meta.display_name(), pkg.meta.quant.mode);
            (ModelSizes::of_package(&pkg), Some(pkg), label)
        }
        (None, Some(sh), None) => {
            let shape = moescope::synth::shapes::find(sh).map_err(anyhow::Error::msg)?;
            let q = QuantMode::parse(&a.quant).map_err(anyhow::Error::msg)?;
            (ModelSizes::of_config(&shape.config(), q), None, format!("{} shape ({})", shape.model, q.name()))
        }
        (None, None, Some(c)) => {
            let dir =
                if c.is_dir() { c.clone() } else { c.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf) };
            let cfg = moescope::convert::hf_config::read_config(&dir)?;
            let q = QuantMode::parse(&a.quant).map_err(anyhow::Error::msg)?;
            (ModelSizes::of_config(&cfg, q), None, format!("{} ({})", c.display(), q.name()))
        }
        _ => bail!("give one of -m FILE, --shape NAME or --config config.json"),
    };
    if sizes.moe_layers == 0 {
        bail!("{label}: no MoE layers: nothing streams");
    }
    moescope::model::KvCache::check_types(&sizes.cfg, a.kv.types()).map_err(|e| anyhow::anyhow!("{label}: {e}"))?;
    let allowance = match &a.mem {
        Some(m) => Allowance { bytes: parse_size(m)?, source: format!("--mem {m}"), cgroup: true },
        None => sizing::allowance(),
    };
    let trace = a.trace.as_deref().map(moescope::experts::routing_log::read).transpose().map_err(anyhow::Error::msg)?;
    let probes = probes(a, pkg.as_ref(), &sizes, threads)?;
    let f = forecast(
        &sizes,
        &probes,
        &allowance,
        (a.ctx_size, a.kv.types()),
        trace.as_ref().map(|(h, r)| (h, r.as_slice())),
    )
    .map_err(anyhow::Error::msg)?;
    let kv_types = a.kv.types();
    let kv = moescope::model::KvCache::bytes_at_capacity(&sizes.cfg, f.ctx, kv_types);
    let kv_token = moescope::model::KvCache::bytes_per_token(&sizes.cfg, kv_types);
    if a.json {
        let kv = json!({"type_k": kv_types.k.name(), "type_v": kv_types.v.name(), "bytes_per_token": kv_token,
                        "bytes": kv});
        println!(
            "{}",
            json!({"model": label, "sizes": sizes, "probes": probes, "forecast": f, "kv": kv,
                   "threads": threads, "allowance_source": allowance.source})
        );
        return Ok(());
    }
    let gb = |b: f64| b / 1e9;
    println!("{label}");
    println!(
        "  model        {:.2} GB dense, {:.2} GB experts ({} layers x {} of {:.2} MB), {:.2} GB read per decode token",
        gb(sizes.dense_bytes as f64),
        gb(sizes.experts_bytes() as f64),
        sizes.moe_layers,
        sizes.cfg.num_experts,
        sizes.blob_bytes as f64 / 1e6,
        gb((sizes.dense_decode_bytes + sizes.expert_token_bytes()) as f64)
    );
    println!(
        "  machine      disk {:.2} GB/s (random expert reads), memory {:.1} GB/s, q4 products {:.0} GFLOP/s at {threads} threads",
        gb(probes.disk_bps),
        gb(probes.mem_bps),
        probes.flops / 1e9
    );
    println!(
        "  memory       {:.2} GiB from {}: pool {:.2} GiB ({:.0}% of the experts), context {} (KV {kv_types} {:.2} GiB, {} KiB a token)",
        allowance.bytes as f64 / (1u64 << 30) as f64,
        allowance.source,
        f.pool_bytes as f64 / (1u64 << 30) as f64,
        100.0 * f.pool_fraction,
        f.ctx,
        kv as f64 / (1u64 << 30) as f64,
        kv_token / 1024
    );
    println!("  routing      {}: {:.1}% hits at that pool", f.routing, 100.0 * f.hit_rate);
    println!(
        "  decode       {:.2} tok/s, bound by {} ({:.0} ms memory + {:.0} ms disk per token)",
        f.decode_tps, f.decode_binding, f.decode_ms.memory, f.decode_ms.disk
    );
    println!("  prefill      {:.1} tok/s, bound by {}", f.prefill_tps, f.prefill_binding);
    Ok(())
}

fn probes_file() -> Option<PathBuf> {
    moescope::cache_dir::cache_dir().ok().map(|d| d.join("probes.json"))
}

/// This machine's disk, memory and compute figures: probed now (about 6 s; the disk under a
/// compute-like load), or with
/// `--reuse-probes` the last probe's at the same thread count.
fn probes(a: &PlanArgs, pkg: Option<&Package>, sizes: &ModelSizes, threads: usize) -> Result<Probes> {
    if a.reuse_probes
        && let Some(p) = probes_file()
        && let Ok(b) = std::fs::read(&p)
        && let Ok(pr) = serde_json::from_slice::<Probes>(&b)
        && pr.threads == threads
    {
        eprintln!("moescope plan: probes from {}", p.display());
        return Ok(pr);
    }
    eprintln!("moescope plan: probing disk, memory and compute (~6 s)...");
    // the disk as decode sees it: while `threads` threads stream memory as the compute threads
    // do (on 2 cores an idle-machine probe read twice what decode got: the I/O threads share the
    // cores with compute)
    let disk_bps = moescope::sysinfo::under_memory_load(threads, || -> Result<f64> {
        Ok(match pkg {
            Some(p) => {
                let (store, _) = ExpertStore::open(p, IoMode::Direct, false)?;
                probe_read_bandwidth(&store, moescope::experts::DEFAULT_IO_WORKERS, 2.0)
            }
            None => probe_scratch_disk(sizes.blob_bytes.max(1 << 20) as usize)?,
        })
    })?;
    let mem_bps = moescope::sysinfo::read_bandwidth(threads, 1 << 30, 3).best() * 1e9;
    let flops = probe_q4_flops(threads);
    let pr = Probes { disk_bps, mem_bps, flops, threads };
    if let Some(p) = probes_file() {
        let _ = std::fs::create_dir_all(p.parent().unwrap_or(Path::new(".")));
        let _ = std::fs::write(&p, serde_json::to_vec(&pr)?);
    }
    Ok(pr)
}

/// Random blob-sized O_DIRECT reads of a 1 GiB scratch file in the cache folder (written,
/// synced and dropped from the page cache first; removed after), on two threads for 2 s.
fn probe_scratch_disk(blob: usize) -> Result<f64> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = moescope::cache_dir::cache_dir().map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!(".disk-probe-{}", std::process::id()));
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _rm = Remove(path.clone());
    let size: usize = 1 << 30;
    {
        let mut f = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let chunk: Vec<u8> = (0..(8usize << 20)).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for _ in 0..size / chunk.len() {
            f.write_all(&chunk).with_context(|| format!("writing {}", path.display()))?;
        }
        f.sync_all()?;
        // SAFETY: advisory, on the open file
        unsafe {
            use std::os::fd::AsRawFd;
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
    let blob = blob.div_ceil(4096) * 4096;
    let n = (size / blob) as u64;
    let bytes = std::sync::atomic::AtomicU64::new(0);
    let t0 = Instant::now();
    let stop = t0 + Duration::from_secs(2);
    std::thread::scope(|s| {
        for i in 0..moescope::experts::DEFAULT_IO_WORKERS {
            let (bytes, path) = (&bytes, &path);
            s.spawn(move || {
                let Ok(mut f) = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) else {
                    return;
                };
                let mut buf = AlignedBuf::new(blob);
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ i as u64;
                while Instant::now() < stop {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let at = (x >> 33) % n * blob as u64;
                    if f.seek(SeekFrom::Start(at)).is_ok() && f.read_exact(&mut buf.as_mut_slice()[..blob]).is_ok() {
                        bytes.fetch_add(blob as u64, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    Ok(bytes.load(std::sync::atomic::Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64())
}

/// FLOP/s of the q4 products a prefill chunk runs: a [2048, 2048] q4 (group 32, interleaved)
/// matrix times 64 quantized tokens, rows split over `threads`; the best of 3.
fn probe_q4_flops(threads: usize) -> f64 {
    let (rows, cols, n) = (2048usize, 2048usize, 64usize);
    let isa = Isa::detect();
    let mut rng = moescope::rng::Rng::new(5);
    let q: Vec<u8> = (0..rows * cols / 2).map(|_| rng.next_u64() as u8).collect();
    let scales: Vec<f32> = (0..rows * cols / 32).map(|_| 0.01).collect();
    let x: Vec<f32> = (0..n * cols).map(|_| rng.next_f64() as f32 - 0.5).collect();
    let mut act = QuantAct::default();
    act.quantize(&x, cols, 32, isa);
    let m = Mat {
        rows,
        cols,
        data: MatData::Q4 { q: &q, scales: &scales, group: 32, x4: true, panels: false, lanes: false, mins: None },
    };
    let per = rows.div_ceil(threads) / 4 * 4;
    let mut best = 0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads {
                let (m, act) = (&m, &act);
                s.spawn(move || {
                    let r0 = (t * per).min(rows);
                    let r1 = if t + 1 == threads { rows } else { ((t + 1) * per).min(rows) };
                    let mut out = vec![0f32; (r1 - r0) * n];
                    m.matmul_rows(isa, Input::Quant(act), n, r0..r1, &mut out);
                    std::hint::black_box(&out);
                });
            }
        });
        best = best.max(2.0 * (rows * cols * n) as f64 / t0.elapsed().as_secs_f64());
    }
    best
}
