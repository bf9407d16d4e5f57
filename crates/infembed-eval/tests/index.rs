//! `EmbeddingIndex` files checked by independent readers written here (the safetensors and NumPy
//! layouts parsed by hand from their specifications), top-k against a naive full sort, and the
//! typed errors of the JSONL text reader.

use std::path::Path;

use infembed_eval::ids_path;
use infembed_eval::{EmbeddingIndex, Error, IndexDtype, IndexWriter, read_texts};
use proptest::prelude::*;

fn sample_index() -> EmbeddingIndex {
    let ids = vec!["a".to_string(), "7".into(), "doc é".into()];
    let dim = 4;
    let embeddings: Vec<f32> = (0..ids.len() * dim)
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    EmbeddingIndex::new(ids, embeddings, dim, "models/some-model").unwrap()
}

/// A NumPy 1.0 file's bytes up to its data, written here from the format's description: magic,
/// version, header length, then `dict` padded with spaces to end in a newline at a multiple of 64.
fn npy_header(dict: &str) -> Vec<u8> {
    let mut header = dict.to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes
}

fn le_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Parses a safetensors file from the published layout: u64 LE header size, JSON header, data.
fn read_safetensors_by_hand(path: &Path) -> (serde_json::Value, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, bytes[8 + n..].to_vec())
}

#[test]
fn safetensors_file_has_the_documented_layout_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index.safetensors");
    let mut index = sample_index();
    index.save(&path).unwrap();

    let (header, data) = read_safetensors_by_hand(&path);
    let t = &header["embeddings"];
    assert_eq!(t["dtype"], "F32");
    assert_eq!(t["shape"], serde_json::json!([3, 4]));
    let [start, end] = [0, 1].map(|i| t["data_offsets"][i].as_u64().unwrap() as usize);
    assert_eq!(le_f32s(&data[start..end]), *index.embeddings());
    let meta = &header["__metadata__"];
    assert_eq!(meta["format"], "infembed-index/2");
    assert_eq!(meta["model"], "models/some-model");
    // The ids: byte offsets (u64, N + 1 of them) into the ids' UTF-8 bytes, end to end.
    let span = |name: &str| {
        let t = &header[name];
        [0, 1].map(|i| t["data_offsets"][i].as_u64().unwrap() as usize)
    };
    assert_eq!(header["id_offsets"]["dtype"], "U64");
    assert_eq!(header["id_offsets"]["shape"], serde_json::json!([4]));
    assert_eq!(header["id_bytes"]["dtype"], "U8");
    let [a, b] = span("id_offsets");
    let offsets: Vec<usize> = data[a..b]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
        .collect();
    let [c, d] = span("id_bytes");
    let bytes = &data[c..d];
    let ids: Vec<&str> = offsets
        .windows(2)
        .map(|w| std::str::from_utf8(&bytes[w[0]..w[1]]).unwrap())
        .collect();
    assert_eq!(ids, index.ids);
    assert_eq!(d, data.len(), "the ids' bytes end the file");
    assert_eq!(
        (8 + header.to_string().len()) % 8,
        0,
        "the header is padded to 8 bytes"
    );

    let loaded = EmbeddingIndex::load(&path).unwrap();
    assert_eq!(loaded.ids, index.ids);
    assert_eq!(loaded.embeddings(), index.embeddings());
    assert_eq!(loaded.dim, 4);
    assert_eq!(loaded.model, "models/some-model");
    assert_eq!(loaded.source.as_deref(), Some(path.as_path()));
    assert!(
        !dir.path().join("index.safetensors.tmp").exists(),
        "temp file left"
    );
}

#[test]
fn safetensors_files_of_the_first_layout_still_load() {
    // `infembed-index/1`, written here by hand: the ids as a JSON array in the metadata.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.safetensors");
    let values: Vec<f32> = (0..6).map(|i| i as f32 / 7.0).collect();
    let header = serde_json::json!({
        "__metadata__": {
            "format": "infembed-index/1",
            "ids": "[\"x\",\"y\"]",
            "model": "m",
        },
        "embeddings": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    })
    .to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(&path, &bytes).unwrap();
    let index = EmbeddingIndex::load(&path).unwrap();
    assert_eq!(index.ids, ["x", "y"]);
    assert_eq!(index.embeddings(), values);
    assert_eq!(index.model, "m");

    // Tensors that do not tile the data are refused, naming the tensor.
    let header = header.replace("[0,24]", "[0,20]");
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(&path, &bytes).unwrap();
    let err = EmbeddingIndex::load(&path).unwrap_err().to_string();
    assert!(
        err.contains("v1.safetensors") && err.contains("`embeddings`"),
        "{err}"
    );
}

#[test]
fn npy_file_has_the_documented_layout_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.npy");
    let mut index = sample_index();
    index.save(&path).unwrap();

    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    assert_eq!(&bytes[6..8], &[1, 0], "format version 1.0");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!((10 + hlen) % 64, 0, "header aligned to 64 bytes");
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(header.ends_with('\n'));
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    assert!(header.contains("'shape': (3, 4)"), "{header}");
    assert_eq!(le_f32s(&bytes[10 + hlen..]), *index.embeddings());

    let ids_file = dir.path().join("out.ids.txt");
    assert_eq!(ids_path(&path), ids_file);
    assert_eq!(std::fs::read_to_string(&ids_file).unwrap(), "a\n7\ndoc é\n");

    let loaded = EmbeddingIndex::load(&path).unwrap();
    assert_eq!(loaded.ids, index.ids);
    assert_eq!(loaded.embeddings(), index.embeddings());
    assert_eq!(loaded.model, "", ".npy keeps no model name");
}

#[test]
fn unknown_extensions_and_broken_files_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = sample_index();
    for name in ["out.txt", "out", "out.safetensor"] {
        let path = dir.path().join(name);
        let err = index.save(&path).unwrap_err();
        assert!(
            matches!(&err, Error::UnknownIndexFormat { path: p } if *p == path),
            "{err}"
        );
        assert!(err.to_string().contains(".safetensors or .npy"), "{err}");
        assert!(matches!(
            EmbeddingIndex::load(&path).unwrap_err(),
            Error::UnknownIndexFormat { .. }
        ));
    }

    let missing = dir.path().join("nothing.safetensors");
    let err = EmbeddingIndex::load(&missing).unwrap_err();
    assert!(
        matches!(&err, Error::Read { path, .. } if *path == missing),
        "{err}"
    );

    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"not a safetensors file at all").unwrap();
    let err = EmbeddingIndex::load(&garbage).unwrap_err();
    assert!(matches!(err, Error::IndexFormat { .. }), "{err}");
    assert!(err.to_string().contains("garbage.safetensors"), "{err}");

    // A .npy without its ids side file names the side file.
    let npy = dir.path().join("lonely.npy");
    index.save(&npy).unwrap();
    std::fs::remove_file(ids_path(&npy)).unwrap();
    let err = EmbeddingIndex::load(&npy).unwrap_err();
    assert!(
        matches!(&err, Error::Read { path, .. } if *path == ids_path(&npy)),
        "{err}"
    );

    // Too few ids for the rows.
    index.save(&npy).unwrap();
    std::fs::write(ids_path(&npy), "a\n7\n").unwrap();
    let err = EmbeddingIndex::load(&npy).unwrap_err();
    assert!(matches!(err, Error::IndexFormat { .. }), "{err}");

    // float64 data is refused, not misread.
    let f64_npy = dir.path().join("f64.npy");
    let mut bytes = npy_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), }");
    bytes.extend([0u8; 16]);
    std::fs::write(&f64_npy, bytes).unwrap();
    std::fs::write(ids_path(&f64_npy), "x\n").unwrap();
    let err = EmbeddingIndex::load(&f64_npy).unwrap_err();
    assert!(err.to_string().contains("'<f4' or '<f2'"), "{err}");
}

#[test]
fn bad_shapes_duplicate_ids_and_line_breaks_are_refused() {
    let err = EmbeddingIndex::new(vec!["a".into()], vec![1.0; 3], 2, "").unwrap_err();
    assert!(matches!(err, Error::IndexShape { .. }), "{err}");
    let err = EmbeddingIndex::new(vec!["a".into(), "a".into()], vec![1.0; 4], 2, "").unwrap_err();
    assert!(err.to_string().contains("`a`"), "{err}");
    let err = EmbeddingIndex::new(vec!["a".into()], vec![f32::NAN, 0.0], 2, "").unwrap_err();
    assert!(err.to_string().contains("non-finite"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let mut index = EmbeddingIndex::new(vec!["a\nb".into()], vec![1.0, 0.0], 2, "").unwrap();
    let err = index.save(dir.path().join("x.npy")).unwrap_err();
    assert!(err.to_string().contains("line break"), "{err}");
    // safetensors keeps such ids.
    index.save(dir.path().join("x.safetensors")).unwrap();
    let loaded = EmbeddingIndex::load(dir.path().join("x.safetensors")).unwrap();
    assert_eq!(loaded.ids, vec!["a\nb".to_string()]);
}

#[test]
fn dimension_mismatch_names_the_index_both_dimensions_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx.safetensors");
    sample_index().save(&path).unwrap();
    let index = EmbeddingIndex::load(&path).unwrap();
    let err = index.top_k(&[0.0; 5], 3).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::DimensionMismatch { index, index_dim: 4, model_dim: 5, .. } if *index == path
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("idx.safetensors") && msg.contains("re-embed"),
        "{msg}"
    );
}

/// The defined score: the fused multiply-add chain over the dimensions in order.
fn chain(row: &[f32], q: &[f32]) -> f32 {
    row.iter().zip(q).fold(0.0, |s, (a, b)| a.mul_add(*b, s))
}

/// The naive reference: every document's score (the chain), the whole list sorted by score
/// descending then id descending, the first k kept.
fn naive_top_k(ids: &[String], rows: &[Vec<f32>], q: &[f32], k: usize) -> Vec<(String, f32)> {
    let mut all: Vec<(String, f32)> = ids
        .iter()
        .zip(rows)
        .map(|(id, row)| (id.clone(), chain(row, q)))
        .collect();
    all.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then_with(|| b.0.cmp(&a.0)));
    all.truncate(k);
    all
}

proptest! {
    /// Values from {-1, -0.5, 0, 0.5, 1} make many exact ties, so the tie rule is exercised.
    #[test]
    fn top_k_equals_a_naive_full_sort(
        rows in prop::collection::vec(prop::collection::vec(-2i8..=2, 3), 1..30),
        q in prop::collection::vec(-2i8..=2, 3),
        k in 0usize..35,
        id_seed in 0u64..1000,
    ) {
        let rows: Vec<Vec<f32>> = rows
            .iter()
            .map(|r| r.iter().map(|&v| f32::from(v) / 2.0).collect())
            .collect();
        let q: Vec<f32> = q.iter().map(|&v| f32::from(v) / 2.0).collect();
        // Distinct ids whose order differs from the row order.
        let ids: Vec<String> = (0..rows.len())
            .map(|i| format!("d{}", (i as u64 * 7919 + id_seed) % 100_003))
            .collect();
        let index = EmbeddingIndex::new(ids.clone(), rows.concat(), 3, "").unwrap();
        let hits = index.top_k(&q, k).unwrap();
        let want = naive_top_k(&ids, &rows, &q, k);
        prop_assert_eq!(hits.len(), want.len());
        for (i, (hit, (id, score))) in hits.iter().zip(&want).enumerate() {
            prop_assert_eq!(hit.rank, i + 1);
            prop_assert_eq!(&hit.id, id);
            prop_assert_eq!(hit.score, *score);
            prop_assert_eq!(&ids[hit.row], id);
        }
    }
}

/// Pseudo-random values in [-1, 1) (xorshift), unit rows when `unit`.
fn random_rows(n: usize, dim: usize, seed: u64, unit: bool) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out: Vec<f32> = (0..n * dim)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    if unit {
        for row in out.chunks_exact_mut(dim) {
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            row.iter_mut().for_each(|v| *v /= norm);
        }
    }
    out
}

/// IEEE half precision by hand (round to nearest even), for values of magnitude in [2^-14, 2)
/// or 0: the reference for the f16 files.
fn f16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let abs = bits & 0x7fff_ffff;
    if abs == 0 {
        return sign;
    }
    let exp = ((abs >> 23) as i32) - 127 + 15;
    assert!(
        (1..31).contains(&exp),
        "{v} is outside the normal f16 range used here"
    );
    let mant = abs & 0x7f_ffff;
    let mut half = ((exp as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && half & 1 == 1) {
        half += 1;
    }
    sign | half as u16
}

fn f16_value(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let mant = f32::from(h & 0x3ff);
    if exp == 0 {
        return sign * mant * 2f32.powi(-24);
    }
    sign * (1.0 + mant / 1024.0) * 2f32.powi(exp - 15)
}

#[test]
fn f16_files_hold_half_precision_values_and_load_mapped_or_read() {
    let dir = tempfile::tempdir().unwrap();
    let (n, dim) = (37, 24);
    // Values rounded away from the f16 subnormal range, so the by-hand rounding applies.
    let values: Vec<f32> = random_rows(n, dim, 5, false)
        .into_iter()
        .map(|v| if v.abs() < 1e-3 { 0.25 } else { v })
        .collect();
    let ids: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
    let index = EmbeddingIndex::new(ids.clone(), values.clone(), dim, "m").unwrap();
    let mut half = index.to_dtype(IndexDtype::F16).unwrap();
    assert_eq!(half.dtype(), IndexDtype::F16);
    let want_bits: Vec<u16> = values.iter().map(|&v| f16_bits(v)).collect();
    let want: Vec<f32> = want_bits.iter().map(|&h| f16_value(h)).collect();
    assert_eq!(*half.embeddings(), want);

    let st = dir.path().join("h.safetensors");
    half.save(&st).unwrap();
    let (header, data) = read_safetensors_by_hand(&st);
    assert_eq!(header["embeddings"]["dtype"], "F16");
    let [a, b] = [0, 1].map(|i| header["embeddings"]["data_offsets"][i].as_u64().unwrap() as usize);
    let bits: Vec<u16> = data[a..b]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(bits, want_bits);

    let npy = dir.path().join("h.npy");
    half.save(&npy).unwrap();
    let bytes = std::fs::read(&npy).unwrap();
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let text = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(text.contains("'descr': '<f2'"), "{text}");
    assert_eq!(bytes.len() - 10 - hlen, n * dim * 2);

    for path in [&st, &npy] {
        let loaded = EmbeddingIndex::load(path).unwrap();
        let mapped = EmbeddingIndex::open(path).unwrap();
        assert!(
            !loaded.is_mapped() && mapped.is_mapped(),
            "{}",
            path.display()
        );
        for ix in [&loaded, &mapped] {
            assert_eq!(ix.dtype(), IndexDtype::F16);
            assert_eq!(ix.ids, ids);
            assert_eq!(*ix.embeddings(), want, "{}", path.display());
            assert_eq!(*ix.row(5), want[5 * dim..6 * dim]);
        }
    }
    // f32 files open mapped too, with the same values.
    let mut full = index.clone();
    full.save(dir.path().join("f.safetensors")).unwrap();
    let mapped = EmbeddingIndex::open(dir.path().join("f.safetensors")).unwrap();
    assert!(mapped.is_mapped());
    assert_eq!(*mapped.embeddings(), values);
    // Saving a mapped f16 index writes the same bytes again.
    let mut again = EmbeddingIndex::open(&st).unwrap();
    again.save(dir.path().join("again.safetensors")).unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("again.safetensors")).unwrap(),
        std::fs::read(&st).unwrap()
    );
}

#[test]
fn an_npy_shape_too_large_to_hold_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.npy");
    let bytes =
        npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 2), }");
    std::fs::write(&path, bytes).unwrap();
    std::fs::write(ids_path(&path), "x\n").unwrap();
    for result in [EmbeddingIndex::load(&path), EmbeddingIndex::open(&path)] {
        let err = result.unwrap_err();
        assert!(
            matches!(err, Error::IndexFormat { .. }) && err.to_string().contains("huge.npy"),
            "{err}"
        );
    }
}

#[test]
fn values_beyond_the_f16_range_are_refused_not_stored_as_infinities() {
    let index = EmbeddingIndex::new(
        vec!["a".into(), "b".into()],
        vec![1.0, 0.5, 65504.0, -7.0e4],
        2,
        "",
    )
    .unwrap();
    let err = index.to_dtype(IndexDtype::F16).unwrap_err().to_string();
    assert!(
        err.contains("row 1 (id `b`)") && err.contains("65504"),
        "{err}"
    );
    // 65504 itself is f16's largest value and fits.
    let fits = EmbeddingIndex::new(vec!["a".into()], vec![65504.0, -1.0], 2, "").unwrap();
    assert_eq!(
        *fits.to_dtype(IndexDtype::F16).unwrap().embeddings(),
        [65504.0, -1.0]
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let ids = vec!["a".to_string(), "b".to_string(), "c".to_string()];
    let mut writer = IndexWriter::create(&path, &ids, 2, "", IndexDtype::F16).unwrap();
    writer.write_rows(&[1.0, 0.0, 0.0, 1.0]).unwrap();
    let err = writer.write_rows(&[1.0e5, 0.0]).unwrap_err().to_string();
    assert!(err.contains("row 2") && err.contains("f16"), "{err}");
    drop(writer);
    assert!(!path.exists(), "a failed writer leaves no file");
}

#[test]
fn a_batch_search_equals_each_query_alone_and_the_naive_ranking() {
    let dir = tempfile::tempdir().unwrap();
    let (n, dim, m, k) = (3000, 40, 29, 25);
    let values = random_rows(n, dim, 7, true);
    // Duplicate rows make exact score ties that only the ids can order.
    let mut values = values;
    let copy = values[11 * dim..12 * dim].to_vec();
    values[2900 * dim..2901 * dim].copy_from_slice(&copy);
    let ids: Vec<String> = (0..n)
        .map(|i| format!("d{}", (i * 7919) % 10_007))
        .collect();
    let mut index = EmbeddingIndex::new(ids.clone(), values.clone(), dim, "").unwrap();
    let mut queries = random_rows(m, dim, 8, true);
    queries[..dim].copy_from_slice(&copy);
    let rows: Vec<Vec<f32>> = values.chunks_exact(dim).map(<[f32]>::to_vec).collect();

    let path = dir.path().join("x.safetensors");
    index.save(&path).unwrap();
    for ix in [index.clone(), EmbeddingIndex::open(&path).unwrap()] {
        let batch = ix.search_batch(&queries, k).unwrap();
        assert_eq!(batch.len(), m);
        for (i, q) in queries.chunks_exact(dim).enumerate() {
            assert_eq!(ix.top_k(q, k).unwrap(), batch[i], "query {i} alone");
            let want = naive_top_k(&ids, &rows, q, k);
            let got: Vec<(String, f32)> =
                batch[i].iter().map(|h| (h.id.clone(), h.score)).collect();
            assert_eq!(got, want, "query {i}");
            let scores = ix.scores(q).unwrap();
            assert!(batch[i].iter().all(|h| scores[h.row] == h.score));
        }
    }
    // The duplicated row's twin ranks by id.
    let first = &index.search_batch(&queries[..dim], 2).unwrap()[0];
    assert_eq!(first[0].score, first[1].score);
    assert!(first[0].id > first[1].id, "{first:?}");

    // f16 storage searches the widened values.
    let half = index.to_dtype(IndexDtype::F16).unwrap();
    let wide = half.embeddings().into_owned();
    let wide_rows: Vec<Vec<f32>> = wide.chunks_exact(dim).map(<[f32]>::to_vec).collect();
    let batch = half.search_batch(&queries, k).unwrap();
    for (i, q) in queries.chunks_exact(dim).enumerate() {
        let got: Vec<(String, f32)> = batch[i].iter().map(|h| (h.id.clone(), h.score)).collect();
        assert_eq!(got, naive_top_k(&ids, &wide_rows, q, k), "f16 query {i}");
    }
}

#[test]
fn a_mapped_index_reports_a_non_finite_row_when_searched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.npy");
    let mut index = EmbeddingIndex::new(
        vec!["a".into(), "b".into(), "c".into()],
        vec![1.0, 0.0, 0.0, 1.0, 0.5, 0.5],
        2,
        "",
    )
    .unwrap();
    index.save(&path).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() - 4;
    bytes[at..].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    // Reading scans the values; mapping leaves them to the search, which names file and row.
    let err = EmbeddingIndex::load(&path).unwrap_err();
    assert!(
        err.to_string().contains("non-finite value in row 2"),
        "{err}"
    );
    let mapped = EmbeddingIndex::open(&path).unwrap();
    let err = mapped.top_k(&[1.0, 0.0], 1).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, Error::IndexFormat { .. })
            && msg.contains("bad.npy")
            && msg.contains("row 2 (id `c`)"),
        "{msg}"
    );
    // Queries that are not whole rows, or not finite, are refused.
    let err = index.search_batch(&[1.0, 0.0, 1.0], 1).unwrap_err();
    assert!(err.to_string().contains("not whole rows"), "{err}");
    let err = index.search_batch(&[1.0, f32::INFINITY], 1).unwrap_err();
    assert!(err.to_string().contains("non-finite"), "{err}");
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn texts_are_read_with_ids_titles_and_instructions() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "c.jsonl",
        concat!(
            r#"{"_id": "x1", "title": "T", "text": "body"}"#,
            "\n\n",
            r#"{"id": 42, "text": "plain", "title": null, "extra": [1]}"#,
            "\n",
            r#"{"_id": "q", "id": "q", "text": "find", "instruction": "only recent"}"#,
            "\n",
        ),
    );
    let texts = read_texts(&path).unwrap();
    let ids: Vec<&str> = texts.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["x1", "42", "q"]);
    assert_eq!(texts[0].passage_text(), "T body");
    assert_eq!(texts[1].passage_text(), "plain");
    assert_eq!(texts[2].instruction.as_deref(), Some("only recent"));
}

#[test]
fn text_reader_errors_name_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let ok = r#"{"id": "a", "text": "x"}"#;
    let cases = [
        (format!("{ok}\nnot json\n"), 2, "<line>"),
        (format!("{ok}\n[1, 2]\n"), 2, "<line>"),
        (format!("{ok}\n{{\"id\": \"b\"}}\n"), 2, "text"),
        (format!("{ok}\n{{\"id\": \"b\", \"text\": 3}}\n"), 2, "text"),
        ("{\"text\": \"x\"}\n".to_string(), 1, "id"),
        ("{\"id\": 1.5, \"text\": \"x\"}\n".to_string(), 1, "id"),
        ("{\"_id\": \" \", \"text\": \"x\"}\n".to_string(), 1, "_id"),
        (
            "{\"_id\": \"a\", \"id\": \"b\", \"text\": \"x\"}\n".to_string(),
            1,
            "id",
        ),
        (
            "{\"id\": \"a\", \"text\": \"x\", \"title\": 5}\n".to_string(),
            1,
            "title",
        ),
    ];
    for (i, (content, line, field)) in cases.iter().enumerate() {
        let path = write(dir.path(), &format!("bad{i}.jsonl"), content);
        let err = read_texts(&path).unwrap_err();
        match &err {
            Error::InputField {
                path: p,
                line: l,
                field: f,
                ..
            } => {
                assert_eq!((p, l, f.as_str()), (&path, line, *field), "{err}");
            }
            other => panic!("case {i}: unexpected {other}"),
        }
        assert!(err.to_string().contains(&format!("bad{i}.jsonl:{line}")));
    }

    let dup = write(dir.path(), "dup.jsonl", &format!("{ok}\n{ok}\n"));
    let err = read_texts(&dup).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DuplicateId {
                line: 2,
                first_line: 1,
                ..
            }
        ),
        "{err}"
    );

    let empty = write(dir.path(), "empty.jsonl", "\n  \n");
    let err = read_texts(&empty).unwrap_err();
    assert!(
        matches!(&err, Error::EmptyInput { path } if *path == empty),
        "{err}"
    );

    let missing = dir.path().join("missing.jsonl");
    let err = read_texts(&missing).unwrap_err();
    assert!(
        matches!(&err, Error::Read { path, .. } if *path == missing),
        "{err}"
    );
    let err = read_texts(dir.path()).unwrap_err();
    assert!(err.to_string().contains("directory"), "{err}");

    // A bad UTF-8 byte names its line; a byte-order mark before the first line is dropped.
    let bad_utf8 = dir.path().join("utf8.jsonl");
    std::fs::write(
        &bad_utf8,
        b"{\"id\": \"a\", \"text\": \"x\"}\n{\"id\": \"b\xff\"}\n",
    )
    .unwrap();
    let err = read_texts(&bad_utf8).unwrap_err();
    assert!(
        matches!(&err, Error::InputField { line: 2, field, .. } if field == "<line>"),
        "{err}"
    );
    let bom = write(
        dir.path(),
        "bom.jsonl",
        "\u{feff}{\"id\": \"a\", \"text\": \"x\"}\n",
    );
    let read = read_texts(&bom).unwrap();
    assert_eq!((read.len(), read[0].id.as_str()), (1, "a"));
}
