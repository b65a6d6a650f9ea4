//! `moescope synth --shape NAME -o OUT.moe [--layers N] [--experts N] [--vocab N] [--quant Q]
//! [--seed S]`.

use anyhow::Result;
use moescope::convert::QuantMode;
use moescope::synth::{SynthSpec, shapes, synthesize};

use super::interrupt::{self, Interruptible};
use crate::cli::SynthArgs;

pub fn run(a: &SynthArgs) -> Result<()> {
    let shape = shapes::find(&a.shape).map_err(anyhow::Error::msg)?;
    let spec = SynthSpec {
        shape,
        layers: a.layers,
        experts: a.experts,
        vocab: a.vocab,
        quant: match &a.quant {
            Some(q) => QuantMode::parse(q).map_err(anyhow::Error::msg)?,
            None => shape.default_quant(),
        },
        seed: a.seed,
    };
    interrupt::install();
    let _busy = Interruptible::start();
    let rep = synthesize(&spec, &a.output, true, Some(&interrupt::STOP))?;
    for w in &rep.warnings {
        eprintln!("warning: {w}");
    }
    eprintln!(
        "wrote {} ({}, {}, seed {}: {:.2} GB) in {:.1} s ({:.2} GB/s)",
        a.output.display(),
        spec.name(),
        spec.quant.name(),
        spec.seed,
        rep.bytes as f64 / 1e9,
        rep.seconds,
        rep.bytes as f64 / 1e9 / rep.seconds.max(1e-9)
    );
    Ok(())
}
