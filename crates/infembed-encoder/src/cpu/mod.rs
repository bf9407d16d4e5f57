//! The CPU wing: kernels for burn's `flex` backend, private to the crate. The models never
//! call them; [`crate::ops`] does, and runs burn's own op whenever a kernel hands its input
//! back (another backend, another dtype, a checkpointing autodiff).
//!
//! - [`gemm`]: a packed, cache-blocked `f32` matrix product with a fused epilogue (bias,
//!   residual, GELU), the linear layers' and attention's products;
//! - [`elementwise`]: exact GELU and dropout, vectorized and threaded, with their backward steps;
//! - [`linear`]: linear layers (optionally with GELU) through [`gemm`], with their backward step;
//! - [`norm`]: LayerNorm as one autodiff operation;
//! - [`attention`]: the packed self-attention of the BERT family, for inference and training;
//! - [`qgemm`]: the int8 product of inference with `quantize = "int8"` (docs/int8.md).
//!
//! Each kernel chooses its code path at run time from the processor's features (AVX2/FMA, and
//! AVX-512 / VNNI for int8, through `pulp`'s safe wrappers; a portable loop otherwise). Benchmarks reach the matrix
//! product through the `bench-internals` cargo feature ([`crate::bench_internals`]).

/// Whether tensors on `device` reach this wing's kernels without autodiff: burn's `flex`
/// backend (whose own attention also shares key/value heads among grouped query heads,
/// which cubecl's does not).
pub(crate) fn is_plain_flex(device: &burn::tensor::Device) -> bool {
    !device.is_autodiff() && *device == burn::tensor::Device::flex()
}

// The `try_*` kernels return `Result<Tensor, Tensor>`: the `Err` hands the caller's own
// tensor back untouched (no copy), and both variants are one tensor handle.
pub(crate) mod attention;
#[allow(clippy::result_large_err)]
pub(crate) mod elementwise;
pub(crate) mod gemm;
#[allow(clippy::result_large_err)]
pub(crate) mod linear;
#[allow(clippy::result_large_err)]
pub(crate) mod norm;
pub(crate) mod qgemm;
