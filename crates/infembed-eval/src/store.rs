//! Where an [`crate::EmbeddingIndex`]'s values live: in memory as `f32` or `f16`, or in a
//! memory-mapped file.

use std::borrow::Cow;
use std::sync::Arc;

use half::f16;

use crate::scan::{Block, RowSource};

/// The number type an index stores its embeddings in.
///
/// Search always computes in `f32`: `f16` rows are widened as they are read (F16C where the
/// processor has it). `f16` halves the file and the memory of a large index; for unit vectors of
/// dimension 384 it moves a score by about `1e-4` (measured in docs/benchmarks.md), which can swap
/// near-tied documents but leaves retrieval metrics within their noise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[non_exhaustive]
pub enum IndexDtype {
    /// 32-bit IEEE floats (safetensors `F32`, NumPy `<f4`).
    #[default]
    F32,
    /// 16-bit IEEE floats (safetensors `F16`, NumPy `<f2`).
    F16,
}

impl IndexDtype {
    /// Bytes per value.
    pub fn width(self) -> usize {
        match self {
            IndexDtype::F32 => 4,
            IndexDtype::F16 => 2,
        }
    }

    /// The safetensors dtype name (`F32`, `F16`).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            IndexDtype::F32 => "F32",
            IndexDtype::F16 => "F16",
        }
    }

    /// The NumPy `descr` (`<f4`, `<f2`).
    pub fn npy_descr(self) -> &'static str {
        match self {
            IndexDtype::F32 => "<f4",
            IndexDtype::F16 => "<f2",
        }
    }

    /// The dtype a safetensors name or a NumPy `descr` names, if an index can hold it.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        match name {
            "F32" | "<f4" => Some(IndexDtype::F32),
            "F16" | "<f2" => Some(IndexDtype::F16),
            _ => None,
        }
    }
}

impl std::fmt::Display for IndexDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IndexDtype::F32 => "f32",
            IndexDtype::F16 => "f16",
        })
    }
}

impl std::str::FromStr for IndexDtype {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(IndexDtype::F32),
            "f16" | "float16" => Ok(IndexDtype::F16),
            _ => Err(format!(
                "unknown index dtype `{s}`: expected `f32` or `f16`"
            )),
        }
    }
}

/// The embeddings' storage: row-major values of one [`IndexDtype`].
#[derive(Clone)]
pub(crate) enum Rows {
    /// In memory, `f32`.
    F32(Vec<f32>),
    /// In memory, `f16`.
    F16(Vec<f16>),
    /// A memory-mapped file: `len` values of `dtype` from byte `start` (aligned to the type,
    /// little-endian: [`Rows::map`] checks both).
    Mapped {
        map: Arc<memmap2::Mmap>,
        start: usize,
        len: usize,
        dtype: IndexDtype,
    },
}

impl std::fmt::Debug for Rows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Rows::F32(_) => "in memory",
            Rows::F16(_) => "in memory",
            Rows::Mapped { .. } => "memory-mapped",
        };
        write!(f, "Rows({} values of {}, {kind})", self.len(), self.dtype())
    }
}

impl Rows {
    /// `len` values of `dtype` at byte `start` of `map`, when the platform can read them in
    /// place (little-endian, aligned); `None` otherwise (the caller reads them instead).
    pub(crate) fn map(
        map: Arc<memmap2::Mmap>,
        start: usize,
        len: usize,
        dtype: IndexDtype,
    ) -> Option<Self> {
        let end = start.checked_add(len.checked_mul(dtype.width())?)?;
        let bytes = map.get(start..end)?;
        let aligned = match dtype {
            IndexDtype::F32 => bytemuck::try_cast_slice::<u8, f32>(bytes).is_ok(),
            IndexDtype::F16 => bytemuck::try_cast_slice::<u8, u16>(bytes).is_ok(),
        };
        (cfg!(target_endian = "little") && aligned).then_some(Rows::Mapped {
            map,
            start,
            len,
            dtype,
        })
    }

    /// The stored type.
    pub(crate) fn dtype(&self) -> IndexDtype {
        match self {
            Rows::F32(_) => IndexDtype::F32,
            Rows::F16(_) => IndexDtype::F16,
            Rows::Mapped { dtype, .. } => *dtype,
        }
    }

    /// Number of values.
    pub(crate) fn len(&self) -> usize {
        match self {
            Rows::F32(v) => v.len(),
            Rows::F16(v) => v.len(),
            Rows::Mapped { len, .. } => *len,
        }
    }

    /// Whether the values live in a mapped file.
    pub(crate) fn is_mapped(&self) -> bool {
        matches!(self, Rows::Mapped { .. })
    }

    /// Values `a..b`.
    pub(crate) fn values(&self, a: usize, b: usize) -> Block<'_> {
        match self {
            Rows::F32(v) => Block::F32(&v[a..b]),
            Rows::F16(v) => Block::F16(&v[a..b]),
            Rows::Mapped {
                map,
                start,
                dtype: IndexDtype::F32,
                ..
            } => Block::F32(bytemuck::cast_slice(&map[start + 4 * a..start + 4 * b])),
            Rows::Mapped {
                map,
                start,
                dtype: IndexDtype::F16,
                ..
            } => {
                use half::slice::HalfBitsSliceExt;
                let bits: &[u16] = bytemuck::cast_slice(&map[start + 2 * a..start + 2 * b]);
                Block::F16(bits.reinterpret_cast())
            }
        }
    }

    /// Values `a..b` as `f32`: borrowed when stored so, widened otherwise.
    pub(crate) fn f32s(&self, a: usize, b: usize) -> Cow<'_, [f32]> {
        match self.values(a, b) {
            Block::F32(v) => Cow::Borrowed(v),
            block @ Block::F16(_) => {
                let mut out = vec![0f32; b - a];
                block.copy_to_f32(0, b - a, &mut out);
                Cow::Owned(out)
            }
        }
    }

    /// The same values stored as `dtype` (rounded to nearest for `f16`), in memory.
    ///
    /// # Errors
    /// The index of the first value beyond `f16`'s range (magnitude over 65504), which would
    /// become an infinity.
    pub(crate) fn to_dtype(&self, dtype: IndexDtype) -> Result<Rows, usize> {
        use half::slice::HalfFloatSliceExt;
        match (self.values(0, self.len()), dtype) {
            (Block::F32(v), IndexDtype::F32) => Ok(Rows::F32(v.to_vec())),
            (Block::F16(v), IndexDtype::F16) => Ok(Rows::F16(v.to_vec())),
            (Block::F32(v), IndexDtype::F16) => {
                let mut out = vec![f16::ZERO; v.len()];
                out.convert_from_f32_slice(v);
                match overflow(v, &out) {
                    Some(i) => Err(i),
                    None => Ok(Rows::F16(out)),
                }
            }
            (block @ Block::F16(_), IndexDtype::F32) => {
                let mut out = vec![0f32; block.len()];
                block.copy_to_f32(0, block.len(), &mut out);
                Ok(Rows::F32(out))
            }
        }
    }

    /// The first value that is not finite, if any.
    pub(crate) fn first_non_finite(&self) -> Option<usize> {
        match self.values(0, self.len()) {
            Block::F32(v) => v.iter().position(|x| !x.is_finite()),
            Block::F16(v) => v.iter().position(|x| !x.is_finite()),
        }
    }
}

/// The first finite value of `wide` whose half-precision rounding (`narrow`) is infinite.
pub(crate) fn overflow(wide: &[f32], narrow: &[f16]) -> Option<usize> {
    narrow
        .iter()
        .zip(wide)
        .position(|(h, w)| h.is_infinite() && w.is_finite())
}

impl PartialEq for Rows {
    /// Same type and the same values (compared as numbers, so `-0.0 == 0.0`).
    fn eq(&self, other: &Self) -> bool {
        match (self.values(0, self.len()), other.values(0, other.len())) {
            (Block::F32(a), Block::F32(b)) => a == b,
            (Block::F16(a), Block::F16(b)) => a == b,
            _ => false,
        }
    }
}

/// The rows of an index of dimension `dim`, for a scan.
pub(crate) struct RowsOf<'a> {
    pub(crate) rows: &'a Rows,
    pub(crate) dim: usize,
}

impl RowSource for RowsOf<'_> {
    fn rows(&self) -> usize {
        self.rows.len() / self.dim
    }

    fn chunk(&self, a: usize, b: usize) -> Block<'_> {
        self.rows.values(a * self.dim, b * self.dim)
    }
}
