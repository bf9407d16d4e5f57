//! Where tensors live: the device names users type (`cpu`, `wgpu:1`, `cuda:0`), the
//! precision a device computes in, and what this build can see.
//!
//! burn 0.22 picks the backend at run time from the [`Device`] value, so one binary with
//! `wgpu` compiled in beside `flex` serves every device; nothing in this workspace relies on
//! `Device::default()` (which prefers a GPU backend when one is compiled in). A device
//! whose cargo feature is not compiled in is a one-line error naming the feature.

use std::fmt;
use std::str::FromStr;

use burn::tensor::{Device, DeviceError, FloatDType, Tensor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// Serde through the type's name: `Display` out, `FromStr` in (errors become serde's).
macro_rules! serde_by_name {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(
                &self,
                serializer: S,
            ) -> std::result::Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(
                deserializer: D,
            ) -> std::result::Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A device as written on the command line or in a config: `cpu` (burn's `flex`, the
/// default), `wgpu[:N]` (Vulkan, Metal or DX12 through wgpu, WGSL shaders; the software
/// Vulkan driver included), `vulkan[:N]` (wgpu pinned to Vulkan, SPIR-V shaders) or
/// `cuda[:N]`.
///
/// Without an index, `wgpu` and `vulkan` take the adapter wgpu prefers (a discrete GPU
/// first; `CUBECL_WGPU_DEFAULT_DEVICE=Cpu` picks the software driver) and `cuda` takes GPU
/// 0. `wgpu:N` / `vulkan:N` is the N-th adapter that `infembed devices` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeviceSpec {
    /// burn's pure-Rust CPU backend (`flex`) with this crate's CPU kernels.
    #[default]
    Cpu,
    /// A wgpu adapter (the default one, or the N-th listed).
    Wgpu(Option<usize>),
    /// A wgpu adapter pinned to Vulkan (SPIR-V shaders).
    Vulkan(Option<usize>),
    /// A CUDA GPU (index 0 by default).
    Cuda(Option<usize>),
}

impl DeviceSpec {
    /// The cargo feature of the `infembed` crate this device needs (`None` for `cpu`).
    pub fn feature(&self) -> Option<&'static str> {
        match self {
            Self::Cpu => None,
            Self::Wgpu(_) => Some("wgpu"),
            Self::Vulkan(_) => Some("vulkan"),
            Self::Cuda(_) => Some("cuda"),
        }
    }

    /// Whether this build can open the device (its backend was compiled in).
    pub fn is_compiled(&self) -> bool {
        match self {
            Self::Cpu => true,
            Self::Wgpu(_) => cfg!(feature = "wgpu"),
            Self::Vulkan(_) => cfg!(feature = "vulkan"),
            Self::Cuda(_) => cfg!(feature = "cuda"),
        }
    }

    /// Whether this is the CPU.
    pub fn is_cpu(&self) -> bool {
        matches!(self, Self::Cpu)
    }

    /// The burn device, in f32. Opening a GPU device that is absent (no adapter, no driver)
    /// is an [`Error::Device`], not a panic.
    pub fn device(&self) -> Result<Device> {
        self.device_with(Precision::F32)
    }

    /// The burn device computing in `precision`.
    ///
    /// The CPU computes in f32 only. On a GPU device `bf16` / `f16` become the device's float
    /// type (burn's `Device::configure`): every float tensor created on it has that type, and
    /// models loaded onto it cast their weights to it once, at load. burn fixes a device's
    /// types when the first tensor is made on it, so a process cannot use one GPU in two
    /// precisions: asking for another precision after that is an [`Error::Device`].
    pub fn device_with(&self, precision: Precision) -> Result<Device> {
        if !self.is_compiled() {
            let feature = self.feature().unwrap_or("?");
            return Err(self.error(format!(
                "this build has no `{feature}` backend: rebuild with the cargo feature `{feature}` \
                 (cargo build --release --features {feature})"
            )));
        }
        if self.is_cpu() && precision != Precision::F32 {
            return Err(self.error(format!(
                "the CPU computes in f32; `dtype = \"{precision}\"` is for GPU devices (on a CPU \
                 with AVX512-BF16, `--quantize bf16` computes the linear layers in bf16 at \
                 inference)"
            )));
        }
        let mut device = self.open()?;
        if self.is_cpu() {
            return Ok(device);
        }
        let wanted = precision.float_dtype();
        let current = guarded(|| Ok(device.settings().float_dtype)).map_err(|p| self.error(p))?;
        if current != wanted {
            let configured = guarded(|| Ok(device.configure(wanted)));
            match configured {
                Ok(Ok(())) => {}
                Ok(Err(DeviceError::UnsupportedDType { .. })) => {
                    return Err(self.error(format!(
                        "this device cannot compute in {precision} (its backend does not offer \
                         that type; wgpu has f16 where the GPU does, and no bf16)"
                    )));
                }
                Ok(Err(_)) => {
                    return Err(self.error(format!(
                        "cannot switch it to {precision}: it already computes in \
                         {current:?} in this process (burn fixes a device's float type at its \
                         first tensor)"
                    )));
                }
                Err(p) => return Err(self.error(p)),
            }
        }
        self.probe(device)
    }

    fn error(&self, problem: String) -> Error {
        Error::Device {
            device: self.to_string(),
            problem,
        }
    }

    /// The device value (lazy: nothing is opened yet).
    fn open(&self) -> Result<Device> {
        match *self {
            Self::Cpu => Ok(Device::flex()),
            #[cfg(feature = "wgpu")]
            Self::Wgpu(index) => guarded(|| wgpu_device(index, false)).map_err(|p| self.error(p)),
            #[cfg(feature = "vulkan")]
            Self::Vulkan(index) => guarded(|| wgpu_device(index, true)).map_err(|p| self.error(p)),
            #[cfg(feature = "cuda")]
            Self::Cuda(index) => Ok(Device::cuda(index.unwrap_or(0))),
            #[allow(unreachable_patterns)]
            _ => Err(self.error("not compiled in".into())),
        }
    }

    /// Opens the device and runs one tiny kernel, turning the backend's panic on a missing
    /// adapter or driver into an error that names the device.
    fn probe(&self, device: Device) -> Result<Device> {
        guarded(|| {
            Tensor::<1>::zeros([1], &device)
                .into_data()
                .convert::<f32>()
                .try_into_vec::<f32>()
                .map_err(|e| format!("{e:?}"))?;
            Ok(device)
        })
        .map_err(|p| self.error(p))
    }
}

/// Runs `f`, turning a panic of the backend (no adapter, no driver) into its message.
fn guarded<T>(
    f: impl FnOnce() -> std::result::Result<T, String>,
) -> std::result::Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => Err(format!(
            "cannot open it: {} (see docs/devices.md for drivers)",
            panic_message(&panic)
        )),
    }
}

/// The message of a caught panic (its `&str` or `String` payload).
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "the backend panicked".into()
    }
}

/// The wgpu device: the preferred adapter, or the `index`-th that wgpu lists.
#[cfg(feature = "wgpu")]
fn wgpu_device(index: Option<usize>, vulkan: bool) -> std::result::Result<Device, String> {
    use burn::tensor::DeviceKind;
    let Some(index) = index else {
        #[cfg(feature = "vulkan")]
        if vulkan {
            return Ok(Device::vulkan(DeviceKind::DefaultDevice));
        }
        let _ = vulkan;
        return Ok(Device::wgpu(DeviceKind::DefaultDevice));
    };
    let listed = wgpu_adapters(vulkan);
    let count = listed.len();
    listed.into_iter().nth(index).ok_or_else(|| {
        format!("no adapter {index}: this machine lists {count} (see `infembed devices`)")
    })
}

#[cfg(feature = "wgpu")]
fn wgpu_adapters(vulkan: bool) -> Vec<Device> {
    use burn::tensor::DeviceType;
    #[cfg(feature = "vulkan")]
    if vulkan {
        return Device::enumerate(DeviceType::Vulkan).into_vec();
    }
    let _ = vulkan;
    Device::enumerate(DeviceType::Wgpu).into_vec()
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, index) = match self {
            Self::Cpu => ("cpu", None),
            Self::Wgpu(i) => ("wgpu", *i),
            Self::Vulkan(i) => ("vulkan", *i),
            Self::Cuda(i) => ("cuda", *i),
        };
        match index {
            Some(i) => write!(f, "{name}:{i}"),
            None => f.write_str(name),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |problem: String| Error::Device {
            device: s.to_string(),
            problem,
        };
        let text = s.trim().to_ascii_lowercase();
        let (name, index) = match text.split_once(':') {
            Some((name, index)) => {
                let index: usize = index.trim().parse().map_err(|_| {
                    bad(format!(
                        "the index after `:` must be a number, not {index:?}"
                    ))
                })?;
                (name.trim().to_string(), Some(index))
            }
            None => (text.clone(), None),
        };
        match name.as_str() {
            "cpu" | "flex" if index.is_none() => Ok(Self::Cpu),
            "cpu" | "flex" => Err(bad("the CPU takes no index".into())),
            "wgpu" => Ok(Self::Wgpu(index)),
            "vulkan" => Ok(Self::Vulkan(index)),
            "cuda" => Ok(Self::Cuda(index)),
            _ => Err(bad(
                "unknown device (expected cpu, wgpu[:N], vulkan[:N] or cuda[:N])".into(),
            )),
        }
    }
}

serde_by_name!(DeviceSpec);

/// The float type a device computes in: `f32` (the default, and the only one on the CPU),
/// `bf16` or `f16` (GPU devices, inference; see [`DeviceSpec::device_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// 32-bit floats.
    #[default]
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
}

impl Precision {
    /// burn's float type for this precision.
    pub fn float_dtype(self) -> FloatDType {
        match self {
            Self::F32 => FloatDType::F32,
            Self::Bf16 => FloatDType::BF16,
            Self::F16 => FloatDType::F16,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        })
    }
}

impl FromStr for Precision {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f16" | "float16" | "half" => Ok(Self::F16),
            _ => Err(Error::UnknownName {
                what: "dtype",
                name: s.to_string(),
                expected: "f32, bf16 or f16".into(),
            }),
        }
    }
}

/// How the linear layers of a model compute at inference on the CPU: in `f32` (the default),
/// through int8 products (`"int8"`: weights quantized per output channel once, when the
/// model is prepared; activations per token as each product runs; sums in 32-bit integers;
/// the bias and activation applied in `f32`), or through bf16 products (`"bf16"`: weights
/// rounded to bf16 once, activations as each product runs, sums in `f32`; needs a processor
/// with AVX512-BF16). Attention's score and context products, softmax, LayerNorm, pooling
/// and a Dense head stay `f32`. Training always computes in `f32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Quantization {
    /// No quantization.
    #[default]
    None,
    /// Dynamic int8 quantization of the linear layers.
    Int8,
    /// bf16 products of the linear layers (AVX512-BF16).
    Bf16,
}

impl Quantization {
    /// Whether this is [`Quantization::None`] (for `skip_serializing_if`).
    pub fn is_none(&self) -> bool {
        *self == Self::None
    }
}

impl fmt::Display for Quantization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Int8 => "int8",
            Self::Bf16 => "bf16",
        })
    }
}

impl FromStr for Quantization {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "f32" => Ok(Self::None),
            "int8" | "i8" => Ok(Self::Int8),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            _ => Err(Error::UnknownName {
                what: "quantization",
                name: s.to_string(),
                expected: "none, int8 or bf16".into(),
            }),
        }
    }
}

serde_by_name!(Quantization);

serde_by_name!(Precision);

/// One line of `infembed devices`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceListing {
    /// The name to pass to `--device`.
    pub spec: DeviceSpec,
    /// What the backend says the device is (adapter name, driver), or why it is unusable.
    pub description: String,
}

/// Every device this build can see: the CPU, then each wgpu (and Vulkan) adapter, then the
/// CUDA GPUs, each with a description. Backends that are not compiled in are listed by
/// [`missing_backends`].
pub fn list_devices() -> Vec<DeviceListing> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    #[allow(unused_mut)]
    let mut out = vec![DeviceListing {
        spec: DeviceSpec::Cpu,
        description: format!("burn flex (pure Rust), f32, {threads} threads"),
    }];
    #[cfg(feature = "wgpu")]
    {
        let listed = std::panic::catch_unwind(|| describe_all(wgpu_adapters(false)));
        push_listed(&mut out, listed, DeviceSpec::Wgpu);
    }
    #[cfg(feature = "vulkan")]
    {
        let listed = std::panic::catch_unwind(|| describe_all(wgpu_adapters(true)));
        push_listed(&mut out, listed, DeviceSpec::Vulkan);
    }
    #[cfg(feature = "cuda")]
    {
        let listed = std::panic::catch_unwind(|| {
            describe_all(Device::enumerate(burn::tensor::DeviceType::Cuda).into_vec())
        });
        push_listed(&mut out, listed, DeviceSpec::Cuda);
    }
    out
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn describe_all(devices: Vec<Device>) -> Vec<String> {
    devices
        .iter()
        .map(|d| match d.identity() {
            Some(id) => format!("{} ({})", id.name, id.fingerprint),
            None => format!("{d:?}"),
        })
        .collect()
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn push_listed(
    out: &mut Vec<DeviceListing>,
    listed: std::thread::Result<Vec<String>>,
    spec: fn(Option<usize>) -> DeviceSpec,
) {
    match listed {
        Ok(names) if names.is_empty() => out.push(DeviceListing {
            spec: spec(None),
            description: "compiled in, but no adapter found (driver missing?)".into(),
        }),
        Ok(names) => {
            out.extend(
                names
                    .into_iter()
                    .enumerate()
                    .map(|(i, description)| DeviceListing {
                        spec: spec(Some(i)),
                        description,
                    }),
            )
        }
        Err(panic) => out.push(DeviceListing {
            spec: spec(None),
            description: format!("compiled in, but unusable: {}", panic_message(&panic)),
        }),
    }
}

/// The GPU backends this build lacks, with the cargo feature that brings each.
pub fn missing_backends() -> Vec<(DeviceSpec, &'static str)> {
    [
        DeviceSpec::Wgpu(None),
        DeviceSpec::Vulkan(None),
        DeviceSpec::Cuda(None),
    ]
    .into_iter()
    .filter(|s| !s.is_compiled())
    .filter_map(|s| s.feature().map(|f| (s, f)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_round_trip_and_bad_ones_are_named() {
        for text in [
            "cpu", "wgpu", "wgpu:1", "vulkan", "vulkan:0", "cuda", "cuda:3",
        ] {
            let spec: DeviceSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
        }
        assert_eq!("FLEX".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!(
            " Wgpu : 2 ".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Wgpu(Some(2))
        );
        for bad in ["gpu", "cpu:1", "cuda:x", "wgpu:-1", ""] {
            let err = bad.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(err.contains("device"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_backend_not_compiled_in_names_its_feature() {
        for spec in [
            DeviceSpec::Wgpu(None),
            DeviceSpec::Vulkan(Some(0)),
            DeviceSpec::Cuda(Some(1)),
        ] {
            if spec.is_compiled() {
                continue;
            }
            let err = spec.device().unwrap_err().to_string();
            let feature = spec.feature().unwrap();
            assert!(err.contains(&format!("`{feature}`")), "{err}");
            assert!(
                missing_backends()
                    .iter()
                    .any(|(s, _)| *s == spec.with_index(None))
            );
        }
        assert!(DeviceSpec::Cpu.device().is_ok());
        let err = DeviceSpec::Cpu
            .device_with(Precision::Bf16)
            .unwrap_err()
            .to_string();
        assert!(err.contains("f32"), "{err}");
    }

    #[test]
    fn precisions_parse_and_serde_uses_the_names() {
        assert_eq!("BF16".parse::<Precision>().unwrap(), Precision::Bf16);
        assert!("f8".parse::<Precision>().is_err());
        let json = serde_json::to_string(&(DeviceSpec::Wgpu(Some(1)), Precision::F16)).unwrap();
        assert_eq!(json, r#"["wgpu:1","f16"]"#);
        let back: (DeviceSpec, Precision) = serde_json::from_str(&json).unwrap();
        assert_eq!(back, (DeviceSpec::Wgpu(Some(1)), Precision::F16));
        assert!(serde_json::from_str::<DeviceSpec>(r#""tpu""#).is_err());
    }

    impl DeviceSpec {
        fn with_index(self, index: Option<usize>) -> Self {
            match self {
                Self::Cpu => Self::Cpu,
                Self::Wgpu(_) => Self::Wgpu(index),
                Self::Vulkan(_) => Self::Vulkan(index),
                Self::Cuda(_) => Self::Cuda(index),
            }
        }
    }
}
