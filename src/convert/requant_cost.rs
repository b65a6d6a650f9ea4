//! What requantizing a GGUF file's values cost (`convert model.gguf --quant q4`): the package's
//! weights read back and compared with the file's, as the relative RMS error
//! `sqrt(sum (w' - w)^2 / sum w^2)` over the dense matrices and a sample of experts (three per
//! MoE layer: the first, middle and last, which every layer's slabs share a type across).

use std::path::Path;

use super::error::ConvertError;
use super::source::TensorSource;
use crate::package::Package;

#[derive(Debug, Clone, Default)]
struct Sums {
    err: f64,
    norm: f64,
}

impl Sums {
    fn add(&mut self, file: &[f32], ours: &[f32]) {
        for (a, b) in file.iter().zip(ours) {
            self.err += (*b as f64 - *a as f64).powi(2);
            self.norm += (*a as f64).powi(2);
        }
    }

    fn rel(&self) -> f64 {
        if self.norm > 0.0 { (self.err / self.norm).sqrt() } else { 0.0 }
    }
}

/// One line (`from`: what was done to whose values, "requantized from the file's"): the relative RMS error overall, of the dense weights and of the experts, and the
/// worst tensor.
pub fn requant_cost(src: &dyn TensorSource, pkg: &Path, from: &str) -> Result<String, ConvertError> {
    let p = Package::open(pkg)?;
    let (mut dense, mut experts) = (Sums::default(), Sums::default());
    let mut worst = (String::new(), 0f64);
    let (mut want, mut got) = (Vec::new(), Vec::new());
    let mut compare = |name: &str, m: moescope_kernels::Mat<'_>, into: &mut Sums| -> Result<(), ConvertError> {
        let mut one = Sums::default();
        for r in 0..m.rows {
            src.read_rows(name, r, 1, &mut want)?;
            got.resize(m.cols, 0.0);
            m.dequant_row(r, &mut got);
            one.add(&want, &got);
        }
        if one.rel() > worst.1 {
            worst = (src.source_name(name), one.rel());
        }
        into.err += one.err;
        into.norm += one.norm;
        Ok(())
    };
    for t in &p.meta.tensors {
        if t.shape.len() == 2 {
            let id = p.require(&t.name, &t.shape, false)?;
            compare(&t.name, p.mat_by_index(id), &mut dense)?;
        }
    }
    let cfg = p.meta.model.clone();
    for l in cfg.moe_layers() {
        let n = cfg.num_experts;
        let mut sample = vec![0, n / 2, n.saturating_sub(1)];
        sample.dedup();
        for e in sample {
            let x = p.expert(l, e)?;
            let names = super::plan::expert_tensors(&cfg, l, e);
            for (m, (name, _)) in [x.gate, x.up, x.down].into_iter().zip(names.iter()) {
                compare(name, m, &mut experts)?;
            }
        }
    }
    let all = Sums { err: dense.err + experts.err, norm: dense.norm + experts.norm };
    Ok(format!(
        "{from} values: relative RMS weight error {:.2}% (dense {:.2}%, experts {:.2}%); worst {} {:.2}%",
        100.0 * all.rel(),
        100.0 * dense.rel(),
        100.0 * experts.rel(),
        worst.0,
        100.0 * worst.1
    ))
}
