//! Helpers shared by the integration tests (fixtures, host-side reference maths).
#![allow(dead_code)]

use std::path::PathBuf;

use burn::prelude::*;

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A vendored fixture directory of this crate.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The all-MiniLM-L6-v2 directory; when absent, `None` after a recorded skip, or a failure
/// under `CI=true` (`infembed_testkit::minilm_dir`).
pub fn minilm_dir(test: &str) -> Option<PathBuf> {
    infembed_testkit::minilm_dir(test)
}

/// The CPU device.
pub fn device() -> Device {
    Device::flex()
}

/// The wgpu device (Mesa's software Vulkan driver in CI); when the backend is not compiled
/// in or no adapter opens, `None` after a recorded skip, or a failure under `CI=true`.
pub fn wgpu_device(test: &str) -> Option<Device> {
    match infembed_encoder::DeviceSpec::Wgpu(None).device() {
        Ok(device) => Some(device),
        Err(e) => infembed_testkit::wgpu_missing(test, &e),
    }
}

#[allow(unused_imports)] // not every test binary copies fixtures
pub use infembed_testkit::copy_dir;

/// Rows of a `[N, d]` tensor.
pub fn rows(t: Tensor<2>) -> Vec<Vec<f32>> {
    infembed_encoder::tensor_rows(t).expect("readback")
}

/// Max absolute difference between two equal-length vectors.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Cosine similarity in f64.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Reads a JSON file.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("read fixture")).expect("json")
}

/// A JSON array of numbers as f32.
pub fn f32s(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

/// A JSON array of integers as u32.
pub fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("integer") as u32)
        .collect()
}
