//! The `.moe` package: one file holding a converted model, laid out for expert streaming.

pub mod error;
pub mod finite;
pub mod layout;
mod mtp;
pub mod reader;
mod resident;
mod scale_form;
pub mod sigbus;
mod sink;
mod validate;
pub mod writer;

pub use error::PackageError;
pub use layout::{DType, ExpertRegion, Meta, MtpSection, QuantInfo, TensorEntry, TokenizerInfo};
pub use reader::{ExpertMats, OpenOptions, Package, PackageSizes, TensorId};
