//! `moescope convert HF_DIR|MODEL.gguf -o OUT.moe [--quant q4]`.

use anyhow::Result;
use moescope::convert::{ConvertOptions, QuantMode, convert_gguf, convert_hf, gguf};

use super::interrupt::{self, Interruptible};
use crate::cli::ConvertArgs;

pub fn run(a: &ConvertArgs) -> Result<()> {
    let is_gguf = a.hf_dir.is_file() && gguf::is_gguf(&a.hf_dir);
    let quant = match (&a.quant, is_gguf) {
        (Some(q), _) => QuantMode::parse(q).map_err(anyhow::Error::msg)?,
        (None, true) => QuantMode::File,
        (None, false) => moescope::convert::default_hf_quant(&a.hf_dir),
    };
    interrupt::install();
    let _busy = Interruptible::start();
    let opts = ConvertOptions { progress: true, cancel: Some(&interrupt::STOP), ..ConvertOptions::new(quant) };
    let rep = if is_gguf { convert_gguf(&a.hf_dir, &a.output, opts)? } else { convert_hf(&a.hf_dir, &a.output, opts)? };
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
