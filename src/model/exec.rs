//! How the model's matrix products run: on which ISA tier and over which threads.
//! The kernels crate has no threads; this splits a product's output rows over the pool.

use moescope_kernels::mat::Input;
use moescope_kernels::quant::{Format, ROW_BLOCK};
use moescope_kernels::{Isa, Mat, QuantAct};

use super::pool::Pool;
use crate::trace;

pub struct Exec {
    pub isa: Isa,
    pool: Pool,
    /// The same tier on the calling thread alone, for work already split over the pool (a task
    /// of a parallel section cannot open another); None when this one is single-threaded.
    serial: Option<Box<Exec>>,
}

/// A pointer to an output shared by the tasks of one section, each writing its own part.
pub(crate) struct Chunks {
    ptr: *mut f32,
    len: usize,
}
// SAFETY: tasks write disjoint parts (see `for_chunks_mut` and the MoE layer's expert tasks)
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
}

/// Buffers a product needs besides its output, kept between calls.
#[derive(Default)]
pub struct Scratch {
    qa: QuantAct,
    t: Vec<f32>,
    /// one quantized input per product of [`Exec::matvec_each`]
    qas: Vec<QuantAct>,
}

impl Exec {
    pub fn new(threads: usize, isa: Isa) -> Result<Exec, String> {
        let pool = Pool::new(threads).map_err(|e| format!("starting {threads} compute threads: {e}"))?;
        let serial = if pool.threads() > 1 { Some(Box::new(Exec::new(1, isa)?)) } else { None };
        Ok(Exec { isa, pool, serial })
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// This tier on the calling thread alone (itself when single-threaded).
    pub fn serial(&self) -> &Exec {
        self.serial.as_deref().unwrap_or(self)
    }

    /// `f(task, participant)` for each task of `0..tasks`, in parallel over the compute threads;
    /// `f` must not open a parallel section of its own (use [`serial`](Self::serial)).
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        self.pool.run(tasks, f);
    }

    /// `f(i, chunk_i, participant)` for each `chunk`-sized piece of `data` (the last may be
    /// shorter), in parallel over the compute threads.
    pub fn for_chunks_mut(&self, data: &mut [f32], chunk: usize, f: &(dyn Fn(usize, &mut [f32], usize) + Sync)) {
        let chunk = chunk.max(1);
        let tasks = data.len().div_ceil(chunk);
        let len = data.len();
        let out = Chunks::new(data);
        self.pool.run(tasks, &|i, p| {
            let start = i * chunk;
            let n = chunk.min(len - start);
            // SAFETY: task i alone writes [start, start + n), inside `data`, which outlives the
            // section (`run` returns after every task)
            let c = unsafe { out.slice(start, n) };
            f(i, c, p);
        });
    }

    /// `out = [A x | B x | ...]` for one input row `x` (`[cols]`) and matrices of the same
    /// input size and format (an expert's gate and up; attention's q, k and v): `out` is their
    /// rows end to end. One parallel section instead of one per matrix, `chunks` pieces per
    /// thread running across the matrices' boundaries, and `x` quantized once. Falls back to one
    /// product per matrix when the formats or input sizes differ. `label` names the group in the
    /// trace.
    pub fn matvec_concat(
        &self,
        label: &'static str,
        mats: &[&Mat<'_>],
        x: &[f32],
        out: &mut [f32],
        chunks: usize,
        s: &mut Scratch,
    ) {
        let Some(first) = mats.first() else { return };
        let rows: usize = mats.iter().map(|m| m.rows).sum();
        debug_assert_eq!(out.len(), rows);
        if mats.iter().any(|m| m.cols != first.cols || m.format() != first.format()) {
            let mut rest = &mut out[..];
            for m in mats {
                let (o, r) = rest.split_at_mut(m.rows);
                self.matmul(label, m, x, 1, o, s);
                rest = r;
            }
            return;
        }
        let input = quantized(first, x, &mut s.qa);
        let prods: Vec<(&Mat<'_>, Input<'_>)> = mats.iter().map(|&m| (m, input)).collect();
        self.matvec_section(label, &prods, out, chunks);
    }

    /// `out = [A₀ x₀ | A₁ x₁ | ...]`: one token's products of several matrices, each with its
    /// own input (several experts' down projections), their rows end to end in `out`; one
    /// parallel section of `chunks` pieces per thread, as [`matvec_concat`](Self::matvec_concat).
    /// `s` keeps the quantized inputs between calls.
    pub fn matvec_each(
        &self,
        label: &'static str,
        prods: &[(&Mat<'_>, &[f32])],
        out: &mut [f32],
        chunks: usize,
        s: &mut Scratch,
    ) {
        if s.qas.len() < prods.len() {
            s.qas.resize_with(prods.len(), QuantAct::default);
        }
        // each input quantized with its own matrix's group (or read as it is by float weights)
        let inputs: Vec<(&Mat<'_>, Input<'_>)> =
            prods.iter().zip(s.qas.iter_mut()).map(|(&(m, x), qa)| (m, quantized(m, x, qa))).collect();
        self.matvec_section(label, &inputs, out, chunks);
    }

    /// The one section behind [`matvec_concat`](Self::matvec_concat) and
    /// [`matvec_each`](Self::matvec_each): `chunks` pieces per thread, each of whole blocks of
    /// interleaved rows and running across the matrices' boundaries. Each row goes through the
    /// kernel as it would alone, so the split never changes a bit.
    fn matvec_section(&self, label: &'static str, prods: &[(&Mat<'_>, Input<'_>)], out: &mut [f32], chunks: usize) {
        let Some((first, _)) = prods.first() else { return };
        let rows: usize = prods.iter().map(|(m, _)| m.rows).sum();
        debug_assert_eq!(out.len(), rows);
        let span = product_span(label, first.format(), rows, first.cols, 1);
        let key = if span.is_recording() { trace::next_id() } else { 0 };
        let flows = span.flows_out(self.threads());
        let isa = self.isa;
        // where each matrix starts in `out`
        let starts: Vec<usize> =
            prods.iter().scan(0, |acc, (m, _)| Some(std::mem::replace(acc, *acc + m.rows))).collect();
        // whole blocks of interleaved rows per chunk (`ROW_BLOCK`), so each chunk streams
        let rows_per = rows.div_ceil((self.threads() * chunks).max(1)).max(8).next_multiple_of(ROW_BLOCK);
        self.for_chunks_mut(out, rows_per, &|ci, oc, p| {
            let _c = trace::span(label).merge_with(key);
            trace::flow_in(flows.map(|f| f + p as u64), key);
            // global rows [r0, r1): the part of each matrix they cover
            let (r0, r1) = (ci * rows_per, ci * rows_per + oc.len());
            for ((m, input), &m0) in prods.iter().zip(&starts) {
                let (a, b) = (r0.max(m0), r1.min(m0 + m.rows));
                if a < b {
                    m.matmul_rows(isa, *input, 1, a - m0..b - m0, &mut oc[a - r0..b - r0]);
                }
            }
        });
    }

    /// `out[t, r] = W[r] · x[t]` for `x` of `[n, w.cols]` and `out` of `[n, w.rows]`.
    /// `label` names the product in the trace (on this thread and on the workers' tracks).
    pub fn matmul(&self, label: &'static str, w: &Mat<'_>, x: &[f32], n: usize, out: &mut [f32], s: &mut Scratch) {
        debug_assert_eq!(x.len(), n * w.cols);
        let Scratch { qa, t, .. } = s;
        let input = quantized(w, x, qa);
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
        let Scratch { qa, t, .. } = s;
        let input = quantized(first.1, x, qa);
        let mut other = QuantAct::default();
        for (label, w, out) in products.iter_mut() {
            if w.cols == cols && w.quant_group() == group {
                self.product(label, w, input, n, out, t);
            } else {
                let inp = quantized(w, x, &mut other);
                self.product(label, w, inp, n, out, t);
            }
        }
    }

    /// `out[t, r] = W[r] · input[t]`, the input already in the form `w` reads; `t` is scratch
    /// for the weight-row-major results of several tokens.
    fn product(&self, label: &'static str, w: &Mat<'_>, input: Input<'_>, n: usize, out: &mut [f32], t: &mut Vec<f32>) {
        let span = product_span(label, w.format(), w.rows, w.cols, n);
        // the workers' chunks of this product merge into one slice per worker, each reached
        // by a flow from this slice
        let key = if span.is_recording() { trace::next_id() } else { 0 };
        let flows = span.flows_out(self.threads());
        debug_assert_eq!(out.len(), n * w.rows);
        let isa = self.isa;
        // enough chunks to balance the threads, each a few hundred KB of weights at most
        let chunks = (self.threads() * 4).max(1);
        let rows_per = w.rows.div_ceil(chunks).max(8).next_multiple_of(ROW_BLOCK);
        let run = |o: &mut [f32], n: usize| {
            self.for_chunks_mut(o, rows_per * n, &|ci, oc, p| {
                let _c = trace::span(label).merge_with(key);
                trace::flow_in(flows.map(|b| b + p as u64), key);
                let r0 = ci * rows_per;
                w.matmul_rows(isa, input, n, r0..r0 + oc.len() / n, oc);
            })
        };
        if n == 1 {
            run(out, 1);
        } else {
            // weight-row-major results (each chunk contiguous), then one transpose
            t.resize(w.rows * n, 0.0);
            run(t, n);
            // in blocks of 16 rows: each token's 16 results are one cache line of `out`
            // (column by column, every store missed the cache: 7.5% of prefill)
            for r0 in (0..w.rows).step_by(16) {
                let r1 = (r0 + 16).min(w.rows);
                for i in 0..n {
                    for r in r0..r1 {
                        out[i * w.rows + r] = t[r * n + i];
                    }
                }
            }
        }
    }
}

/// The trace slice of a product of `rows` x `cols` weights in format `f` with `tokens` inputs.
fn product_span(label: &'static str, f: Format, rows: usize, cols: usize, tokens: usize) -> trace::Span {
    trace::span(label).args_with(|a| {
        a.push(("rows", rows.into()));
        a.push(("cols", cols.into()));
        a.push(("tokens", tokens.into()));
        a.push(("format", f.name().into()));
        a.push(("weight_bytes", (f.data_bytes(rows, cols) + f.scale_bytes(rows, cols)).into()));
    })
}

/// The input a product of `w` reads: `x` itself for float weights, else `x` quantized (into
/// `qa`) with the weight's group.
fn quantized<'a>(w: &Mat<'_>, x: &'a [f32], qa: &'a mut QuantAct) -> Input<'a> {
    match w.quant_group() {
        Some(g) => {
            qa.quantize(x, w.cols, g);
            Input::Quant(qa)
        }
        None => Input::F32(x),
    }
}
