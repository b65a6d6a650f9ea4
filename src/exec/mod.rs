//! How the model's matrix products run: on which ISA tier and over which threads.
//! The kernels crate has no threads; this splits a product's output rows over the pool.

pub mod pool;
mod rows;

use std::ops::Range;
use std::sync::{Mutex, RwLock};

use smallvec::SmallVec;

use moescope_kernels::act::QuantPart;
use moescope_kernels::mat::Input;
use moescope_kernels::ops::Glu;
use moescope_kernels::quant::PANEL_ROWS;
use moescope_kernels::{Isa, Mat, QuantAct};

use crate::trace;
use pool::Pool;
use rows::rows_per_task;

/// The most compute threads a pool starts. The largest machines have a few hundred hardware
/// threads; far past that, each thread's stack and signal stack exhaust the address space and
/// the thread that cannot map its guard page aborts the process.
pub const MAX_THREADS: usize = 512;

/// One gate/up pair of [`Exec::swiglu_pairs`] (`[I, H]` each) and its biases (`[I]` each), if
/// it has them.
#[derive(Clone, Copy)]
pub struct GatePair<'a> {
    pub gate: &'a Mat<'a>,
    pub up: &'a Mat<'a>,
    pub bias: Option<(&'a [f32], &'a [f32])>,
}

/// Most rows of a gate (and of an up) one step of [`Exec::swiglu_pairs`] holds on the stack.
const MAX_PIECE: usize = 1024;

/// Fewest weight bytes a piece of a parallel section streams (the last piece may hold less):
/// small enough that the threads finish within a few µs of each other, large enough that a
/// claim and a fresh weight stream stay a small part of the piece.
const MIN_PIECE_BYTES: usize = 64 << 10;

pub struct Exec {
    pub isa: Isa,
    pool: Pool,
    /// The same tier on the calling thread alone, for work already split over the pool (a task
    /// of a parallel section cannot open another); None when this one is single-threaded.
    serial: Option<Box<Exec>>,
    /// Fewest weight bytes per piece of a section ([`MIN_PIECE_BYTES`]; tests lower it to cut
    /// small products into many pieces).
    min_piece_bytes: usize,
}

/// A pointer to an output shared by the tasks of one section, each writing its own part.
pub(crate) struct Chunks {
    ptr: *mut f32,
    len: usize,
}
// SAFETY: tasks write disjoint parts (see `for_pieces_mut` and the MoE layer's expert tasks)
unsafe impl Sync for Chunks {}

impl Chunks {
    pub(crate) fn new(data: &mut [f32]) -> Chunks {
        Chunks { ptr: data.as_mut_ptr(), len: data.len() }
    }

    /// # Safety
    /// `[start, start + n)` inside the buffer, and no other live slice overlaps it.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, start: usize, n: usize) -> &mut [f32] {
        debug_assert!(start + n <= self.len);
        // SAFETY: the caller's guarantee
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), n) }
    }

    /// Where element `i` lies (for a kernel that writes a strided part of the buffer).
    pub(crate) fn at(&self, i: usize) -> *mut f32 {
        debug_assert!(i <= self.len);
        self.ptr.wrapping_add(i)
    }
}

/// What a section over several products runs on rows of product `i`: `f(i, rows, their output)`.
type RowsOf<'a> = dyn Fn(usize, Range<usize>, &mut [f32]) + Sync + 'a;

/// What a section runs on each piece: `f(rows, part of the output, participant)`.
type PieceFn<'a> = dyn Fn(Range<usize>, &mut [f32], usize) + Sync + 'a;

/// Buffers a product needs besides its output, kept between calls.
#[derive(Default)]
pub struct Scratch {
    qa: QuantAct,
    t: Vec<f32>,
    /// [`Exec::matmul`]'s input, and [`Exec::matmul_shared`]'s for the matrices that take
    /// another quantization than the first
    other: QuantAct,
    /// [`Exec::matvec_each`]'s inputs, each quantized by the first piece that needs it (and
    /// whether it has been, this section)
    each: Vec<RwLock<(bool, QuantAct)>>,
}

/// A section's few matrices or rows: on the stack (a decode step allocates nothing).
type Few<T> = SmallVec<[T; 16]>;

/// A section's pieces: on the stack up to a few hundred (a thread count far past the cores'
/// spills to the heap).
type Pieces = SmallVec<[Range<usize>; 256]>;

impl Scratch {
    /// Room for inputs of up to `values` activations and results of up to `outputs` values
    /// (several tokens' products are computed weight-row-major, then transposed).
    pub fn reserve(&mut self, values: usize, outputs: usize) {
        self.qa.reserve(values);
        self.other.reserve(values);
        self.t.reserve(outputs.saturating_sub(self.t.len()));
    }

    /// Bytes its buffers hold.
    pub fn bytes(&self) -> usize {
        let each: usize = self.each.iter().map(|q| q.read().map_or(0, |q| q.1.bytes())).sum();
        self.qa.bytes() + self.other.bytes() + 4 * self.t.capacity() + each
    }
}

impl Exec {
    /// `threads` participants on tier `isa`. `MOESCOPE_PIN=1` pins the workers one to a
    /// physical core ([`sysinfo::pin_order`](crate::sysinfo::pin_order)); `0` or unset: the
    /// scheduler places them.
    pub fn new(threads: usize, isa: Isa) -> Result<Exec, String> {
        let pin = match std::env::var("MOESCOPE_PIN").as_deref() {
            Err(_) | Ok("0") | Ok("") => Vec::new(),
            Ok("1") => crate::sysinfo::pin_order(),
            Ok(other) => return Err(format!("MOESCOPE_PIN: expected 0 or 1, got '{other}'")),
        };
        if threads > MAX_THREADS {
            return Err(format!("{threads} compute threads: at most {MAX_THREADS}"));
        }
        let passive = threads > crate::sysinfo::logical_cores();
        let pool = Pool::with_options(threads, passive, &pin)
            .map_err(|e| format!("starting {threads} compute threads: {e}"))?;
        let serial = if pool.threads() > 1 { Some(Box::new(Exec::new(1, isa)?)) } else { None };
        Ok(Exec { isa, pool, serial, min_piece_bytes: MIN_PIECE_BYTES })
    }

    /// This exec with pieces (and per-row tasks) of at least `bytes` (tests: many small pieces,
    /// so a tiny model's sections split as a real one's do).
    pub fn with_min_piece_bytes(mut self, bytes: usize) -> Exec {
        self.min_piece_bytes = bytes;
        self
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// This tier on the calling thread alone (itself when single-threaded).
    pub fn serial(&self) -> &Exec {
        self.serial.as_deref().unwrap_or(self)
    }

    /// The input a product of `w` reads: `x` itself for float weights, else `x` quantized (into
    /// `qa`, with this tier's code at most) with the weight's group; a prompt's rows in parts
    /// over the threads (each row's bits are its own: the same at any thread count).
    pub(crate) fn quantized<'a>(&self, w: &Mat<'_>, x: &'a [f32], qa: &'a mut QuantAct) -> Input<'a> {
        let Some(g) = w.quant_group() else { return Input::F32(x) };
        let n = x.len() / w.cols.max(1);
        if n < 2 || self.threads() == 1 {
            qa.quantize(x, w.cols, g, self.isa);
            return Input::Quant(qa);
        }
        qa.prepare(n, w.cols, g, self.isa);
        let rows = rows_per_task(n, w.cols * 4, self.threads(), self.min_piece_bytes);
        let parts: SmallVec<[Mutex<QuantPart<'_>>; 64]> = qa.parts(rows).map(Mutex::new).collect();
        self.pool.run(parts.len(), &|i, _| {
            let _s = trace::span("quantize");
            parts[i].lock().unwrap_or_else(|e| e.into_inner()).quantize(x);
        });
        drop(parts);
        Input::Quant(qa)
    }

    /// `f(task, participant)` for each task of `0..tasks`, in parallel over the compute threads;
    /// `f` must not open a parallel section of its own (use [`serial`](Self::serial)).
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        self.pool.run(tasks, f);
    }

    /// The pieces of a parallel section over `rows` rows of `row_bytes` weight bytes each (times
    /// the tokens, for several), claimed in order: each about 1/(2 x threads) of the rows still
    /// unclaimed, in whole superblocks of panel-major rows (`PANEL_ROWS`, whole blocks of
    /// interleaved rows too) and of at least `min_piece_bytes`, so the pieces shrink
    /// as the section runs out and the threads finish within one small piece of each other
    /// (with equal pieces, one thread idled at the end of every section; measured in the commit
    /// that chose this). One thread: one piece.
    fn pieces(&self, rows: usize, row_bytes: usize) -> Pieces {
        // one thread: everything left, i.e. one piece
        let share = if self.threads() == 1 { 1 } else { 2 * self.threads() };
        let least = self.min_piece_bytes.div_ceil(row_bytes.max(1)).max(1);
        let mut out = Pieces::new();
        let mut r0 = 0;
        while r0 < rows {
            let left = rows - r0;
            let n = left.div_ceil(share).max(least).next_multiple_of(PANEL_ROWS).min(left);
            out.push(r0..r0 + n);
            r0 += n;
        }
        out
    }

    /// `f(rows, part, participant)` for each piece of [`pieces`](Self::pieces) over `rows` rows,
    /// in parallel over the compute threads: `part` is `out`'s rows `rows`, `width` values each.
    fn for_pieces_mut(&self, out: &mut [f32], width: usize, row_bytes: usize, f: &PieceFn<'_>) {
        debug_assert_eq!(out.len() % width.max(1), 0);
        let pieces = self.pieces(out.len() / width.max(1), row_bytes);
        let data = Chunks::new(out);
        self.pool.run(pieces.len(), &|i, p| {
            let r = pieces[i].clone();
            // SAFETY: the pieces are disjoint row ranges inside `out`, task i alone writes
            // piece i's rows, and `out` outlives the section (`run` returns after every task)
            let part = unsafe { data.slice(r.start * width, r.len() * width) };
            f(r, part, p);
        });
    }

    /// `out = [A x | B x | ...]` for one input row `x` (`[cols]`) and matrices of the same
    /// input size and format (an expert's gate and up; attention's q, k and v): `out` is their
    /// rows end to end. One parallel section instead of one per matrix, its pieces running
    /// across the matrices' boundaries, and `x` quantized once. Falls back to one
    /// product per matrix when the formats or input sizes differ. `label` names the group in the
    /// trace.
    pub fn matvec_concat(&self, label: &'static str, mats: &[&Mat<'_>], x: &[f32], out: &mut [f32], s: &mut Scratch) {
        let Some(first) = mats.first() else { return };
        let rows: usize = mats.iter().map(|m| m.rows).sum();
        debug_assert_eq!(out.len(), rows);
        if mats.iter().any(|m| !m.reads_like(first)) {
            let mut rest = &mut out[..];
            for m in mats {
                let (o, r) = rest.split_at_mut(m.rows);
                self.matmul(label, m, x, 1, o, s);
                rest = r;
            }
            return;
        }
        let input = self.quantized(first, x, &mut s.qa);
        let rows: Few<usize> = mats.iter().map(|m| m.rows).collect();
        let isa = self.isa;
        let span = product_span(label, first, out.len(), 1);
        let row_bytes = row_bytes(first);
        self.row_section(span, label, &rows, out, row_bytes, &|i, r, o| mats[i].matmul_rows(isa, input, 1, r, o));
    }

    /// `out = [A₀ x₀ | A₁ x₁ | ...]`: one token's products of several matrices of one input
    /// size and format, each with its own input (several experts' down projections), their rows
    /// end to end in `out`; one parallel section, as
    /// [`matvec_concat`](Self::matvec_concat). Each input is quantized in the section, by the
    /// first piece that needs it, into `s`'s buffers for it.
    pub fn matvec_each(&self, label: &'static str, prods: &[(&Mat<'_>, &[f32])], out: &mut [f32], s: &mut Scratch) {
        let Some(&(first, _)) = prods.first() else { return };
        let rows: Few<usize> = prods.iter().map(|(m, _)| m.rows).collect();
        if s.each.len() < prods.len() {
            s.each.resize_with(prods.len(), Default::default);
        }
        // none quantized yet
        s.each.iter_mut().for_each(|q| q.get_mut().unwrap_or_else(|e| e.into_inner()).0 = false);
        let qas = &s.each[..prods.len()];
        let isa = self.isa;
        let span = product_span(label, first, out.len(), 1);
        self.row_section(span, label, &rows, out, row_bytes(first), &|i, r, o| {
            let (m, x) = prods[i];
            match m.quant_group() {
                Some(g) => {
                    let read = || qas[i].read().unwrap_or_else(|e| e.into_inner());
                    let mut done = read();
                    if !done.0 {
                        drop(done);
                        {
                            let mut w = qas[i].write().unwrap_or_else(|e| e.into_inner());
                            if !w.0 {
                                w.1.quantize(x, m.cols, g, isa);
                                w.0 = true;
                            }
                        }
                        done = read();
                    }
                    m.matmul_rows(isa, Input::Quant(&done.1), 1, r, o);
                }
                None => m.matmul_rows(isa, Input::F32(x), 1, r, o),
            }
        });
    }

    /// One token's gated activations of several gate/up pairs of one input size and format
    /// (one token's experts), `act = [glu(G₀ x, U₀ x) | glu(G₁ x, U₁ x) | ...]` (each pair's
    /// biases added first, where it has them), in one parallel section: each piece computes the
    /// same rows of a pair's gate and up and their activation at once; `x` is quantized once.
    /// Pairs whose gate and up differ in shape, or differ from the first in format, go through
    /// [`matvec_concat`](Self::matvec_concat) and the activation afterwards (same result).
    pub fn swiglu_pairs(
        &self,
        label: &'static str,
        pairs: &[GatePair<'_>],
        glu: Glu,
        x: &[f32],
        act: &mut [f32],
        s: &mut Scratch,
    ) {
        let Some(first) = pairs.first().map(|p| p.gate) else { return };
        debug_assert_eq!(act.len(), pairs.iter().map(|p| p.gate.rows).sum::<usize>());
        let same = |m: &Mat<'_>| m.reads_like(first);
        if !pairs.iter().all(|p| p.gate.rows == p.up.rows && same(p.gate) && same(p.up)) {
            let mut a0 = 0;
            for p in pairs {
                let (g, u) = (p.gate, p.up);
                let mut gu = vec![0f32; g.rows + u.rows];
                self.matvec_concat(label, &[g, u], x, &mut gu, s);
                let (gv, uv) = gu.split_at(g.rows);
                glu.apply(gv, uv, p.bias, &mut act[a0..a0 + g.rows]);
                a0 += g.rows;
            }
            return;
        }
        let input = self.quantized(first, x, &mut s.qa);
        let rows: Few<usize> = pairs.iter().map(|p| p.gate.rows).collect();
        let isa = self.isa;
        // the trace counts both matrices' rows: what the section streams
        let span = product_span(label, first, 2 * act.len(), 1);
        // a row of the activation streams a gate row and an up row
        self.row_section(span, label, &rows, act, 2 * row_bytes(first), &|i, r, o| {
            let GatePair { gate: g, up: u, bias } = pairs[i];
            // the gate's and up's results of these rows, then their activation in place
            let mut gu = [0f32; 2 * MAX_PIECE];
            for (r0, o) in (r.start..r.end).step_by(MAX_PIECE).zip(o.chunks_mut(MAX_PIECE)) {
                let n = o.len();
                let (gv, uv) = gu.split_at_mut(MAX_PIECE);
                g.matmul_rows(isa, input, 1, r0..r0 + n, &mut gv[..n]);
                u.matmul_rows(isa, input, 1, r0..r0 + n, &mut uv[..n]);
                let b = bias.map(|(bg, bu)| (&bg[r0..r0 + n], &bu[r0..r0 + n]));
                glu.apply(&gv[..n], &uv[..n], b, o);
            }
        });
    }

    /// One parallel section over the rows of several matrices end to end (`rows[i]` of matrix
    /// `i`), under the product slice `span`, in [`pieces`](Self::pieces) of `row_bytes` weight
    /// bytes a row running across the matrices' boundaries; `rows_of(i, range, out)`
    /// computes matrix `i`'s rows `range`. Each row goes through the kernel as it would alone, so
    /// the split never changes a bit.
    fn row_section(
        &self,
        span: trace::Span,
        label: &'static str,
        rows: &[usize],
        out: &mut [f32],
        row_bytes: usize,
        rows_of: &RowsOf<'_>,
    ) {
        let total: usize = rows.iter().sum();
        debug_assert_eq!(out.len(), total);
        let key = if span.is_recording() { trace::next_id() } else { 0 };
        let flows = span.flows_out(self.threads());
        // where each matrix starts in `out`
        let starts: Few<usize> = rows.iter().scan(0, |acc, r| Some(std::mem::replace(acc, *acc + r))).collect();
        self.for_pieces_mut(out, 1, row_bytes, &|piece, oc, p| {
            let _c = trace::span(label).merge_with(key);
            trace::flow_in(flows.map(|f| f + p as u64), key);
            // global rows [r0, r1): the part of each matrix they cover
            let (r0, r1) = (piece.start, piece.end);
            for (i, (&n, &m0)) in rows.iter().zip(&starts).enumerate() {
                let (a, b) = (r0.max(m0), r1.min(m0 + n));
                if a < b {
                    rows_of(i, a - m0..b - m0, &mut oc[a - r0..b - r0]);
                }
            }
        });
        drop(span);
    }

    /// `out[t, r] = W[r] · x[t]` for `x` of `[n, w.cols]` and `out` of `[n, w.rows]`.
    /// `label` names the product in the trace (on this thread and on the workers' tracks).
    pub fn matmul(&self, label: &'static str, w: &Mat<'_>, x: &[f32], n: usize, out: &mut [f32], s: &mut Scratch) {
        debug_assert_eq!(x.len(), n * w.cols);
        // `other`, not `qa`: one product of its own input (o_proj, out_proj, a shared expert's
        // down) takes another width than the layer inputs `qa` serves, and growing a buffer
        // back after a narrower input zeroes the difference on this thread alone (3 MiB before
        // each o_proj of a 512-token chunk)
        let Scratch { other, t, .. } = s;
        let input = self.quantized(w, x, other);
        self.product(label, w, input, n, out, t);
    }

    /// Several products of the same input (attention's q, k and v; an expert's gate and up
    /// over its tokens), each `(label, W, out)`: `x` is quantized once for all the matrices
    /// that take the same quantized input as the first, again for any that do not.
    pub fn matmul_shared(
        &self,
        x: &[f32],
        n: usize,
        products: &mut [(&'static str, &Mat<'_>, &mut [f32])],
        s: &mut Scratch,
    ) {
        let Some(first) = products.first() else { return };
        let (cols, group) = (first.1.cols, first.1.quant_group());
        let Scratch { qa, t, other, .. } = s;
        let input = self.quantized(first.1, x, qa);
        for (label, w, out) in products.iter_mut() {
            if w.cols == cols && w.quant_group() == group {
                self.product(label, w, input, n, out, t);
            } else {
                let inp = self.quantized(w, x, other);
                self.product(label, w, inp, n, out, t);
            }
        }
    }

    /// Several products of one input already in the form each matrix reads (`input`, `n`
    /// tokens: an expert's gate and up over its rows of a layer's input quantized once), each
    /// `(label, W, out)`.
    pub fn products_of(
        &self,
        input: Input<'_>,
        n: usize,
        products: &mut [(&'static str, &Mat<'_>, &mut [f32])],
        s: &mut Scratch,
    ) {
        for (label, w, out) in products.iter_mut() {
            self.product(label, w, input, n, out, &mut s.t);
        }
    }

    /// `out[t, r] = W[r] · input[t]`, the input already in the form `w` reads; `t` is scratch
    /// for the weight-row-major results of several tokens.
    fn product(&self, label: &'static str, w: &Mat<'_>, input: Input<'_>, n: usize, out: &mut [f32], t: &mut Vec<f32>) {
        let span = product_span(label, w, w.rows, n);
        // the workers' chunks of this product merge into one slice per worker, each reached
        // by a flow from this slice
        let key = if span.is_recording() { trace::next_id() } else { 0 };
        let flows = span.flows_out(self.threads());
        debug_assert_eq!(out.len(), n * w.rows);
        let isa = self.isa;
        if n == 1 {
            self.for_pieces_mut(out, 1, row_bytes(w), &|rows, oc, p| {
                let _c = trace::span(label).merge_with(key);
                trace::flow_in(flows.map(|b| b + p as u64), key);
                w.matmul_rows(isa, input, 1, rows, oc);
            });
            return;
        }
        // each piece's results straight into its rows' columns of `out` (`[n, w.rows]`): the
        // q4 lanes kernel writes a token's 16 rows as one store, the other kernels weight-row-
        // major into the piece's part of `t` first, then 16 rows at a time
        // (`Mat::matmul_rows_tokens`; a serial transpose after the section would leave the
        // other threads waiting)
        // grown, never shrunk: a resize after a smaller product zeroed the difference on this
        // thread while the others waited (16 MiB before a 8192-row product of 512 tokens)
        if t.len() < w.rows * n {
            t.resize(w.rows * n, 0.0);
        }
        let dst = Chunks::new(out);
        // a row's work is its bytes times the tokens: the pieces' floor counts both (by the
        // bytes alone, a 512-row shared expert of a 512-token chunk made 8 pieces for 16 threads)
        self.for_pieces_mut(&mut t[..w.rows * n], n, row_bytes(w) * n, &|rows, buf, p| {
            let _c = trace::span(label).merge_with(key);
            trace::flow_in(flows.map(|b| b + p as u64), key);
            // SAFETY: `out` is `[n, w.rows]` and outlives the section; the pieces are disjoint
            // row ranges, and this task alone writes its rows of each token
            unsafe { w.matmul_rows_tokens(isa, input, n, rows.clone(), buf, (dst.at(rows.start), w.rows)) };
        });
    }
}

/// The trace slice of a product of `rows` rows of matrices like `w` with `tokens` inputs.
fn product_span(label: &'static str, w: &Mat<'_>, rows: usize, tokens: usize) -> trace::Span {
    trace::span(label).args_with(|a| {
        a.push(("rows", rows.into()));
        a.push(("cols", w.cols.into()));
        a.push(("tokens", tokens.into()));
        a.push(("format", w.format().name().into()));
        a.push(("weight_bytes", (rows * row_bytes(w)).into()));
    })
}

/// Weight bytes of one row of `w`, values and scales (and mins, or k4 records).
fn row_bytes(w: &Mat<'_>) -> usize {
    w.row_bytes()
}

#[cfg(test)]
mod tests;
