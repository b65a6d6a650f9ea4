//! Software prefetch of the weights a decode kernel streams: each load of a weight chunk also
//! asks for the line `distance` bytes further on, so more lines are on their way from memory
//! than the hardware prefetchers alone keep in flight.
//!
//! Whether that pays depends on the CPU. Where one core's bandwidth is bound by its misses in
//! flight (Intel server cores), or the core can use more of them (AMD from Zen 5, family 0x1A),
//! 4096 bytes ahead made decode clearly faster; on Zen 4 (family 0x19) every distance and hint
//! tried was slower. So the default follows the vendor and family, and
//! `MOESCOPE_WEIGHT_PREFETCH` overrides it (README's benchmark section has the measurements).
//!
//! The weights' scales are another matter: decode asks for them a few blocks ahead on every
//! CPU ([`scales_ahead`]), since no hardware prefetcher follows their sparse stream.
//!
//! Prefetching changes no result: it moves no data into any register.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes ahead; 0: off. Process-wide: it changes how fast, never what, a kernel computes.
static DISTANCE: AtomicUsize = AtomicUsize::new(0);

/// Set how far ahead the decode kernels prefetch weights (0: not at all).
pub fn set_distance(bytes: usize) {
    DISTANCE.store(bytes, Ordering::Relaxed);
}

/// How far ahead the decode kernels prefetch weights now (0: not at all).
pub fn distance() -> usize {
    DISTANCE.load(Ordering::Relaxed)
}

/// The setting now, in words for a report line.
pub fn describe() -> String {
    match distance() {
        0 => "no software prefetch".into(),
        d => format!("weights prefetched {d} B ahead"),
    }
}

/// The distance measured best for this CPU: 4096 bytes on Intel and on AMD from Zen 5 (family
/// 0x1A) on, off elsewhere (see the module doc).
pub fn default_distance() -> usize {
    distance_for(&cpu_vendor(), cpu_family())
}

/// [`default_distance`] for a CPUID vendor string and family.
pub fn distance_for(vendor: &[u8; 12], family: u32) -> usize {
    match vendor {
        b"GenuineIntel" => 4096,
        b"AuthenticAMD" if family >= 0x1A => 4096,
        _ => 0,
    }
}

/// The CPU's display family (CPUID leaf 1: the base family, plus the extended family when
/// the base is 0xF); 0 off x86-64.
pub fn cpu_family() -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: CPUID leaf 1 exists on every x86-64 CPU
        #[allow(unused_unsafe)]
        let eax = unsafe { std::arch::x86_64::__cpuid(1) }.eax;
        let base = (eax >> 8) & 0xF;
        if base == 0xF { base + ((eax >> 20) & 0xFF) } else { base }
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// A setting as `MOESCOPE_WEIGHT_PREFETCH` spells it: `auto` or empty ([`default_distance`]),
/// `off` or `0`, or a distance in bytes (a multiple of 64, at most 1 MiB).
pub fn parse_setting(v: &str) -> Result<usize, String> {
    match v.trim() {
        "" | "auto" => Ok(default_distance()),
        "off" | "0" => Ok(0),
        n => match n.parse::<usize>() {
            Ok(b) if b % 64 == 0 && b <= 1 << 20 => Ok(b),
            _ => Err(format!("'{n}' (expected off, auto, or bytes: a multiple of 64 up to 1048576)")),
        },
    }
}

/// The setting `MOESCOPE_WEIGHT_PREFETCH` asks for (unset: `auto`); a bad value is an error
/// naming the variable.
pub fn setting_from_env() -> Result<usize, String> {
    let v = std::env::var("MOESCOPE_WEIGHT_PREFETCH").unwrap_or_default();
    parse_setting(&v).map_err(|e| format!("MOESCOPE_WEIGHT_PREFETCH: {e}"))
}

/// The CPUID vendor string (`GenuineIntel`, `AuthenticAMD`, ...); zeros off x86-64.
pub fn cpu_vendor() -> [u8; 12] {
    let mut v = [0u8; 12];
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: CPUID leaf 0 exists on every x86-64 CPU
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        v[..4].copy_from_slice(&r.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&r.edx.to_le_bytes());
        v[8..].copy_from_slice(&r.ecx.to_le_bytes());
    }
    v
}

/// Ask for the cache line at `p + ahead` (any address: a prefetch never faults).
#[inline(always)]
pub fn line(p: *const u8, ahead: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and never faults, whatever the address
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead) as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, ahead);
}

/// Ask for part `part` of `parts` of the `bytes` bytes from `p` on (a whole number of lines
/// each): a kernel that computes on one piece while the next comes in spreads the piece's
/// lines over its steps, so that a few misses are in flight at a time rather than hundreds.
#[inline(always)]
pub fn part_of(p: *const u8, bytes: usize, part: usize, parts: usize) {
    let lines = bytes.div_ceil(64);
    for l in lines * part / parts..lines * (part + 1) / parts {
        line(p, 64 * l);
    }
}

/// Rows ahead of the block being computed whose scales [`scales_ahead`] asks for.
pub const SCALE_ROWS_AHEAD: usize = 16;

/// Ask for the scales (`[rows, ng]` f32, row-major) of rows `r0 + SCALE_ROWS_AHEAD ..` for
/// `rows` rows, when a decode kernel starts on rows `r0 .. r0 + rows`. Decode streams a block's
/// weights and its scales from two places: the weights as one sequential stream the hardware
/// prefetchers follow, the scales a few lines every few KB, which they do not. Each block then
/// began with a miss to memory on its scales that the out-of-order window could not hide.
/// Reading them ahead made the q6 output layer `[151936, 2048]` on one thread markedly faster
/// (measured in the commit that added it). Any row index is fine: a prefetch never faults.
#[inline(always)]
pub fn scales_ahead(scales: &[f32], r0: usize, rows: usize, ng: usize) {
    rows_ahead(scales.as_ptr() as *const u8, ng * 4, r0, rows);
}

/// [`scales_ahead`] for scales stored in rows of `row_bytes` bytes at `base` (Q4_K's k4 records).
#[inline(always)]
pub fn rows_ahead(base: *const u8, row_bytes: usize, r0: usize, rows: usize) {
    let start = base.wrapping_add(r0.wrapping_add(SCALE_ROWS_AHEAD).wrapping_mul(row_bytes)) as usize;
    let end = start.wrapping_add(rows * row_bytes);
    let mut a = start & !63;
    while a < end {
        line(a as *const u8, 0);
        a += 64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_to_distances_and_bad_ones_are_refused() {
        assert_eq!(parse_setting("off"), Ok(0));
        assert_eq!(parse_setting(" 0 "), Ok(0));
        assert_eq!(parse_setting("8192"), Ok(8192));
        assert_eq!(parse_setting("auto"), Ok(default_distance()));
        assert_eq!(parse_setting(""), Ok(default_distance()));
        for bad in ["100", "4k", "-64", "2097152", "on"] {
            let e = parse_setting(bad).expect_err(bad);
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn scales_ahead_of_the_last_rows_reads_nothing_past_the_slice() {
        // the rows asked for lie past the end (and, for the huge index, past any mapping): a
        // prefetch must neither fault nor touch the slice
        let scales = vec![1.5f32; 4 * 6];
        for r0 in [0, 3, 4, usize::MAX / 64] {
            scales_ahead(&scales, r0, 4, 6);
        }
        assert!(scales.iter().all(|&v| v == 1.5));
    }

    #[test]
    fn the_default_distance_follows_the_vendor_and_family() {
        assert_eq!(distance_for(b"GenuineIntel", 6), 4096);
        assert_eq!(distance_for(b"AuthenticAMD", 0x19), 0);
        assert_eq!(distance_for(b"AuthenticAMD", 0x1A), 4096);
        assert_eq!(distance_for(b"HygonGenuine", 0x18), 0);
        assert_eq!(distance_for(&[0; 12], 0), 0);
        assert_eq!(default_distance(), distance_for(&cpu_vendor(), cpu_family()));
        if cfg!(target_arch = "x86_64") {
            // every x86-64 CPU's family is at least 6 (the P6 line) or 0xF and up
            assert!(cpu_family() >= 6, "{:#x}", cpu_family());
        }
    }

    #[test]
    fn the_vendor_is_a_printable_cpuid_string_on_x86_64() {
        let v = cpu_vendor();
        if cfg!(target_arch = "x86_64") {
            assert!(v.iter().all(|b| b.is_ascii_graphic()), "{v:?}");
        } else {
            assert_eq!(v, [0; 12]);
        }
    }
}
