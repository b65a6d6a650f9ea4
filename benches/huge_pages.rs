//! Read bandwidth of 1 GiB of anonymous memory in 4 KiB pages and in transparent huge pages
//! (2 MiB), one thread, median of 7 passes, twice each: why the package copies the weights
//! decode streams into huge pages (`Package::make_resident`). Prints whether the kernel gave
//! huge pages (AnonHugePages grows by the buffer).
//!
//! `cargo bench --bench huge_pages`

use std::time::Instant;

fn anon_huge_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("AnonHugePages")).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn main() {
    let bytes: usize = 1 << 30;
    for huge in [false, true, false, true] {
        // an anonymous mapping, as the engine's resident copy and the matvec bench's arena
        let Ok(mut map) = memmap2::MmapMut::map_anon(bytes) else {
            eprintln!("mmap of 1 GiB failed");
            return;
        };
        if huge {
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        let v: &mut [u64] = bytemuck::cast_slice_mut(&mut map[..]);
        for (i, x) in v.iter_mut().enumerate() {
            *x = i as u64;
        }
        let mut rates = vec![];
        for _ in 0..7 {
            let t = Instant::now();
            let s = v.iter().fold(0u64, |a, &b| a.wrapping_add(b));
            std::hint::black_box(s);
            rates.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
        rates.sort_by(f64::total_cmp);
        let pages = if huge { "2 MiB pages (MADV_HUGEPAGE)" } else { "4 KiB pages" };
        println!("{pages:28}: {:.1} GB/s  (AnonHugePages {} MiB)", rates[3], anon_huge_kib() >> 10);
    }
}
