//! `infembed embed` and `infembed search` run as a user runs them: each user mistake is one line on
//! stderr naming the path and the fix, with a non-zero exit; with all-MiniLM-L6-v2 the written
//! files hold exactly the rows `DualEncoder::encode_passages` computes here, and search returns
//! the dot products recomputed here.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use infembed::encoder::{DualEncoder, EncoderConfig, tensor_rows};
use infembed::{Device, EmbeddingIndex};

const CORPUS: &str = concat!(
    r#"{"id": "tea", "title": "Green tea", "text": "Green tea is steeped below boiling, around 80 degrees Celsius."}"#,
    "\n",
    r#"{"id": "espresso", "text": "Espresso forces hot water through finely ground coffee at nine bars of pressure."}"#,
    "\n",
    r#"{"_id": 3, "text": "A bicycle chain should be cleaned and oiled every few hundred kilometres."}"#,
    "\n",
    r#"{"id": "bread", "text": "Sourdough rises with wild yeast and lactic acid bacteria."}"#,
    "\n",
);

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infembed"))
}

/// all-MiniLM-L6-v2; when absent, a recorded skip (a failure under `CI=true`).
fn model_dir(test: &str) -> Option<PathBuf> {
    infembed_testkit::minilm_dir(test)
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("the infembed binary starts")
}

/// The run succeeded; otherwise fails with its stderr.
fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The run failed with one stderr line that contains every one of `needles`, and no panic.
fn assert_user_error(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected: {stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "`{n}` not in: {stderr}");
    }
}

/// The passages of [`CORPUS`] as `embed` reads them ("{title} {text}").
const CORPUS_PASSAGES: [&str; 4] = [
    "Green tea Green tea is steeped below boiling, around 80 degrees Celsius.",
    "Espresso forces hot water through finely ground coffee at nine bars of pressure.",
    "A bicycle chain should be cleaned and oiled every few hundred kilometres.",
    "Sourdough rises with wild yeast and lactic acid bacteria.",
];

fn write_corpus(dir: &Path) -> PathBuf {
    let path = dir.join("corpus.jsonl");
    std::fs::write(&path, CORPUS).unwrap();
    path
}

#[test]
fn missing_model_dir_is_one_line_naming_it_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(dir.path());
    let model = dir.path().join("no-such-model");
    let out = run(bin()
        .args(["embed", "--model"])
        .arg(&model)
        .arg("--input")
        .arg(&corpus)
        .arg("--output")
        .arg(dir.path().join("e.safetensors")));
    assert_user_error(&out, &["no-such-model", "fetch-model"]);
    let out = run(bin()
        .args(["search", "--model"])
        .arg(&model)
        .arg("--corpus")
        .arg(&corpus)
        .args(["--query", "tea"]));
    assert_user_error(&out, &["no-such-model", "fetch-model"]);
}

#[test]
fn unreadable_and_empty_inputs_and_bad_outputs_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model-not-needed");
    let embed = |input: &Path, output: &str| {
        run(bin()
            .args(["embed", "--model"])
            .arg(&model)
            .arg("--input")
            .arg(input)
            .arg("--output")
            .arg(dir.path().join(output)))
    };
    // These are all detected before the model is loaded.
    let missing = dir.path().join("missing.jsonl");
    assert_user_error(&embed(&missing, "o.npy"), &["missing.jsonl", "cannot read"]);

    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    assert_user_error(&embed(&empty, "o.npy"), &["empty.jsonl", "no records"]);

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"id\": \"a\", \"text\": \"x\"}\n{\"id\": \"b\"}\n").unwrap();
    assert_user_error(&embed(&bad, "o.npy"), &["bad.jsonl:2", "text", "missing"]);

    let corpus = write_corpus(dir.path());
    assert_user_error(&embed(&corpus, "o.csv"), &["o.csv", ".safetensors or .npy"]);

    let out = run(bin()
        .args(["search", "--model"])
        .arg(&model)
        .arg("--index")
        .arg(dir.path().join("absent.safetensors"))
        .args(["--query", "tea"]));
    assert_user_error(&out, &["absent.safetensors", "cannot read"]);
}

#[test]
fn index_of_another_dimension_is_refused_with_the_fix() {
    let Some(model) = model_dir("index_of_another_dimension_is_refused_with_the_fix") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d7.safetensors");
    let mut index =
        EmbeddingIndex::new(vec!["x".into(), "y".into()], vec![0.5; 14], 7, "other").unwrap();
    index.save(&path).unwrap();
    let out = run(bin()
        .args(["search", "--model"])
        .arg(&model)
        .arg("--index")
        .arg(&path)
        .args(["--query", "tea"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let error_lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(error_lines.len(), 1, "{stderr}");
    for needle in [
        "d7.safetensors",
        "7-dimensional",
        "384-dimensional",
        "re-embed",
    ] {
        assert!(
            error_lines[0].contains(needle),
            "`{needle}` not in {stderr}"
        );
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn embed_and_search_round_trip_with_minilm() {
    let Some(model) = model_dir("embed_and_search_round_trip_with_minilm") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(dir.path());

    // The reference rows, computed here with the encoder directly.
    let encoder = DualEncoder::from_dir(&model, EncoderConfig::default(), &Device::flex())
        .expect("model loads");
    let passages = CORPUS_PASSAGES;
    let want = tensor_rows(encoder.encode_passages(&passages).unwrap().embeddings).unwrap();
    let want_ids = ["tea", "espresso", "3", "bread"];

    for name in ["e.safetensors", "e.npy"] {
        let output = dir.path().join(name);
        let out = run(bin()
            .args(["embed", "--model"])
            .arg(&model)
            .arg("--input")
            .arg(&corpus)
            .arg("--output")
            .arg(&output));
        assert_success(&out);
        let index = EmbeddingIndex::load(&output).unwrap();
        assert_eq!(index.ids, want_ids);
        assert_eq!(index.dim, 384);
        for (i, row) in want.iter().enumerate() {
            let d = max_abs_diff(&index.row(i), row);
            assert!(d < 1e-5, "{name} row {i} differs by {d}");
        }
    }

    // Search the saved index and the corpus directly; the query is a corpus text verbatim.
    let query = passages[2];
    let q = tensor_rows(encoder.encode_queries(&[("", query)]).unwrap().embeddings).unwrap();
    let dots: Vec<f64> = want
        .iter()
        .map(|row| row.iter().zip(&q[0]).map(|(a, b)| f64::from(a * b)).sum())
        .collect();
    for source in [
        [
            "--index",
            dir.path().join("e.safetensors").to_str().unwrap(),
        ],
        ["--corpus", corpus.to_str().unwrap()],
    ] {
        let out = run(bin()
            .args(["search", "--model"])
            .arg(&model)
            .args(source)
            .args(["--query", query, "-k", "4", "--json"]));
        assert_success(&out);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let hits = v["hits"].as_array().unwrap();
        assert_eq!(hits.len(), 4);
        assert_eq!(hits[0]["id"], "3", "a corpus text finds itself first");
        let mut last = f64::INFINITY;
        for (r, hit) in hits.iter().enumerate() {
            assert_eq!(hit["rank"], r + 1);
            let id = hit["id"].as_str().unwrap();
            let row = want_ids.iter().position(|w| *w == id).unwrap();
            let score = hit["score"].as_f64().unwrap();
            assert!(
                (score - dots[row]).abs() < 1e-5,
                "{id}: {score} vs {}",
                dots[row]
            );
            assert!(score <= last, "scores descend");
            last = score;
        }
        if source[0] == "--corpus" {
            assert_eq!(hits[0]["text"], query);
        }
    }

    // The table output: rank, score, id and the first 100 characters of the text.
    let out = run(bin()
        .args(["search", "--model"])
        .arg(&model)
        .arg("--corpus")
        .arg(&corpus)
        .args([
            "--query",
            "how hot should the water be for tea",
            "--instruction",
            "I drink tea, not coffee",
            "-k",
            "2",
        ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    let first = stdout.lines().next().unwrap();
    assert!(
        first.trim_start().starts_with("1 ") && first.contains("tea") && first.contains("Green"),
        "{stdout}"
    );
    assert_eq!(stdout.lines().count(), 2);
}

/// `embed --quantize int8` (and `bf16`) writes the reduced-precision encoder's embeddings:
/// each within cosine 0.99 of the f32 ones, not equal to them, and equal to what the library
/// gives with `DualEncoder::set_quantization`; on a processor without AVX512-BF16, `bf16` is a
/// one-line error naming the feature; an unknown mode is a one-line error naming it.
#[test]
fn embed_quantize_int8_with_minilm() {
    let Some(model) = model_dir("embed_quantize_int8_with_minilm") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(dir.path());
    let embed_capped = |quantize: &str, name: &str, cap: Option<&str>| {
        let output = dir.path().join(name);
        let mut cmd = bin();
        if let Some(cap) = cap {
            cmd.env("INFEMBED_MAX_ISA", cap);
        }
        let out = run(cmd
            .args(["embed", "--quiet", "--quantize", quantize, "--model"])
            .arg(&model)
            .arg("--input")
            .arg(&corpus)
            .arg("--output")
            .arg(&output));
        (out, output)
    };
    let embed = |quantize: &str, name: &str| embed_capped(quantize, name, None);
    let (out, f32_path) = embed("none", "f32.npy");
    assert_success(&out);
    let f = EmbeddingIndex::load(&f32_path).unwrap();
    let bf16_here = infembed_testkit::cpu_has_avx512_bf16();
    for (mode, quant) in [
        ("int8", infembed::Quantization::Int8),
        ("bf16", infembed::Quantization::Bf16),
    ] {
        let (out, path) = embed(mode, &format!("{mode}.npy"));
        if mode == "bf16" && !bf16_here {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && !stderr.contains("panicked"),
                "{stderr}"
            );
            assert!(stderr.contains("AVX512-BF16"), "{stderr}");
            eprintln!("no AVX512-BF16 here: `--quantize bf16` refused as it should be");
            continue;
        }
        assert_success(&out);
        let q = EmbeddingIndex::load(&path).unwrap();
        assert_eq!(f.ids, q.ids);
        let mut encoder = DualEncoder::from_dir(&model, EncoderConfig::default(), &Device::flex())
            .expect("model loads");
        encoder.set_quantization(quant).expect("on the CPU");
        let passages = CORPUS_PASSAGES;
        let lib = tensor_rows(encoder.encode_passages(&passages).unwrap().embeddings).unwrap();
        assert_eq!(lib.len(), f.ids.len());
        for (i, lib_row) in lib.iter().enumerate() {
            let (a, b) = (f.row(i), q.row(i));
            let cos: f32 = a.iter().zip(b.iter()).map(|(x, y)| x * y).sum::<f32>()
                / (a.iter().map(|x| x * x).sum::<f32>().sqrt()
                    * b.iter().map(|x| x * x).sum::<f32>().sqrt());
            assert!(cos >= 0.99, "{mode} row {i}: cosine {cos}");
            assert!(max_abs_diff(&a, &b) > 0.0, "row {i}: the {mode} path ran");
            let d = max_abs_diff(&b, lib_row);
            assert!(
                d < 1e-6,
                "row {i}: CLI {mode} vs library {mode} differ by {d}"
            );
        }
    }
    // As on an AVX2-only processor (`INFEMBED_MAX_ISA=avx2`, an AMD Zen 3): int8 runs the AVX2
    // kernel and gives the same embeddings, bit for bit (every path computes the same integer
    // sums), and bf16 is refused, naming the feature.
    let (out, int8_avx2) = embed_capped("int8", "int8-avx2.npy", Some("avx2"));
    assert_success(&out);
    let (a, b) = (
        EmbeddingIndex::load(dir.path().join("int8.npy")).unwrap(),
        EmbeddingIndex::load(&int8_avx2).unwrap(),
    );
    for i in 0..a.ids.len() {
        assert_eq!(a.row(i), b.row(i), "row {i}: int8 on AVX2 differs");
    }
    let (out, _) = embed_capped("bf16", "bf16-avx2.npy", Some("avx2"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(stderr.contains("AVX512-BF16"), "{stderr}");
    let (out, _) = embed("int4", "int4.npy");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--quantize") && stderr.contains("unknown quantization \"int4\""),
        "{stderr}"
    );
}

/// The tiny BERT fixture (random weights, BERT's layout): fast enough for large inputs.
fn tiny_bert() -> PathBuf {
    infembed_testkit::workspace_root().join("crates/infembed-encoder/tests/fixtures/tiny-bert")
}

/// Copies a folder and its sub-folders.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Writes `n` passages `{"id": "p{i}", "text": "w.. w.."}` to `path`: passage `i` has
/// `words(i)` words, its `j`-th the word `w{word(i, j)}`.
fn write_word_corpus(
    path: &Path,
    n: usize,
    words: impl Fn(usize) -> usize,
    word: impl Fn(usize, usize) -> usize,
) {
    let mut text = String::new();
    for i in 0..n {
        let body: Vec<String> = (0..words(i)).map(|j| format!("w{}", word(i, j))).collect();
        text.push_str(&format!(
            "{{\"id\": \"p{i}\", \"text\": \"{}\"}}\n",
            body.join(" ")
        ));
    }
    std::fs::write(path, text).unwrap();
}

fn shard_files(parts: &Path) -> usize {
    std::fs::read_dir(parts).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".f32"))
            .count()
    })
}

#[test]
fn embed_killed_with_sigkill_resumes_to_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_word_corpus(
        &corpus,
        6000,
        |i| (i * 7) % 40 + 5,
        |i, j| (i + j * 13) % 997,
    );
    let embed = |output: &Path| {
        let mut cmd = bin();
        cmd.args(["embed", "--model"])
            .arg(tiny_bert())
            .arg("--input")
            .arg(&corpus)
            .arg("--output")
            .arg(output)
            .args(["--shard-size", "100"]);
        cmd
    };

    let reference = dir.path().join("reference.safetensors");
    let out = run(&mut embed(&reference));
    assert_success(&out);
    let want = std::fs::read(&reference).unwrap();

    // Killed (SIGKILL) once a few of the 60 shards are on disk.
    let output = dir.path().join("e.safetensors");
    let parts = dir.path().join("e.safetensors.parts");
    let mut child = embed(&output)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while shard_files(&parts) < 3 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it could be killed; make the corpus larger"
        );
        assert!(started.elapsed().as_secs() < 300, "no shard after 300 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let kept = shard_files(&parts);
    assert!((3..60).contains(&kept), "{kept} shards at the kill");
    assert!(!output.exists());

    let out = run(&mut embed(&output));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("resumed from {}", parts.display())),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&output).unwrap(), want, "the same bytes");
    assert!(!parts.exists(), "the parts folder is removed at the end");
}

/// `infembed embed` of `input` with the tiny BERT fixture into `output`, stored as `dtype`.
fn embed_tiny(input: &Path, output: &Path, dtype: &str) {
    let out = run(bin()
        .args(["embed", "--quiet", "--model"])
        .arg(tiny_bert())
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(output)
        .args(["--index-dtype", dtype]));
    assert_success(&out);
}

/// `embed --index-dtype f16` stores the f32 embeddings rounded to half precision, and
/// `search --queries` (one pass over the mapped index, a TREC run) gives each query exactly the
/// hits that `search --query` gives it alone.
#[test]
fn f16_index_and_a_file_of_queries_match_single_searches() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_word_corpus(&corpus, 300, |i| i % 9 + 3, |i, j| (i * 31 + j * 7) % 97);
    let embed = |output: &Path, dtype: &str| embed_tiny(&corpus, output, dtype);
    let full = dir.path().join("f32.safetensors");
    let half = dir.path().join("f16.safetensors");
    embed(&full, "f32");
    embed(&half, "f16");
    let full = EmbeddingIndex::load(&full).unwrap();
    let loaded = EmbeddingIndex::load(&half).unwrap();
    assert_eq!(loaded.dtype(), infembed::IndexDtype::F16);
    let rounded = full.to_dtype(infembed::IndexDtype::F16).unwrap();
    assert_eq!(loaded.ids, rounded.ids);
    assert!(
        loaded.embeddings() == rounded.embeddings(),
        "f16 values differ"
    );
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    assert!(size(&half) < size(&dir.path().join("f32.safetensors")));

    let queries = [
        ("q1", "w3 w10 w17", None),
        ("q2", "w50 w57", Some("prefer short passages")),
        ("q3", "w96", None),
        ("q4", "w0 w7 w14 w21", Some("anything")),
    ];
    let qfile = dir.path().join("queries.jsonl");
    let lines: Vec<String> = queries
        .iter()
        .map(|(id, text, ins)| {
            serde_json::json!({"id": id, "text": text, "instruction": ins}).to_string()
        })
        .collect();
    std::fs::write(&qfile, lines.join("\n")).unwrap();
    // `infembed search` over the f16 index with the tiny model.
    let search = || {
        let mut cmd = bin();
        cmd.args(["search", "--model"])
            .arg(tiny_bert())
            .arg("--index")
            .arg(&half);
        cmd
    };
    let run_file = dir.path().join("run.trec");
    let out = run(search()
        .arg("--queries")
        .arg(&qfile)
        .args(["-k", "7", "--output"])
        .arg(&run_file));
    assert_success(&out);
    let trec = std::fs::read_to_string(&run_file).unwrap();
    let rows: Vec<Vec<&str>> = trec.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(rows.len(), queries.len() * 7);
    for (qi, (id, text, ins)) in queries.iter().enumerate() {
        let mut cmd = search();
        cmd.args(["--query", text, "-k", "7", "--json"]);
        if let Some(ins) = ins {
            cmd.args(["--instruction", ins]);
        }
        let out = run(&mut cmd);
        assert_success(&out);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let hits = v["hits"].as_array().unwrap();
        assert_eq!(hits.len(), 7);
        for (r, hit) in hits.iter().enumerate() {
            let row = &rows[qi * 7 + r];
            assert_eq!(row[0], *id);
            assert_eq!(row[1], "Q0");
            assert_eq!(row[2], hit["id"].as_str().unwrap(), "{id} rank {}", r + 1);
            assert_eq!(row[3], (r + 1).to_string());
            let score: f32 = row[4].parse().unwrap();
            assert_eq!(
                score,
                hit["score"].as_f64().unwrap() as f32,
                "{id} rank {}",
                r + 1
            );
        }
    }

    // A query id with whitespace cannot go in a TREC run: one line naming it and the file.
    let spaced = dir.path().join("spaced.jsonl");
    std::fs::write(&spaced, r#"{"id": "q 1", "text": "w3"}"#).unwrap();
    let out = run(search().arg("--queries").arg(&spaced));
    assert_user_error(&out, &["\"q 1\"", "spaced.jsonl", "whitespace"]);

    // --queries and --json do not go together; --output needs --queries.
    let out = run(search().arg("--queries").arg(&qfile).arg("--json"));
    assert!(!out.status.success());
}

/// `eval --index` takes the corpus side from an index written by `embed` (looked up by id) and
/// gives the report of an evaluation that embeds the corpus itself; an index that lacks a corpus
/// document is a one-line error naming it.
#[test]
fn eval_with_a_saved_index_equals_eval_that_embeds_the_corpus() {
    // The first 300 documents of msmarco-subset with their judged queries, as a BEIR folder.
    let source = infembed_testkit::workspace_root().join("data/msmarco-subset");
    let dir = tempfile::tempdir().unwrap();
    let beir = dir.path().join("beir");
    std::fs::create_dir_all(beir.join("qrels")).unwrap();
    let read = |name: &str| std::fs::read_to_string(source.join(name)).unwrap();
    let id_of = |line: &str| {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        v["_id"].as_str().unwrap().to_string()
    };
    let corpus_text = read("corpus.jsonl");
    let docs: Vec<&str> = corpus_text.lines().take(300).collect();
    let doc_ids: std::collections::HashSet<String> = docs.iter().map(|l| id_of(l)).collect();
    let qrels_text = read("qrels/test.tsv");
    let mut qrels = vec![qrels_text.lines().next().unwrap()];
    qrels.extend(
        qrels_text
            .lines()
            .skip(1)
            .filter(|l| doc_ids.contains(l.split('\t').nth(1).unwrap())),
    );
    let query_ids: std::collections::HashSet<&str> = qrels[1..]
        .iter()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    let queries_text = read("queries.jsonl");
    let queries: Vec<&str> = queries_text
        .lines()
        .filter(|l| query_ids.contains(id_of(l).as_str()))
        .collect();
    assert!(queries.len() > 100, "{} queries", queries.len());
    std::fs::write(beir.join("corpus.jsonl"), docs.join("\n")).unwrap();
    std::fs::write(beir.join("queries.jsonl"), queries.join("\n")).unwrap();
    std::fs::write(beir.join("qrels/test.tsv"), qrels.join("\n")).unwrap();

    let embed = embed_tiny;
    let eval = |index: Option<&Path>| {
        let mut cmd = bin();
        cmd.args(["eval", "--beir"])
            .arg(&beir)
            .arg("--model")
            .arg(tiny_bert())
            .arg("--json");
        if let Some(index) = index {
            cmd.arg("--index").arg(index);
        }
        run(&mut cmd)
    };
    let report = |out: &Output| -> serde_json::Value {
        assert_success(out);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let full = dir.path().join("corpus.safetensors");
    let half = dir.path().join("corpus-f16.safetensors");
    embed(&beir.join("corpus.jsonl"), &full, "f32");
    embed(&beir.join("corpus.jsonl"), &half, "f16");

    let own = report(&eval(None));
    let indexed = report(&eval(Some(&full)));
    let fields = [
        "ndcg_at_10",
        "map_at_1000",
        "mrr_at_10",
        "precision_at_10",
        "recall_at_100",
    ];
    let score =
        |r: &serde_json::Value, field: &str| r["scores"]["test"][0][field].as_f64().unwrap();
    for field in fields {
        let (a, b) = (score(&own, field), score(&indexed, field));
        assert!(
            (a - b).abs() < 1e-9,
            "{field}: {a} embedding the corpus, {b} from the index"
        );
    }
    assert_eq!(own["n_docs"], indexed["n_docs"]);
    // Half precision moves the scores by about 1e-3 here: the metrics stay close.
    let rounded = report(&eval(Some(&half)));
    for field in fields {
        let (a, b) = (score(&own, field), score(&rounded, field));
        assert!(
            (a - b).abs() < 0.01,
            "{field}: {a} in f32, {b} from the f16 index"
        );
    }

    // An index of part of the corpus names the first missing document.
    let corpus = std::fs::read_to_string(beir.join("corpus.jsonl")).unwrap();
    let part = dir.path().join("part.jsonl");
    std::fs::write(&part, corpus.lines().skip(3).collect::<Vec<_>>().join("\n")).unwrap();
    let partial = dir.path().join("part.safetensors");
    embed(&part, &partial, "f32");
    let first: serde_json::Value = serde_json::from_str(corpus.lines().next().unwrap()).unwrap();
    let first_id = first["_id"]
        .as_str()
        .or(first["id"].as_str())
        .unwrap()
        .to_string();
    assert_user_error(
        &eval(Some(&partial)),
        &[
            "part.safetensors",
            &format!("`{first_id}`"),
            "3 of",
            "infembed embed",
        ],
    );
}

/// `eval --run-dir` on an instruction-following test writes p-MRR per query and per changed
/// document beside the two runs: each document's ranks are its ranks in the written runs (or one
/// past the end when absent), its score is FollowIR's rank score of those ranks (recomputed here),
/// each query's value is the mean of its documents', and their mean is the report's p-MRR.
#[test]
fn eval_writes_p_mrr_per_query_and_per_document() {
    let root = infembed_testkit::workspace_root();
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let results = dir.path().join("results");
    let out = run(bin()
        .args(["eval", "--data"])
        .arg(root.join("data/inf-ir-sample/dev.jsonl"))
        .arg("--distractors")
        .arg(root.join("data/inf-ir-sample/distractors.jsonl"))
        .arg("--json")
        .arg("--run-dir")
        .arg(&runs)
        .arg("--results")
        .arg(&results));
    assert_success(&out);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The results file is the printed object, filed under the baseline's name and settings.
    let file = results.join("bm25/k1=0.9,b=0.4,stemmer=none,stopwords=none/dev.json");
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(written, report);
    assert!(file.with_file_name("model_meta.json").is_file());
    // The chart of the written p-MRR is a PNG of the chart's size.
    let png = std::fs::read(runs.join("p-mrr.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(runs.join("p-mrr.svg").is_file());

    // Ranks in a written run: the line's position among the query's lines.
    let ranks = |name: &str| {
        let mut ranks: std::collections::HashMap<String, Vec<String>> = Default::default();
        for line in std::fs::read_to_string(runs.join(name)).unwrap().lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            ranks
                .entry(f[0].to_string())
                .or_default()
                .push(f[2].to_string());
        }
        ranks
    };
    let (og, changed) = (ranks("og.trec"), ranks("changed.trec"));
    let rank_in = |run: &std::collections::HashMap<String, Vec<String>>, q: &str, d: &str| {
        let docs = &run[q];
        docs.iter()
            .position(|x| x == d)
            .map_or(docs.len() + 1, |i| i + 1)
    };
    // FollowIR's (mteb's) rank score, written out here from its definition.
    let rank_score = |o: usize, n: usize| -> f64 {
        let (o, n) = (o as f64, n as f64);
        if o >= n {
            (1.0 / o) / (1.0 / n) - 1.0
        } else {
            1.0 - (1.0 / n) / (1.0 / o)
        }
    };
    let documents = std::fs::read_to_string(runs.join("p-mrr-documents.tsv")).unwrap();
    let mut by_query: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for line in documents.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        let (q, d) = (f[0], f[1]);
        let (o, n): (usize, usize) = (f[2].parse().unwrap(), f[3].parse().unwrap());
        assert_eq!(o, rank_in(&og, q, d), "{q} {d}");
        assert_eq!(n, rank_in(&changed, q, d), "{q} {d}");
        let score: f64 = f[4].parse().unwrap();
        assert!((score - 100.0 * rank_score(o, n)).abs() < 1e-9, "{line}");
        by_query.entry(q.to_string()).or_default().push(score);
    }
    assert!(by_query.len() > 10, "{documents}");
    let per_query = std::fs::read_to_string(runs.join("p-mrr.tsv")).unwrap();
    let mut values = Vec::new();
    for line in per_query.lines().skip(1) {
        let (q, v) = line.split_once('\t').unwrap();
        let v: f64 = v.parse().unwrap();
        let docs = &by_query[q];
        assert!(
            (v - docs.iter().sum::<f64>() / docs.len() as f64).abs() < 1e-9,
            "{line}"
        );
        values.push(v);
    }
    assert_eq!(values.len(), by_query.len());
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    // The results hold fractions: p-MRR is the main score, 1/100 of the table's.
    let entry = &report["scores"]["test"][0];
    assert_eq!(entry["main_score"], entry["p-MRR"]);
    assert!(
        (mean - 100.0 * entry["p-MRR"].as_f64().unwrap()).abs() < 1e-9,
        "{mean} vs {report}"
    );
    assert_eq!(report["task_name"], "dev");
    assert_eq!(report["infembed_version"], env!("CARGO_PKG_VERSION"));
    assert!(report["evaluation_time"].as_f64().unwrap() > 0.0);
}

/// A model is named by its `infembed_model.json` (as training writes it), not by its folder;
/// without one, by its folder at the SHA-256 of its weights. The results file goes where mteb
/// puts it: <folder>/<org>__<name>/<revision>/<set>.json.
#[test]
fn eval_names_the_model_from_its_info_file_and_files_results_like_mteb() {
    let root = infembed_testkit::workspace_root();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("final");
    copy_dir(&tiny_bert(), &model);
    let eval = |results: &Path| -> serde_json::Value {
        let out = run(bin()
            .args(["eval", "--data"])
            .arg(root.join("data/inf-ir-sample/dev.jsonl"))
            .arg("--model")
            .arg(&model)
            .arg("--json")
            .arg("--results")
            .arg(results));
        assert_success(&out);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // No info file: the folder's name, and the revision is the SHA-256 of
    // "model.safetensors\0" + the weights (computed here with the sha256sum tool).
    let weights = std::fs::read(model.join("model.safetensors")).unwrap();
    let mut input = b"model.safetensors\0".to_vec();
    input.extend_from_slice(&weights);
    let hashed = dir.path().join("hashed");
    std::fs::write(&hashed, &input).unwrap();
    let sum = Command::new("sha256sum").arg(&hashed).output().unwrap();
    let hex = String::from_utf8(sum.stdout).unwrap()[..16].to_string();
    let plain = eval(&dir.path().join("r1"));
    assert_eq!(plain["model"]["name"], "final");
    assert_eq!(plain["model"]["revision"], format!("sha256:{hex}"));
    assert!(
        dir.path()
            .join(format!("r1/final/sha256_{hex}/dev.json"))
            .is_file()
    );

    std::fs::write(
        model.join("infembed_model.json"),
        r#"{"name": "org/tuned", "revision": "abc123", "base_model": {"name": "org/base", "revision": "def"}}"#,
    )
    .unwrap();
    let named = eval(&dir.path().join("r2"));
    assert_eq!(named["model"]["name"], "org/tuned");
    assert_eq!(named["model"]["revision"], "abc123");
    assert_eq!(named["model"]["base_model"]["name"], "org/base");
    assert_eq!(named["retriever"], "org/tuned");
    assert_eq!(named["model"]["template"], "{query} {instruction}");
    assert_eq!(
        named["model"]["settings"]["interaction"]["template"],
        "{query} {instruction}"
    );
    let file = dir.path().join("r2/org__tuned/abc123/dev.json");
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(written, named);
    // The same model, the same scores, whatever it is called.
    assert_eq!(plain["scores"], named["scores"]);
    // A broken info file is an error naming it.
    std::fs::write(model.join("infembed_model.json"), "{").unwrap();
    let out = run(bin()
        .args(["eval", "--data"])
        .arg(root.join("data/inf-ir-sample/dev.jsonl"))
        .arg("--model")
        .arg(&model));
    assert_user_error(&out, &["infembed_model.json"]);
}

/// `embed --batch-size N` changes how many texts share a forward pass, not what they embed
/// to: sorted by length, each text is padded only to the longest of its batch and masked
/// past its end, so one text per pass, an odd size and one pass for all agree to rounding
/// with the default (32). `--batch-size 0` is a one-line usage error.
#[test]
fn embed_batch_size_changes_passes_not_embeddings() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_word_corpus(
        &corpus,
        70,
        |i| i * 5 % 23 + 1,
        |i, j| (i * 17 + j * 3) % 89,
    );
    let embed = |output: &Path, batch: Option<&str>| {
        let mut cmd = bin();
        cmd.args(["embed", "--quiet", "--model"])
            .arg(tiny_bert())
            .arg("--input")
            .arg(&corpus)
            .arg("--output")
            .arg(output);
        if let Some(b) = batch {
            cmd.args(["--batch-size", b]);
        }
        run(&mut cmd)
    };
    let default = dir.path().join("default.safetensors");
    assert_success(&embed(&default, None));
    let want = EmbeddingIndex::load(&default).unwrap();
    for batch in ["1", "7", "70", "500"] {
        let path = dir.path().join(format!("b{batch}.safetensors"));
        assert_success(&embed(&path, Some(batch)));
        let got = EmbeddingIndex::load(&path).unwrap();
        assert_eq!(got.ids, want.ids, "--batch-size {batch}");
        let diff = max_abs_diff(&got.embeddings(), &want.embeddings());
        assert!(diff <= 1e-5, "--batch-size {batch}: {diff}");
    }
    let out = embed(&dir.path().join("zero.safetensors"), Some("0"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--batch-size"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
