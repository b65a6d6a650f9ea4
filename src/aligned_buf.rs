//! A buffer of whole pages mapped straight from the kernel: what O_DIRECT reads land in (the
//! expert pool) and what O_DIRECT writes go from (the package writer).

use std::sync::atomic::{AtomicUsize, Ordering};

/// What O_DIRECT asks of a buffer's address and length on every file system met: a page. The
/// package aligns each expert blob to it, so one read lands whole in one buffer.
pub const ALIGN: usize = 4096;

/// Bytes of the process's buffers now, and the most there ever were: what the pool held at
/// its fullest, for `run`'s report and the soak test (one pool per process there).
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Bytes of the process's [`AlignedBuf`]s alive now.
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The most bytes of [`AlignedBuf`]s alive at once so far in this process.
pub fn peak_bytes() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Start the peak over from what is alive now: the engine calls it as it loads, so the peak is
/// its pool's (a package written just before, as the demo's is on first use, had 8 MiB of write
/// buffers, and `run` reported them as the pool's).
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// A buffer of whole pages (so 4096-byte aligned, as O_DIRECT requires), mapped straight from
/// the kernel rather than the allocator: the pool's memory is then exactly its buffers, given
/// back when they go (malloc would keep multi-MB chunks freed on I/O threads in its arenas, and
/// the process would grow past its budget). Pages become resident when a read fills them.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain owned memory; shared references only read it.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

/// Transparent huge page size on x86-64 (and most aarch64 kernels).
const HUGE_PAGE: usize = 2 << 20;

impl AlignedBuf {
    /// A buffer of `len` bytes rounded up to whole pages. One of 2 MiB or more starts on a
    /// 2 MiB boundary with its whole 2 MiB pieces advised as transparent huge pages (the kernel
    /// gives them where it can): the compute threads stream each expert once per use, and over
    /// 4 KiB pages they miss the TLB every page (measured in the commit that added this). The
    /// DMA of an O_DIRECT read pins fewer pages too.
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.max(1).div_ceil(ALIGN) * ALIGN;
        // room to move the start to a 2 MiB boundary; the slack is unmapped below
        let slack = if len >= HUGE_PAGE { HUGE_PAGE } else { 0 };
        // SAFETY: an anonymous private mapping with no address hint.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len + slack,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let layout = std::alloc::Layout::from_size_align(len, ALIGN).unwrap_or(std::alloc::Layout::new::<u8>());
            std::alloc::handle_alloc_error(layout);
        }
        let (p, a) = (ptr as usize, (ptr as usize).next_multiple_of(HUGE_PAGE));
        let a = if slack == 0 { p } else { a };
        // SAFETY: [p, p + len + slack) is the mapping just made; the pieces unmapped lie in it
        // before a and after a + len, and [a, a + len) stays mapped for the buffer's life
        unsafe {
            if a > p {
                libc::munmap(ptr, a - p);
            }
            if p + slack > a {
                libc::munmap((a + len) as *mut libc::c_void, p + slack - a);
            }
            if slack > 0 {
                libc::madvise(a as *mut libc::c_void, len / HUGE_PAGE * HUGE_PAGE, libc::MADV_HUGEPAGE);
            }
        }
        let live = LIVE.fetch_add(len, Ordering::Relaxed) + len;
        PEAK.fetch_max(live, Ordering::Relaxed);
        AlignedBuf { ptr: a as *mut u8, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the buffer's lifetime; an anonymous mapping's
        // pages read as zeros until written.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        LIVE.fetch_sub(self.len, Ordering::Relaxed);
        // SAFETY: mapped in `new` with this length.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{AlignedBuf, HUGE_PAGE};

    #[test]
    fn buffers_are_page_aligned_and_large_ones_start_on_a_huge_page() {
        for len in [1, 4096, 5000, HUGE_PAGE - 4096, HUGE_PAGE, 2_506_752, 3 * HUGE_PAGE + 8192] {
            let mut b = AlignedBuf::new(len);
            let p = b.as_slice().as_ptr() as usize;
            assert_eq!(p % 4096, 0, "{len} bytes");
            assert!(b.len() >= len && b.len().is_multiple_of(4096), "{len} bytes: {}", b.len());
            if len >= HUGE_PAGE {
                assert_eq!(p % HUGE_PAGE, 0, "{len} bytes start on a 2 MiB boundary");
            }
            // every byte is mapped and writable (the trimmed slack took none of the buffer)
            let n = b.len();
            b.as_mut_slice()[0] = 1;
            b.as_mut_slice()[n - 1] = 2;
            assert_eq!((b.as_slice()[0], b.as_slice()[n - 1]), (1, 2));
        }
    }
}
