//! Facts about the machine and the process, for trace metadata and benchmark reports.

use serde_json::{Value, json};

/// The CPU's model name (from /proc/cpuinfo on Linux).
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

pub fn logical_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Peak resident set size of this process so far, in bytes.
pub fn peak_rss_bytes() -> u64 {
    // SAFETY: getrusage fills the struct we pass; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0;
    }
    // ru_maxrss is in KiB on Linux
    ru.ru_maxrss.max(0) as u64 * 1024
}

/// The value of `key` (a line `Key:   1234 kB`) of a /proc file, in bytes.
fn proc_kib(path: &str, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let line = s.lines().find(|l| l.strip_prefix(key).is_some_and(|r| r.starts_with(':')))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// Resident set size of this process now, in bytes (0 when unknown).
pub fn current_rss_bytes() -> u64 {
    proc_kib("/proc/self/status", "VmRSS").unwrap_or(0)
}

/// Total physical memory, in bytes (0 when unknown).
pub fn total_memory_bytes() -> u64 {
    proc_kib("/proc/meminfo", "MemTotal").unwrap_or(0)
}

/// Memory available to this process, in bytes: the system's MemAvailable, lowered to what the
/// process's memory cgroup still allows (v1 `memory.limit_in_bytes - usage`, v2 `memory.max -
/// memory.current`) when one limits it.
pub fn available_memory_bytes() -> u64 {
    let system = proc_kib("/proc/meminfo", "MemAvailable").unwrap_or(0);
    system.min(cgroup_room().unwrap_or(u64::MAX))
}

fn cgroup_room() -> Option<u64> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: String| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u64>().ok());
    for line in cg.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        if ctrl.split(',').any(|c| c == "memory") {
            let base = format!("/sys/fs/cgroup/memory{path}");
            let limit = read(format!("{base}/memory.limit_in_bytes"))?;
            let used = read(format!("{base}/memory.usage_in_bytes")).unwrap_or(0);
            // "no limit" is a huge number
            return (limit < (1 << 60)).then(|| limit.saturating_sub(used));
        }
        if ctrl.is_empty() {
            let base = format!("/sys/fs/cgroup{path}");
            if let Some(limit) = read(format!("{base}/memory.max")) {
                let used = read(format!("{base}/memory.current")).unwrap_or(0);
                return Some(limit.saturating_sub(used));
            }
        }
    }
    None
}

/// The build: version, profile and target.
pub fn build() -> Value {
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "target": format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS),
    })
}

/// Machine facts as one JSON object.
pub fn machine() -> Value {
    json!({
        "cpu": cpu_model(),
        "logical_cores": logical_cores(),
        "memory_bytes": total_memory_bytes(),
        "best_isa": moescope_kernels::Isa::detect().name(),
    })
}
