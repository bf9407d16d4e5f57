//! Benchmark support for the infembed workspace: deterministic generators of synthetic inputs shared by
//! the criterion benches in `benches/` and by the comparison scripts in `benches/compare/`.

pub mod encoder_data;
pub mod losses_data;
pub mod metrics_data;
