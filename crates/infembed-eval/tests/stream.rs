//! Streaming, resumable embedding (`embed_file`) checked against the in-memory path
//! (`embed_records` + `EmbeddingIndex::save`) on the tiny BERT fixture: the same file, byte for
//! byte; a run stopped half way and resumed writes the same file as an uninterrupted one and
//! embeds only the missing shards; a parts folder of another run is refused, naming the field.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use burn::tensor::Device;
use infembed_encoder::{DualEncoder, EncoderConfig};
use infembed_eval::{
    EMBED_CHUNK, EmbedFileOptions, EmbeddingIndex, Error, Side, embed_file, embed_records,
    parts_dir, read_texts, scan_texts,
};

fn tiny_bert() -> DualEncoder {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../infembed-encoder/tests/fixtures/tiny-bert");
    DualEncoder::from_dir(dir, EncoderConfig::default(), &Device::flex()).unwrap()
}

/// `n` records of varied length (so batches pad), some with a title and an instruction.
fn write_corpus(path: &Path, n: usize) {
    let words = [
        "tea", "water", "boiling", "espresso", "bicycle", "chain", "bread", "yeast", "river",
        "granite", "orbit", "violin",
    ];
    let mut text = String::new();
    for i in 0..n {
        let len = 3 + (i * 7) % 23;
        let body: Vec<&str> = (0..len)
            .map(|j| words[(i * 5 + j * 3) % words.len()])
            .collect();
        let record = serde_json::json!({
            "id": format!("d{i}"),
            "title": if i % 3 == 0 { format!("title {i}") } else { String::new() },
            "text": body.join(" "),
            "instruction": if i % 2 == 0 { "prefer short answers" } else { "" },
        });
        text.push_str(&record.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// The file `embed_records` + `save` write for the same input.
fn in_memory(encoder: &DualEncoder, input: &Path, output: &Path, side: Side) -> Vec<u8> {
    let records = read_texts(input).unwrap();
    let mut index = embed_records(encoder, &records, side).unwrap();
    index.save(output).unwrap();
    std::fs::read(output).unwrap()
}

#[test]
fn streamed_file_equals_the_in_memory_one_in_both_formats_and_sides() {
    let encoder = tiny_bert();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("corpus.jsonl");
    // Two shards of one chunk each and a partial third: the chunks of embed_records.
    let n = 2 * EMBED_CHUNK + 37;
    write_corpus(&input, n);
    let scan = scan_texts(&input).unwrap();
    assert_eq!(scan.ids.len(), n);
    for (name, side) in [("p.safetensors", Side::Passages), ("q.npy", Side::Queries)] {
        let want = in_memory(
            &encoder,
            &input,
            &dir.path().join(format!("want-{name}")),
            side,
        );
        let output = dir.path().join(name);
        let options = EmbedFileOptions::new(side).with_shard_records(EMBED_CHUNK);
        let mut calls = Vec::new();
        let summary = embed_file(&encoder, &scan, &output, &options, &mut |p| {
            calls.push(p.done)
        })
        .unwrap();
        assert_eq!(summary.records, n);
        assert_eq!(summary.shards, 3);
        assert_eq!(summary.resumed, 0);
        assert_eq!(
            calls,
            [0, EMBED_CHUNK, 2 * EMBED_CHUNK, n],
            "progress per chunk"
        );
        assert_eq!(std::fs::read(&output).unwrap(), want, "{name}: same bytes");
        assert!(!parts_dir(&output).exists(), "the parts folder is removed");
        if name.ends_with(".npy") {
            let ids = |p: &Path| std::fs::read(p.with_extension("ids.txt")).unwrap();
            assert_eq!(ids(&output), ids(&dir.path().join(format!("want-{name}"))));
        }
        let index = EmbeddingIndex::load(&output).unwrap();
        assert_eq!(index.ids, scan.ids);
    }
}

#[test]
fn a_run_stopped_half_way_resumes_and_writes_the_same_file() {
    let encoder = tiny_bert();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("corpus.jsonl");
    let n = 150;
    write_corpus(&input, n);
    let scan = scan_texts(&input).unwrap();
    // Shards of 16 records (10 shards): chunks differ from embed_records', so the reference is
    // an uninterrupted streamed run with the same shards.
    let options = EmbedFileOptions::default().with_shard_records(16);
    let reference = dir.path().join("reference.safetensors");
    embed_file(&encoder, &scan, &reference, &options, &mut |_| {}).unwrap();
    let want = std::fs::read(&reference).unwrap();

    // Stop the run (as a crash would) once 4 shards are written.
    let output = dir.path().join("e.safetensors");
    let stopped = catch_unwind(AssertUnwindSafe(|| {
        embed_file(&encoder, &scan, &output, &options, &mut |p| {
            assert!(p.done < 5 * 16, "stopped after the fourth shard");
        })
    }));
    assert!(stopped.is_err());
    assert!(!output.exists(), "no index before every shard is done");
    let parts = parts_dir(&output);
    let mut shards: Vec<String> = std::fs::read_dir(&parts)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("shard-"))
        .collect();
    shards.sort();
    assert_eq!(
        shards,
        [
            "shard-000000.f32",
            "shard-000001.f32",
            "shard-000002.f32",
            "shard-000003.f32"
        ]
    );

    // Another run's settings are refused, naming the field, and keep the shards.
    let other = EmbedFileOptions::default().with_shard_records(32);
    let err = embed_file(&encoder, &scan, &output, &other, &mut |_| {}).unwrap_err();
    assert!(matches!(&err, Error::ResumeMismatch { field, .. } if field == "shard_records"));
    assert!(err.to_string().contains("--restart"), "{err}");
    let queries = EmbedFileOptions::new(Side::Queries).with_shard_records(16);
    let err = embed_file(&encoder, &scan, &output, &queries, &mut |_| {}).unwrap_err();
    assert!(matches!(&err, Error::ResumeMismatch { field, .. } if field == "side"));
    assert!(parts.join("shard-000003.f32").exists());

    // Resumed: the four shards are taken, the other six embedded, the same bytes written.
    let mut first = None;
    let summary = embed_file(&encoder, &scan, &output, &options, &mut |p| {
        first.get_or_insert(*p);
    })
    .unwrap();
    assert_eq!(summary.resumed, 64);
    assert_eq!(first.map(|p| (p.done, p.resumed)), Some((64, 64)));
    assert_eq!(std::fs::read(&output).unwrap(), want);
    assert!(!parts.exists());

    // A changed input (same ids, another text) does not resume from the old shards.
    let output = dir.path().join("f.safetensors");
    let _ = catch_unwind(AssertUnwindSafe(|| {
        embed_file(&encoder, &scan, &output, &options, &mut |p| {
            assert!(p.done < 16);
        })
    }));
    let text = std::fs::read_to_string(&input).unwrap();
    std::fs::write(&input, text.replacen("tea", "tee", 1)).unwrap();
    let changed = scan_texts(&input).unwrap();
    let err = embed_file(&encoder, &changed, &output, &options, &mut |_| {}).unwrap_err();
    assert!(matches!(&err, Error::ResumeMismatch { field, .. } if field == "input_sha256"));
    // --restart starts over.
    let summary = embed_file(
        &encoder,
        &changed,
        &output,
        &options.clone().with_restart(true),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(summary.resumed, 0);
}

#[test]
fn an_input_edited_after_its_scan_is_named() {
    let encoder = tiny_bert();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("corpus.jsonl");
    write_corpus(&input, 20);
    let scan = scan_texts(&input).unwrap();
    write_corpus(&input, 10);
    let output = dir.path().join("e.npy");
    let err = embed_file(
        &encoder,
        &scan,
        &output,
        &EmbedFileOptions::default(),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(matches!(err, Error::InputChanged { .. }), "{err}");
    assert!(err.to_string().contains("corpus.jsonl"), "{err}");
    assert!(!output.exists());
}

#[test]
fn scan_errors_name_the_line_as_read_texts_does() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.jsonl");
    std::fs::write(
        &input,
        "{\"id\": \"a\", \"text\": \"x\"}\n{\"id\": \"b\"}\n{\"id\": \"a\", \"text\": \"y\"}\n",
    )
    .unwrap();
    let scan = scan_texts(&input).unwrap_err().to_string();
    let read = read_texts(&input).unwrap_err().to_string();
    assert_eq!(scan, read);
    assert!(scan.contains("bad.jsonl:2: text"), "{scan}");
    std::fs::write(
        &input,
        "{\"id\": \"a\", \"text\": \"x\"}\n{\"id\": \"a\", \"text\": \"y\"}\n",
    )
    .unwrap();
    let scan = scan_texts(&input).unwrap_err();
    assert!(matches!(
        scan,
        Error::DuplicateId {
            line: 2,
            first_line: 1,
            ..
        }
    ));
}
