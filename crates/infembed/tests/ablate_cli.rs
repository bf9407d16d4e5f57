//! `infembed ablate` end to end on the tiny random BERT fixture: the shipped tiny grid trains
//! every row (Interaction I and II, shared and separate towers) and its report's statistics are
//! those of its runs; a second call trains nothing; a grid killed with SIGKILL in the middle of
//! a run resumes it without redoing the finished one and ends with the measures of an
//! uninterrupted grid.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_infembed")
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn ablate(grid: &Path) -> Output {
    ablate_with(grid, &[])
}

fn ablate_with(grid: &Path, args: &[&str]) -> Output {
    let out = Command::new(bin())
        .args(["ablate", "--grid"])
        .arg(grid)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "infembed ablate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The shipped tiny grid, writing into `out`.
fn tiny_grid(dir: &Path, out: &Path) -> PathBuf {
    let text = std::fs::read_to_string(root().join("examples/ablation/tiny.toml")).unwrap();
    assert!(text.contains("output_dir = \"runs/ablation/tiny\""));
    let text = text.replace(
        "output_dir = \"runs/ablation/tiny\"",
        &format!("output_dir = {out:?}"),
    );
    let path = dir.join("tiny.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Naive mean and sample standard deviation.
fn mean_sd(v: &[f64]) -> (f64, Option<f64>) {
    let mut sum = 0.0;
    for x in v {
        sum += x;
    }
    let m = sum / v.len() as f64;
    if v.len() < 2 {
        return (m, None);
    }
    let mut ss = 0.0;
    for x in v {
        ss += (x - m) * (x - m);
    }
    (m, Some((ss / (v.len() as f64 - 1.0)).sqrt()))
}

#[test]
fn the_tiny_grid_trains_every_row_and_a_second_call_trains_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let grid = tiny_grid(dir.path(), &out);
    // Five runs, then the rest: the second call reads the five back.
    ablate_with(&grid, &["--max-runs", "5"]);
    let partial = read_json(&out.join("results.json"));
    assert_eq!(partial["runs"].as_array().unwrap().len(), 5);
    let first = ablate(&grid);
    let log = String::from_utf8_lossy(&first.stderr);
    assert_eq!(log.matches("cached: ").count(), 5, "{log}");
    let report = read_json(&out.join("results.json"));
    let runs = report["runs"].as_array().unwrap();
    let rows = report["rows"].as_array().unwrap();
    // 2 objectives x 2 interactions x 2 towers, seeds 1 and 2, then seed 3 for the best row.
    assert_eq!(rows.len(), 8);
    assert_eq!(runs.len(), 17, "{}", String::from_utf8_lossy(&first.stderr));
    for interaction in ["type\":\"self_attention", "type\":\"cross_attention"] {
        for towers in ["\"shared\"", "\"separate\""] {
            assert!(
                runs.iter().any(|r| {
                    let c = r["config"].to_string();
                    c.contains(interaction) && c.contains(towers)
                }),
                "no run with {interaction} and {towers}"
            );
        }
    }
    // Each row's statistics are those of its runs.
    let pmrr = |r: &Value| r["measures"]["p_mrr"].as_f64().unwrap();
    for row in rows {
        let label = row["label"].as_str().unwrap();
        let mine: Vec<&Value> = runs.iter().filter(|r| r["row"] == label).collect();
        for measure in ["p_mrr", "ndcg_at_10", "retrieval_ndcg_at_10"] {
            let values: Vec<f64> = mine
                .iter()
                .map(|r| r["measures"][measure].as_f64().unwrap())
                .collect();
            let (m, sd) = mean_sd(&values);
            let stat = &row["stats"][measure];
            assert!(
                (stat["mean"].as_f64().unwrap() - m).abs() < 1e-9,
                "{label} {measure}"
            );
            match sd {
                Some(sd) => assert!((stat["sd"].as_f64().unwrap() - sd).abs() < 1e-9),
                None => assert!(stat["sd"].is_null()),
            }
        }
        assert_eq!(row["pending"], 0);
    }
    // Seed 3 went to the row with the best mean p-MRR over seeds 1 and 2 (the first in the
    // grid's order on a tie).
    let mut best: Option<(&str, f64)> = None;
    for row in rows {
        let label = row["label"].as_str().unwrap();
        let v: Vec<f64> = runs
            .iter()
            .filter(|r| r["row"] == label && r["seed"] != 3)
            .map(pmrr)
            .collect();
        let (m, _) = mean_sd(&v);
        if best.is_none_or(|(_, b)| m > b) {
            best = Some((label, m));
        }
    }
    let third: Vec<&Value> = runs.iter().filter(|r| r["seed"] == 3).collect();
    assert_eq!(third.len(), 1);
    assert_eq!(third[0]["row"].as_str(), best.map(|b| b.0));
    // Finished runs keep their result, not their model.
    for entry in std::fs::read_dir(out.join("runs")).unwrap() {
        let run = entry.unwrap().path();
        assert!(run.join("result.json").exists());
        assert!(!run.join("checkpoints").exists() && !run.join("final").exists());
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    for row in rows {
        assert!(md.contains(&format!("| {} |", row["label"].as_str().unwrap())));
    }
    assert!(md.contains("| zero-shot (base model) |"));
    assert!(out.join("p_mrr.svg").exists() && out.join("p_mrr.png").exists());

    // Again: every run is read back, none trains, the results are unchanged.
    let before = std::fs::read(out.join("results.json")).unwrap();
    let second = ablate(&grid);
    let log = String::from_utf8_lossy(&second.stderr);
    assert_eq!(log.matches("cached: ").count(), 17, "{log}");
    assert!(!log.contains("train step"), "{log}");
    assert_eq!(std::fs::read(out.join("results.json")).unwrap(), before);
    // `--report` rebuilds the same report from the files alone.
    std::fs::remove_file(out.join("results.json")).unwrap();
    ablate_with(&grid, &["--report"]);
    assert_eq!(std::fs::read(out.join("results.json")).unwrap(), before);
    // The extra seed went to the best row of the first pass; if that seed's run then scores
    // worst of all, the report still owes nothing (the first pass, not the mean over every
    // seed, decides which rows get extra seeds).
    let third_key = third[0]["key"].as_str().unwrap().to_string();
    let path = out.join("runs").join(&third_key).join("result.json");
    let mut result = read_json(&path);
    result["measures"]["p_mrr"] = serde_json::json!(-100.0);
    std::fs::write(&path, serde_json::to_vec_pretty(&result).unwrap()).unwrap();
    ablate_with(&grid, &["--report"]);
    let report = read_json(&out.join("results.json"));
    assert!(
        report["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["pending"] == 0),
        "{report}"
    );

    // A result belongs to the row whose config it has, whatever label it was trained under:
    // the grid with a row renamed reports the runs under the new name, none pending.
    let text = std::fs::read_to_string(&grid).unwrap();
    assert!(text.contains("label = \"multi P+I\""));
    let renamed = dir.path().join("renamed.toml");
    std::fs::write(
        &renamed,
        text.replace("label = \"multi P+I\"", "label = \"renamed\""),
    )
    .unwrap();
    let again = ablate(&renamed);
    let log = String::from_utf8_lossy(&again.stderr);
    assert_eq!(log.matches("cached: ").count(), 17, "{log}");
    let report = read_json(&out.join("results.json"));
    let runs = report["runs"].as_array().unwrap();
    assert!(
        runs.iter()
            .any(|r| r["row"].as_str().unwrap().starts_with("renamed"))
    );
    assert!(
        !runs
            .iter()
            .any(|r| r["row"].as_str().unwrap().starts_with("multi P+I"))
    );
    assert!(
        report["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["pending"] == 0)
    );
}

/// A base config of absolute paths: 20 epochs of 3 steps, a checkpoint every step.
fn long_base(dir: &Path) -> PathBuf {
    let root = root();
    let path = dir.join("base.toml");
    std::fs::write(
        &path,
        format!(
            "model = {:?}\noutput_dir = \"unused\"\nseed = 5\nepochs = 20\n\
             [data]\ntrain = {:?}\ndev = {:?}\n\
             [encoder]\nquery_max_length = 32\npassage_max_length = 48\n\
             [optimizer]\nlr = 1e-3\n[batch]\nrecords = 2\n\
             [eval]\nat_start = false\n[checkpoint]\nevery_steps = 1\nkeep = 2\n",
            root.join("crates/infembed-encoder/tests/fixtures/tiny-bert"),
            root.join("examples/data/tiny-train.jsonl"),
            root.join("examples/data/tiny-train.jsonl"),
        ),
    )
    .unwrap();
    path
}

fn long_grid(dir: &Path, base: &Path, out: &Path) -> PathBuf {
    let path = dir.join(format!(
        "{}.toml",
        out.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(
        &path,
        format!(
            "base = {base:?}\noutput_dir = {out:?}\nretrieval = false\n\
             [[axes]]\nname = \"objective\"\nkey = \"loss.terms\"\n\
             values = [[\"P\", \"I\"], [\"P\", \"IQ\"]]\nlabels = [\"P+I\", \"P+IQ\"]\n"
        ),
    )
    .unwrap();
    path
}

/// The run folder (under `out/runs`) that has a checkpoint of at least `step` and no result.
fn unfinished_run_at(out: &Path, step: usize) -> Option<PathBuf> {
    for entry in std::fs::read_dir(out.join("runs")).ok()? {
        let run = entry.ok()?.path();
        if run.join("result.json").exists() {
            continue;
        }
        let Ok(ckpts) = std::fs::read_dir(run.join("checkpoints")) else {
            continue;
        };
        for c in ckpts.flatten() {
            let name = c.file_name().to_string_lossy().into_owned();
            if let Some(n) = name
                .strip_prefix("step-")
                .and_then(|n| n.parse::<usize>().ok())
                && n >= step
            {
                return Some(run);
            }
        }
    }
    None
}

fn results_by_row(out: &Path) -> Vec<(String, Value, Value)> {
    let report = read_json(&out.join("results.json"));
    report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["row"].to_string(),
                r["measures"].clone(),
                r["history"].clone(),
            )
        })
        .collect()
}

#[test]
fn a_grid_killed_in_a_run_resumes_it_and_keeps_the_finished_run() {
    let dir = tempfile::tempdir().unwrap();
    let base = long_base(dir.path());
    let killed_out = dir.path().join("killed");
    let grid = long_grid(dir.path(), &base, &killed_out);
    let mut child = Command::new(bin())
        .args(["ablate", "--grid"])
        .arg(&grid)
        .current_dir(root())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the first run has its result and the second is 7 steps in.
    let started = Instant::now();
    let second = loop {
        if let Some(run) = unfinished_run_at(&killed_out, 7)
            && std::fs::read_dir(killed_out.join("runs"))
                .unwrap()
                .flatten()
                .any(|e| e.path().join("result.json").exists())
        {
            break run;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the grid ended before it could be killed"
        );
        assert!(started.elapsed() < Duration::from_secs(300), "timed out");
        std::thread::sleep(Duration::from_millis(5));
    };
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        !second.join("result.json").exists(),
        "the second run finished before it was killed: the test did not interrupt it"
    );
    let finished: Vec<PathBuf> = std::fs::read_dir(killed_out.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("result.json").exists())
        .collect();
    assert_eq!(finished.len(), 1);
    let first_result = std::fs::read(finished[0].join("result.json")).unwrap();

    let resumed = ablate(&grid);
    let log = String::from_utf8_lossy(&resumed.stderr);
    assert_eq!(log.matches("cached: ").count(), 1, "{log}");
    assert!(log.contains("(resumed at step "), "{log}");
    // The finished run was not redone: its result is the same file.
    assert_eq!(
        std::fs::read(finished[0].join("result.json")).unwrap(),
        first_result
    );
    let second_result = read_json(&second.join("result.json"));
    assert_eq!(second_result["resumed"], true);

    // The same measures and dev history as a grid that was never interrupted.
    let clean_out = dir.path().join("clean");
    ablate(&long_grid(dir.path(), &base, &clean_out));
    let killed = results_by_row(&killed_out);
    let clean = results_by_row(&clean_out);
    assert_eq!(killed.len(), 2);
    assert_eq!(killed, clean);
}

#[test]
fn a_bad_grid_is_one_line_naming_the_file_row_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let base = long_base(dir.path());
    let grid = dir.path().join("bad.toml");
    std::fs::write(
        &grid,
        format!(
            "base = {base:?}\noutput_dir = {:?}\n[[axes]]\nname = \"lr\"\n\
             key = \"optimizer.learning_rate\"\nvalues = [1e-4]\n",
            dir.path().join("out")
        ),
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["ablate", "--grid"])
        .arg(&grid)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in ["bad.toml", "row `0.0001`", "learning_rate"] {
        assert!(err.contains(needle), "{err:?} lacks {needle:?}");
    }
    assert!(!dir.path().join("out").exists(), "nothing may run");
}

#[test]
fn every_shipped_grid_is_valid() {
    // The real grids train all-MiniLM-L6-v2: checking them needs the model folder.
    let root = root();
    if infembed_testkit::minilm_dir("every_shipped_grid_is_valid").is_none() {
        return;
    }
    let mut seen = 0;
    for entry in std::fs::read_dir(root.join("examples/ablation")).unwrap() {
        let grid = entry.unwrap().path();
        if grid.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let out = Command::new(bin())
            .args(["ablate", "--check", "--grid"])
            .arg(&grid)
            .current_dir(&root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            grid.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        seen += 1;
    }
    assert!(seen >= 4, "the shipped grids were not found");
}
