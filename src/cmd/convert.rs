//! `moescope convert HF_DIR -o OUT.moe [--quant q4]`.

use anyhow::Result;
use moescope::convert::{ConvertOptions, QuantMode, convert_hf};

use super::interrupt::{self, Interruptible};
use crate::cli::ConvertArgs;

pub fn run(a: &ConvertArgs) -> Result<()> {
    let quant = QuantMode::parse(&a.quant).map_err(anyhow::Error::msg)?;
    interrupt::install();
    let _busy = Interruptible::start();
    let opts = ConvertOptions { progress: true, cancel: Some(&interrupt::STOP), ..ConvertOptions::new(quant) };
    let rep = convert_hf(&a.hf_dir, &a.output, opts)?;
    for w in &rep.warnings {
        eprintln!("warning: {w}");
    }
    eprintln!(
        "wrote {} ({:.1} MB, {}) in {:.1} s",
        rep.out.display(),
        rep.bytes as f64 / 1e6,
        quant.name(),
        rep.seconds
    );
    Ok(())
}
