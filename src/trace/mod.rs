//! Observability: the recorder (per-thread slices, counters, instants, flows), the Chrome
//! Trace / Perfetto exporter, and latency histograms.

pub mod chrome;
pub mod hist;
pub mod recorder;

pub use recorder::{Span, counter, enabled, flow_end, flow_in, instant, next_id, span};
