//! InF-IR Parquet reader, on fixtures written here with the Parquet writer.
#![cfg(feature = "parquet")]

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, LargeStringArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use infembed_data::{
    Error, Location, Problem, ReadMode, read_jsonl_from, read_parquet, read_records,
};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

const FIELDS: [&str; 7] = [
    "query_positive",
    "instruction_positive",
    "document_positive",
    "query_negative",
    "instruction_negative",
    "hard_negative_document_1",
    "hard_negative_document_2",
];

/// Rows of text, `n` of them, field `f` of row `i` = "{f} {i}".
fn texts(n: usize) -> Vec<Vec<Option<String>>> {
    FIELDS
        .iter()
        .map(|f| (0..n).map(|i| Some(format!("{f} {i} ü"))).collect())
        .collect()
}

/// Writes a file with the given string columns (plus an extra ignored column), in batches of
/// `batch` rows so that row numbering across batches is exercised.
fn write(path: &Path, names: &[&str], columns: Vec<ArrayRef>, batch: usize) {
    let mut fields: Vec<Field> = names
        .iter()
        .zip(&columns)
        .map(|(n, c)| Field::new(*n, c.data_type().clone(), true))
        .collect();
    let rows = columns.first().map_or(0, |c| c.len());
    fields.push(Field::new("source_query_id", DataType::Int64, false));
    let schema = Arc::new(Schema::new(fields));
    let mut all = columns;
    all.push(Arc::new(Int64Array::from_iter_values(0..rows as i64)));
    let full = RecordBatch::try_new(schema.clone(), all).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_size(batch)
        .build();
    let mut writer = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
    let mut start = 0;
    while start < rows {
        let len = batch.min(rows - start);
        writer.write(&full.slice(start, len)).unwrap();
        start += len;
    }
    writer.close().unwrap();
}

fn string_columns(data: &[Vec<Option<String>>]) -> Vec<ArrayRef> {
    data.iter()
        .map(|col| Arc::new(StringArray::from(col.clone())) as ArrayRef)
        .collect()
}

#[test]
fn good_file_matches_the_same_records_read_from_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("good.parquet");
    let data = texts(7);
    write(&path, &FIELDS, string_columns(&data), 3);
    let set = read_parquet(&path, ReadMode::Strict).unwrap();
    assert_eq!(set.records.len(), 7);
    assert_eq!(set.locations[5], Location::Row(5));

    // Independent reference: the same texts written as JSONL by hand.
    let jsonl: String = (0..7)
        .map(|row| {
            let obj: serde_json::Map<String, serde_json::Value> = FIELDS
                .iter()
                .zip(&data)
                .map(|(f, column)| (f.to_string(), column[row].clone().unwrap().into()))
                .collect();
            serde_json::to_string(&obj).unwrap() + "\n"
        })
        .collect();
    let from_jsonl = read_jsonl_from(jsonl.as_bytes(), "ref", ReadMode::Strict).unwrap();
    assert_eq!(set.records, from_jsonl.records);
    // Dispatch by extension.
    assert_eq!(
        read_records(&path, ReadMode::Strict).unwrap().records,
        set.records
    );
}

#[test]
fn large_string_columns_and_document_alias_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.parquet");
    let data = texts(2);
    let names = [
        "query_positive",
        "instruction_positive",
        "document",
        "query_negative",
        "instruction_negative",
        "hard_negative_document_1",
        "hard_negative_document_2",
    ];
    let cols: Vec<ArrayRef> = data
        .iter()
        .map(|c| Arc::new(LargeStringArray::from(c.clone())) as ArrayRef)
        .collect();
    write(&path, &names, cols, 10);
    let set = read_parquet(&path, ReadMode::Strict).unwrap();
    assert_eq!(&*set.records[1].document_positive, "document_positive 1 ü");
}

#[test]
fn missing_column_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.parquet");
    let data = texts(3);
    let mut names = FIELDS.to_vec();
    let mut cols = string_columns(&data);
    names.remove(4);
    cols.remove(4);
    write(&path, &names, cols, 10);
    for mode in [ReadMode::Strict, ReadMode::Lenient] {
        match read_parquet(&path, mode).unwrap_err() {
            Error::Column {
                path: p,
                column,
                problem,
            } => {
                assert_eq!(p, path);
                assert_eq!(column, "instruction_negative");
                assert_eq!(problem, Problem::Missing);
            }
            e => panic!("{e:?}"),
        }
    }
}

#[test]
fn wrong_type_column_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wrongtype.parquet");
    let data = texts(3);
    let mut cols = string_columns(&data);
    cols[3] = Arc::new(Int64Array::from(vec![1, 2, 3]));
    write(&path, &FIELDS, cols, 10);
    match read_parquet(&path, ReadMode::Strict).unwrap_err() {
        Error::Column {
            column, problem, ..
        } => {
            assert_eq!(column, "query_negative");
            assert!(matches!(problem, Problem::WrongType { ref found, .. } if found == "Int64"));
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn null_and_empty_cells_fail_strict_and_are_skipped_lenient() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nulls.parquet");
    let mut data = texts(8);
    data[1][2] = None; // instruction_positive null at row 2
    data[6][5] = Some("   ".to_string()); // hard_negative_document_2 blank at row 5
    write(&path, &FIELDS, string_columns(&data), 3);
    match read_parquet(&path, ReadMode::Strict).unwrap_err() {
        Error::Record {
            path: p,
            at,
            field,
            problem,
        } => {
            assert_eq!(p, path);
            assert_eq!(at, Location::Row(2));
            assert_eq!(field, "instruction_positive");
            assert_eq!(problem, Problem::Null);
        }
        e => panic!("{e:?}"),
    }
    let set = read_parquet(&path, ReadMode::Lenient).unwrap();
    assert_eq!(set.records.len(), 6);
    assert_eq!(
        set.skipped_locations(),
        vec![Location::Row(2), Location::Row(5)]
    );
    assert!(matches!(
        &set.skipped[1].error,
        Error::Record { field, problem: Problem::Empty, .. } if field == "hard_negative_document_2"
    ));
    assert_eq!(&*set.records[2].query_positive, "query_positive 3 ü");
}

#[test]
fn not_a_parquet_file_is_a_parquet_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.parquet");
    std::fs::write(&path, b"this is not parquet at all").unwrap();
    assert!(matches!(
        read_parquet(&path, ReadMode::Lenient).unwrap_err(),
        Error::Parquet { .. }
    ));
    assert!(matches!(
        read_parquet(dir.path().join("absent.parquet"), ReadMode::Strict).unwrap_err(),
        Error::Io { .. }
    ));
}
