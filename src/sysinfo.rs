//! Facts about the machine and the process, for trace metadata and benchmark reports.

use serde_json::{Value, json};
use std::path::Path;

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

/// The default number of compute threads: the physical cores among the CPUs this process may
/// run on (SMT siblings share one core's units and caches, so a second decode thread on a core
/// mostly waits on the first), at most the logical CPUs it may use (a cgroup's CPU quota
/// lowers that); the logical CPUs where the topology cannot be read.
pub fn physical_cores() -> usize {
    let logical = logical_cores();
    physical_cores_in(Path::new("/sys/devices/system/cpu"), &allowed_cpus()).map_or(logical, |p| p.clamp(1, logical))
}

/// The CPUs in this process's affinity mask (empty where it cannot be read).
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } == 0 {
            // SAFETY: CPU_ISSET reads the set filled above, for indices below its size
            return (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect();
        }
    }
    Vec::new()
}

/// Distinct (package, core) pairs among `cpus`, read from `root/cpuN/topology/`; None when
/// `cpus` is empty or a CPU's topology cannot be read.
fn physical_cores_in(root: &Path, cpus: &[usize]) -> Option<usize> {
    let mut cores = std::collections::HashSet::new();
    for c in cpus {
        let dir = root.join(format!("cpu{c}/topology"));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok()?.trim().parse::<i64>().ok();
        cores.insert((read("physical_package_id")?, read("core_id")?));
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// The CPUs compute threads are pinned to (`MOESCOPE_PIN=1`), in order: one CPU of each
/// physical core among those this process may use (its first sibling), then the other
/// siblings; the allowed CPUs in order where the topology cannot be read.
pub fn pin_order() -> Vec<usize> {
    pin_order_in(Path::new("/sys/devices/system/cpu"), &allowed_cpus())
}

fn pin_order_in(root: &Path, cpus: &[usize]) -> Vec<usize> {
    let mut seen = std::collections::HashSet::new();
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    for &c in cpus {
        let dir = root.join(format!("cpu{c}/topology"));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok()?.trim().parse::<i64>().ok();
        match (read("physical_package_id"), read("core_id")) {
            (Some(p), Some(core)) if !seen.insert((p, core)) => rest.push(c),
            _ => first.push(c),
        }
    }
    first.extend(rest);
    first
}

/// Involuntary context switches of the calling thread so far (Linux; 0 elsewhere): how often the
/// scheduler took its core for another thread.
pub fn involuntary_switches() -> u64 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed rusage is valid; getrusage fills it for the calling thread
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) } == 0 {
            return u.ru_nivcsw.max(0) as u64;
        }
    }
    0
}

/// Pin the calling thread to CPU `cpu` (Linux; elsewhere, or when the kernel refuses, it stays
/// where it was: pinning is a hint for speed, never needed for a result).
pub fn pin_to(cpu: usize) {
    #[cfg(target_os = "linux")]
    {
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it (cpu is
        // below its size); sched_setaffinity reads it for the calling thread (pid 0)
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpu;
}

/// Memory read bandwidth now, in GB/s, read two ways: each of `threads` threads summing its
/// share of a buffer of `bytes` (filled first, so every page is resident), plainly and with a
/// software prefetch 4 KiB ahead of its loads; the median of `passes` passes each, alternated.
/// The roofline of a memory-bound decode is its weight bytes per token over the better of the
/// two ([`ReadProbe::best`]): where one core's bandwidth is bound by its misses in flight (as on
/// some Intel server cores), the plain sum reads less than the prefetching decode kernels do,
/// and a roofline under what the engine reaches would flatter it.
pub fn read_bandwidth(threads: usize, bytes: usize, passes: usize) -> ReadProbe {
    match ReadBuffer::new(bytes) {
        Some(b) => b.probe(threads, passes),
        None => ReadProbe { plain: 0.0, prefetched: 0.0 },
    }
}

/// The buffer [`read_bandwidth`] reads, filled once and probed as often as asked (`bench
/// --roofline` probes between a decode test's repetitions, on a host whose bandwidth drifts).
pub struct ReadBuffer {
    map: memmap2::MmapMut,
}

impl ReadBuffer {
    /// `bytes` of anonymous memory, every page written; None if it cannot be mapped.
    pub fn new(bytes: usize) -> Option<ReadBuffer> {
        let words = (bytes / 8).max(64);
        // in transparent huge pages where the kernel gives them, as the resident weights are
        // (4 KiB pages read slower: benches/huge_pages.rs measures by how much)
        let mut map = memmap2::MmapMut::map_anon(words * 8).ok()?;
        let _ = map.advise(memmap2::Advice::HugePage);
        let v: &mut [u64] = bytemuck::cast_slice_mut(&mut map[..]);
        for (i, x) in v.iter_mut().enumerate() {
            *x = i as u64;
        }
        Some(ReadBuffer { map })
    }

    /// The read bandwidth at `threads` threads: the median of `passes` passes each way.
    pub fn probe(&self, threads: usize, passes: usize) -> ReadProbe {
        let v: &[u64] = bytemuck::cast_slice(&self.map[..]);
        let per = v.len().div_ceil(threads.max(1));
        let mut rates = [Vec::with_capacity(passes.max(1)), Vec::with_capacity(passes.max(1))];
        for _ in 0..passes.max(1) {
            for (way, r) in rates.iter_mut().enumerate() {
                let t = std::time::Instant::now();
                let total = std::thread::scope(|s| {
                    let hs: Vec<_> = v.chunks(per).map(|part| s.spawn(move || sum_words(part, way == 1))).collect();
                    hs.into_iter().map(|h| h.join().unwrap_or(0)).fold(0u64, u64::wrapping_add)
                });
                std::hint::black_box(total);
                r.push((v.len() * 8) as f64 / t.elapsed().as_secs_f64() / 1e9);
            }
        }
        let median = |mut r: Vec<f64>| {
            r.sort_by(f64::total_cmp);
            r[r.len() / 2]
        };
        let [plain, prefetched] = rates;
        ReadProbe { plain: median(plain), prefetched: median(prefetched) }
    }
}

/// What [`read_bandwidth`] measured, GB/s each way.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadProbe {
    pub plain: f64,
    pub prefetched: f64,
}

impl ReadProbe {
    /// The higher of the two: the read bandwidth this machine demonstrably gives.
    pub fn best(&self) -> f64 {
        self.plain.max(self.prefetched)
    }
}

/// The wrapping sum of `part`, one cache line (8 words) at a time, each line's loads preceded
/// by a prefetch of the line 4 KiB on when `prefetch`.
fn sum_words(part: &[u64], prefetch: bool) -> u64 {
    let mut acc = [0u64; 8];
    let lines = part.chunks_exact(8);
    let rest = lines.remainder();
    for line in lines {
        if prefetch {
            moescope_kernels::prefetch::line(line.as_ptr() as *const u8, 4096);
        }
        for (a, &w) in acc.iter_mut().zip(line) {
            *a = a.wrapping_add(w);
        }
    }
    rest.iter().chain(&acc).fold(0u64, |a, &b| a.wrapping_add(b))
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

/// What this process's memory cgroup still allows (limit less usage), None without a limit.
fn cgroup_room() -> Option<u64> {
    let dir = memory_cgroup_dir()?;
    let limit = cgroup_limit(&dir)?;
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok().and_then(|s| s.trim().parse::<u64>().ok());
    let used = read("memory.current").or_else(|| read("memory.usage_in_bytes")).unwrap_or(0);
    Some(limit.saturating_sub(used))
}

/// The limit set on cgroup `dir` (v1 `memory.limit_in_bytes` or v2 `memory.max`), None when
/// unlimited or unreadable.
pub fn cgroup_limit(dir: &std::path::Path) -> Option<u64> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok().map(|s| s.trim().to_string());
    let v = read("memory.max").or_else(|| read("memory.limit_in_bytes"))?;
    // v2 says "max"; v1's "no limit" is a huge number
    v.parse::<u64>().ok().filter(|&b| b < (1 << 60))
}

/// The cgroup directory that limits this process's memory: `$MOESCOPE_CGROUP_DIR` when set
/// (tests point it at a folder holding a limit file), else the memory controller's (v1) or the
/// unified hierarchy's (v2) entry of /proc/self/cgroup.
pub fn memory_cgroup_dir() -> Option<std::path::PathBuf> {
    if let Some(d) = std::env::var_os("MOESCOPE_CGROUP_DIR") {
        return Some(d.into());
    }
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut v2 = None;
    for line in cg.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        if ctrl.split(',').any(|c| c == "memory") {
            return Some(format!("/sys/fs/cgroup/memory{path}").into());
        }
        if ctrl.is_empty() {
            v2 = Some(format!("/sys/fs/cgroup{path}").into());
        }
    }
    v2
}

/// Bytes free to an unprivileged writer on the file system holding `dir` (None when unknown).
pub fn free_disk_bytes(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the struct we pass from a NUL-terminated path
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
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

/// A UTC wall-clock time, split into fields (for file names and reports, without a date
/// library).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcTime {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

impl UtcTime {
    pub fn from_unix(secs: u64) -> UtcTime {
        let (days, rem) = (secs / 86400, secs % 86400);
        // civil-from-days (Howard Hinnant's algorithm)
        let z = days as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
        UtcTime {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem % 3600 / 60) as u32,
            second: (rem % 60) as u32,
        }
    }

    /// `YYYY-MM-DDTHH:MM:SSZ`
    pub fn iso(&self) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }

    /// `YYYYMMDD-HHMMSS`, for file names.
    pub fn stamp(&self) -> String {
        format!("{:04}{:02}{:02}-{:02}{:02}{:02}", self.year, self.month, self.day, self.hour, self.minute, self.second)
    }
}

pub fn utc_now() -> UtcTime {
    UtcTime::from_unix(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

/// SCHED_BATCH for the calling thread and the threads it starts later (Linux): no wake-up
/// preemption. Decode is a few compute threads meeting at barriers many times a token; with the
/// default policy every wake-up of another thread (the terminal redrawing what the workbench
/// prints, a shell, the UI) preempts a compute thread and stalls its peers at the next barrier
/// (the workbench decoded slower than `run` until its threads were SCHED_BATCH: CHANGELOG).
/// Every thread still gets its fair share of the CPU.
/// `MOESCOPE_SCHED=other` keeps the default policy (for comparisons).
pub fn batch_scheduling() {
    #[cfg(target_os = "linux")]
    {
        if std::env::var("MOESCOPE_SCHED").is_ok_and(|v| v == "other") {
            return;
        }
        set_scheduling(libc::SCHED_BATCH);
    }
}

/// SCHED_IDLE for the calling thread (Linux): it runs only when a core would otherwise idle,
/// for work that must never take time from compute (allocating the expert pool ahead of use).
pub fn idle_scheduling() {
    #[cfg(target_os = "linux")]
    set_scheduling(libc::SCHED_IDLE);
}

#[cfg(target_os = "linux")]
fn set_scheduling(policy: libc::c_int) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain syscall on the calling thread (pid 0) with a valid parameter struct;
    // failing only leaves the policy the thread had
    unsafe {
        libc::sched_setscheduler(0, policy, &param);
    }
}

/// Run `f` while `threads` threads read memory in a loop (a 256 MiB buffer each pass), as
/// decode's compute threads do: what the disk gives then is what decode can get (on 2 cores an
/// idle-machine disk probe read up to twice what decode got).
pub fn under_memory_load<T>(threads: usize, f: impl FnOnce() -> T) -> T {
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(buf) = ReadBuffer::new(256 << 20) else { return f() };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (buf, stop) = (&buf, &stop);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::black_box(buf.probe(1, 1));
                }
            });
        }
        let r = f();
        stop.store(true, Ordering::Relaxed);
        r
    })
}

#[cfg(test)]
mod core_tests {
    use super::*;

    /// 2 packages x 2 cores x 2 SMT threads (cpu0-7), core ids repeating across packages.
    #[test]
    fn physical_cores_count_distinct_package_and_core_pairs() {
        let root = tempfile::tempdir().unwrap();
        for cpu in 0..8 {
            let d = root.path().join(format!("cpu{cpu}/topology"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("physical_package_id"), format!("{}\n", cpu / 4)).unwrap();
            std::fs::write(d.join("core_id"), format!("{}\n", cpu % 4 / 2)).unwrap();
        }
        let all: Vec<usize> = (0..8).collect();
        assert_eq!(physical_cores_in(root.path(), &all), Some(4));
        // siblings 0 and 1 are one core; 0 and 2 two
        assert_eq!(physical_cores_in(root.path(), &[0, 1]), Some(1));
        assert_eq!(physical_cores_in(root.path(), &[0, 2, 4]), Some(3));
        // a CPU without topology, or none allowed: unknown
        assert_eq!(physical_cores_in(root.path(), &[0, 9]), None);
        assert_eq!(physical_cores_in(root.path(), &[]), None);
        // here: at least one, never more than the logical CPUs
        let p = physical_cores();
        assert!(p >= 1 && p <= logical_cores(), "{p}");
        // pinning: a CPU of each core first (0 and 1 are siblings, 2 and 3, ...), then the
        // siblings; CPUs without topology keep their place among the first
        assert_eq!(pin_order_in(root.path(), &all), vec![0, 2, 4, 6, 1, 3, 5, 7]);
        assert_eq!(pin_order_in(root.path(), &[1, 0, 9, 3]), vec![1, 9, 3, 0]);
    }
}

#[cfg(test)]
mod time_tests {

    use super::UtcTime;

    #[test]
    fn unix_times_split_like_the_calendar() {
        // reference values from `date -u -d @SECS`
        assert_eq!(UtcTime::from_unix(0).iso(), "1970-01-01T00:00:00Z");
        assert_eq!(UtcTime::from_unix(951_782_400).iso(), "2000-02-29T00:00:00Z");
        assert_eq!(UtcTime::from_unix(1_796_060_812).stamp(), "20261130-174652");
    }
}
