//! How the model's matrix products run: on which ISA tier and over which threads.
//! The kernels crate has no threads; this splits a product's output rows over a rayon pool.

use moescope_kernels::mat::Input;
use moescope_kernels::{Isa, Mat, QuantAct};
use rayon::prelude::*;

use crate::trace;

pub struct Exec {
    pub isa: Isa,
    pool: rayon::ThreadPool,
}

/// Buffers a product needs besides its output, kept between calls.
#[derive(Default)]
pub struct Scratch {
    qa: QuantAct,
    t: Vec<f32>,
}

impl Exec {
    pub fn new(threads: usize, isa: Isa) -> Result<Exec, String> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("moescope-compute-{i}"))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Exec { isa, pool })
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Run `f` inside the pool (so nested parallel loops use its threads).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// `out[t, r] = W[r] · x[t]` for `x` of `[n, w.cols]` and `out` of `[n, w.rows]`.
    /// `label` names the product in the trace (on this thread and on the workers' tracks).
    pub fn matmul(&self, label: &'static str, w: &Mat<'_>, x: &[f32], n: usize, out: &mut [f32], s: &mut Scratch) {
        let span = trace::span(label).args_with(|a| {
            let f = w.format();
            a.push(("rows", w.rows.into()));
            a.push(("cols", w.cols.into()));
            a.push(("tokens", n.into()));
            a.push(("format", f.name().into()));
            a.push(("weight_bytes", (f.data_bytes(w.rows, w.cols) + f.scale_bytes(w.rows, w.cols)).into()));
        });
        // the workers' chunks of this product merge into one slice per worker, each reached
        // by a flow from this slice
        let key = if span.is_recording() { trace::next_id() } else { 0 };
        let flows = span.flows_out(self.threads());
        debug_assert_eq!(x.len(), n * w.cols);
        debug_assert_eq!(out.len(), n * w.rows);
        let input = match w.quant_group() {
            Some(g) => {
                s.qa.quantize(x, w.cols, g);
                Input::Quant(&s.qa)
            }
            None => Input::F32(x),
        };
        let isa = self.isa;
        // enough chunks to balance the threads, each a few hundred KB of weights at most
        let chunks = (self.threads() * 4).max(1);
        let rows_per = w.rows.div_ceil(chunks).max(8);
        let run = |o: &mut [f32], n: usize| {
            self.pool.install(|| {
                o.par_chunks_mut(rows_per * n).enumerate().for_each(|(ci, oc)| {
                    let _c = trace::span(label).merge_with(key);
                    trace::flow_in(flows.map(|b| b + rayon::current_thread_index().unwrap_or(0) as u64), key);
                    let r0 = ci * rows_per;
                    w.matmul_rows(isa, input, n, r0..r0 + oc.len() / n, oc);
                })
            })
        };
        if n == 1 {
            run(out, 1);
        } else {
            // weight-row-major results (each chunk contiguous), then one transpose
            s.t.resize(w.rows * n, 0.0);
            let mut t = std::mem::take(&mut s.t);
            run(&mut t, n);
            for r in 0..w.rows {
                for i in 0..n {
                    out[i * w.rows + r] = t[r * n + i];
                }
            }
            s.t = t;
        }
    }
}
