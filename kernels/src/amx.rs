//! AMX (Advanced Matrix Extensions) int8 tiles: whether this process may use them, and the
//! few instructions the prompt kernel (`mat/amx_q4.rs`) needs, as inline assembly (the Rust
//! intrinsics are not stable).
//!
//! A CPU that reports AMX in CPUID is not enough: Linux hands the tile state (8 KiB a thread) to
//! a process only when it asks (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), and
//! virtual machines may report the CPUID bits while the host never enables the state in XCR0.
//! A tile instruction without the grant kills the process with SIGILL (llama.cpp's AMX build
//! does exactly that on such machines), so the tier is taken only when every check passes:
//! CPUID's AMX-TILE and AMX-INT8, XCR0's tile bits (17, 18), the request granted and the grant
//! read back.

/// What the checks found ([`decide`] turns them into a yes or no; kept apart so each refusal
/// can be tested on a machine that grants everything).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// CPUID.(EAX=7, ECX=0):EDX bits 24 (AMX-TILE) and 25 (AMX-INT8)
    pub cpuid: bool,
    /// XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS manages the tile state
    pub xcr0: bool,
    /// `arch_prctl(ARCH_REQ_XCOMP_PERM, 18)` returned 0
    pub requested: bool,
    /// `arch_prctl(ARCH_GET_XCOMP_PERM)` has bit 18 afterwards
    pub permitted: bool,
}

/// Whether the tiles may run: every fact must hold.
pub fn decide(f: Facts) -> bool {
    f.cpuid && f.xcr0 && f.requested && f.permitted
}

/// Whether this process may use AMX-INT8 tiles (asked of the kernel once, the answer kept).
pub fn granted() -> bool {
    static GRANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GRANTED.get_or_init(|| decide(facts()))
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn facts() -> Facts {
    use std::arch::x86_64::__cpuid_count;
    let mut f = Facts { cpuid: false, xcr0: false, requested: false, permitted: false };
    let (max_leaf, osxsave) = (__cpuid_count(0, 0).eax, __cpuid_count(1, 0).ecx >> 27 & 1 == 1);
    if max_leaf < 7 || !osxsave {
        return f;
    }
    // leaf 7 exists (checked above)
    let edx = __cpuid_count(7, 0).edx;
    f.cpuid = edx >> 24 & 1 == 1 && edx >> 25 & 1 == 1;
    if !f.cpuid {
        return f;
    }
    // SAFETY: OSXSAVE is set, so XGETBV is enabled
    let xcr0 = unsafe { xgetbv0() };
    f.xcr0 = xcr0 >> 17 & 3 == 3;
    if !f.xcr0 {
        return f;
    }
    const ARCH_GET_XCOMP_PERM: u64 = 0x1022;
    const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
    const XFEATURE_XTILEDATA: u64 = 18;
    // SAFETY: arch_prctl with these codes reads no memory of ours
    f.requested = unsafe { arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) } == 0;
    let mut mask: u64 = 0;
    // SAFETY: the kernel writes one u64 at the address
    let got = unsafe { arch_prctl(ARCH_GET_XCOMP_PERM, &mut mask as *mut u64 as u64) };
    f.permitted = got == 0 && mask >> XFEATURE_XTILEDATA & 1 == 1;
    f
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn facts() -> Facts {
    Facts { cpuid: false, xcr0: false, requested: false, permitted: false }
}

/// XCR0, the OS-enabled state components.
///
/// # Safety
/// CPUID.1:ECX.OSXSAVE must be set.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe fn xgetbv0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller's guarantee
    unsafe { std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi, options(nomem, nostack)) };
    (hi as u64) << 32 | lo as u64
}

/// The `arch_prctl` system call (158 on x86-64 Linux); its return value (0 or -errno).
///
/// # Safety
/// `arg` must be what `code` expects (an address the kernel may write, for the GET codes).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe fn arch_prctl(code: u64, arg: u64) -> i64 {
    let ret: i64;
    // SAFETY: the caller's guarantee; the syscall clobbers rcx and r11
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") 158i64 => ret,
            in("rdi") code,
            in("rsi") arg,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        )
    };
    ret
}

/// A tile configuration (palette 1): rows and bytes a row of each of the 8 tiles; the kernel
/// loads it with [`TileConfig::load`] before its first tile instruction.
#[repr(C, align(64))]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TileConfig([u8; 64]);

impl TileConfig {
    /// No tile configured.
    pub const fn new() -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        TileConfig(c)
    }

    /// Tile `t` (0..8): `rows` rows (at most 16) of `bytes` bytes (at most 64).
    pub fn set(&mut self, t: usize, rows: usize, bytes: usize) {
        debug_assert!(t < 8 && rows <= 16 && bytes <= 64);
        self.0[16 + 2 * t] = bytes as u8;
        self.0[17 + 2 * t] = 0;
        self.0[48 + t] = rows as u8;
    }

    /// `ldtilecfg`: this thread's tiles take this shape (and are zeroed).
    ///
    /// # Safety
    /// [`granted`] returned true.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub unsafe fn load(&self) {
        // SAFETY: the caller's guarantee; 64 bytes at the address
        unsafe { std::arch::asm!("ldtilecfg [{0}]", in(reg) self.0.as_ptr(), options(nostack, readonly)) };
    }
}

impl Default for TileConfig {
    fn default() -> TileConfig {
        TileConfig::new()
    }
}

/// `tilerelease`: this thread's tile state back to its initial (unused) state, so a context
/// switch saves no tile data.
///
/// # Safety
/// [`granted`] returned true.
#[cfg(target_arch = "x86_64")]
#[inline]
pub unsafe fn release() {
    // SAFETY: the caller's guarantee
    unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
}

/// `tilezero tmm{T}`.
///
/// # Safety
/// [`granted`]; tile `T` configured on this thread.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn zero<const T: usize>() {
    // SAFETY: the caller's guarantee
    unsafe { std::arch::asm!("tilezero tmm{t}", t = const T, options(nostack, nomem)) };
}

/// `tileloadd tmm{T}`: the tile's rows from `p`, `stride` bytes apart.
///
/// # Safety
/// [`granted`]; tile `T` configured; its rows (configured bytes each) readable at `p + i stride`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn load<const T: usize>(p: *const u8, stride: usize) {
    // SAFETY: the caller's guarantee
    unsafe {
        std::arch::asm!("tileloadd tmm{t}, [{p} + {s} * 1]", t = const T, p = in(reg) p, s = in(reg) stride,
            options(nostack, readonly))
    };
}

/// `tilestored`: tile `T`'s rows to `p`, `stride` bytes apart.
///
/// # Safety
/// [`granted`]; tile `T` configured; its rows writable at `p + i stride`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn store<const T: usize>(p: *mut u8, stride: usize) {
    // SAFETY: the caller's guarantee
    unsafe {
        std::arch::asm!("tilestored [{p} + {s} * 1], tmm{t}", t = const T, p = in(reg) p, s = in(reg) stride,
            options(nostack))
    };
}

/// `tdpbssd tmm{C}, tmm{A}, tmm{B}`: `C[i][j] += sum_k A[i][4k..4k+4] · B[k][4j..4j+4]`, signed
/// bytes both, exact int32 sums.
///
/// # Safety
/// [`granted`]; the three tiles configured with matching shapes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn dot_ss<const C: usize, const A: usize, const B: usize>() {
    // SAFETY: the caller's guarantee
    unsafe {
        std::arch::asm!("tdpbssd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B, options(nostack, nomem))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_missing_fact_refuses_the_tiles() {
        let all = Facts { cpuid: true, xcr0: true, requested: true, permitted: true };
        assert!(decide(all));
        // CPUID bits without the OS state (virtual machines), a refused request, a grant that
        // does not read back: each alone keeps the tiles off
        for f in [
            Facts { cpuid: false, ..all },
            Facts { xcr0: false, ..all },
            Facts { requested: false, ..all },
            Facts { permitted: false, ..all },
        ] {
            assert!(!decide(f), "{f:?}");
        }
    }

    #[test]
    fn the_grant_follows_the_cpu() {
        // a CPU without AMX in CPUID is never granted; one that is granted has every fact
        let f = facts();
        assert_eq!(granted(), decide(f));
        if granted() {
            assert!(f.cpuid && f.xcr0 && f.permitted);
        }
        eprintln!("AMX facts: {f:?}");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_tile_product_equals_the_integer_sums() {
        if !granted() {
            eprintln!("not run: AMX tiles not granted here");
            return;
        }
        // 5 x 32 signed bytes times 8 x 64 (8 rows of 16 columns x 4): C[i][j] = sum over k of
        // A[i][k] B[k / 4][4 j + k % 4]
        let a: Vec<i8> = (0..5 * 32).map(|i| ((i * 37 + 11) % 255) as u8 as i8).collect();
        let b: Vec<i8> = (0..8 * 64).map(|i| ((i * 91 + 5) % 256) as u8 as i8).collect();
        let mut c = vec![0i32; 5 * 16];
        let mut cfg = TileConfig::new();
        cfg.set(0, 5, 64);
        cfg.set(1, 5, 32);
        cfg.set(2, 8, 64);
        // SAFETY: granted; shapes as configured; the buffers hold the rows
        unsafe {
            cfg.load();
            zero::<0>();
            load::<1>(a.as_ptr() as *const u8, 32);
            load::<2>(b.as_ptr() as *const u8, 64);
            dot_ss::<0, 1, 2>();
            store::<0>(c.as_mut_ptr() as *mut u8, 64);
            release();
        }
        for i in 0..5 {
            for j in 0..16 {
                let want: i32 = (0..32).map(|k| a[i * 32 + k] as i32 * b[(k / 4) * 64 + 4 * j + k % 4] as i32).sum();
                assert_eq!(c[i * 16 + j], want, "C[{i}][{j}]");
            }
        }
    }
}
