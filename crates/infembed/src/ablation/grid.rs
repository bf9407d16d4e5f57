//! The grid file: a base training config, keys set over it, axes whose cartesian product makes
//! the rows, seeds, and the paper's values to print beside the results (docs/ablation.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use infembed_train::TrainConfig;
use serde::Deserialize;
use serde_json::Value;

use super::{GridError, Measure};

/// Where a grid reads `msmarco-subset` unless it says otherwise (the quickstart's copy).
pub const DEFAULT_RETRIEVAL_SET: &str = crate::quickstart::MSMARCO_SUBSET_DIR;

/// The grid file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GridFile {
    name: Option<String>,
    base: PathBuf,
    output_dir: PathBuf,
    #[serde(default = "default_seeds")]
    seeds: Vec<u64>,
    #[serde(default)]
    keep_models: bool,
    #[serde(default)]
    retrieval: Option<RetrievalFile>,
    #[serde(default)]
    set: toml::Table,
    #[serde(default)]
    axes: Vec<AxisFile>,
    #[serde(default)]
    more_seeds: Option<MoreSeeds>,
    #[serde(default)]
    paper: Option<PaperFile>,
}

fn default_seeds() -> Vec<u64> {
    vec![42]
}

/// `retrieval = "DIR"` or `retrieval = false`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RetrievalFile {
    Dir(PathBuf),
    Enabled(bool),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AxisFile {
    name: String,
    /// Shorthand: one key, its values (scalars or tables), optional labels.
    key: Option<String>,
    values: Vec<toml::Value>,
    labels: Option<Vec<String>>,
}

/// More seeds for the best rows, once every row has run with the grid's `seeds`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct MoreSeeds {
    /// How many rows (the best by `by`, mean over the grid's first seeds).
    pub top: usize,
    /// The seeds they get in addition.
    pub seeds: Vec<u64>,
    /// The measure that ranks them (default: dev p-MRR).
    #[serde(default)]
    pub by: Measure,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaperFile {
    measure: String,
    #[serde(default)]
    values: BTreeMap<String, f64>,
}

/// The paper's values for the rows it reports, as the grid file quotes them.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PaperValues {
    /// What the values are (table, benchmark, measure, backbone).
    pub measure: String,
    /// Row label -> value.
    pub values: BTreeMap<String, f64>,
}

/// One recipe of the grid: a value of every axis.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct GridRow {
    /// The axes' labels joined by ` / ` (the table's first column).
    pub label: String,
    /// Each axis's label for this row, in axis order.
    pub parts: Vec<String>,
    /// The config keys this row sets (after the grid's `set`), dotted, in order.
    pub keys: Vec<(String, Value)>,
}

/// A parsed and checked grid: every row's config is valid for every seed before anything runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Grid {
    /// The grid file.
    pub path: PathBuf,
    /// Its name (the file stem unless `name` is given).
    pub name: String,
    /// The base training config.
    pub base: PathBuf,
    /// Where run folders, the results and the report go.
    pub output_dir: PathBuf,
    /// The seeds every row runs with.
    pub seeds: Vec<u64>,
    /// Keep each run's final model and checkpoints (by default only its results, history and
    /// chart are kept: a MiniLM run's checkpoint is about 270 MB).
    pub keep_models: bool,
    /// The ad hoc retrieval set scored after each run (`None`: not scored).
    pub retrieval: Option<PathBuf>,
    /// Axis names, in order.
    pub axes: Vec<String>,
    /// The rows, first axis outermost.
    pub rows: Vec<GridRow>,
    /// Extra seeds for the best rows.
    pub more_seeds: Option<MoreSeeds>,
    /// The paper's values.
    pub paper: Option<PaperValues>,
    base_value: Value,
    set: Vec<(String, Value)>,
}

impl Grid {
    /// Reads and checks a grid file: its TOML, the base config, every axis, and every row's
    /// config (for the first seed; seeds change nothing else).
    ///
    /// # Errors
    /// [`GridError`] naming the file and the key, axis or row that is wrong.
    pub fn from_file(path: &Path) -> Result<Self, GridError> {
        let text = std::fs::read_to_string(path).map_err(|e| GridError::io(path, e))?;
        let file: GridFile = toml::from_str(&text).map_err(|e| GridError::Invalid {
            path: path.to_path_buf(),
            problem: toml_problem(&text, &e),
        })?;
        let bad = |problem: String| GridError::Invalid {
            path: path.to_path_buf(),
            problem,
        };
        if file.seeds.is_empty() {
            return Err(bad("`seeds` is empty: give at least one seed".into()));
        }
        if has_duplicate(&file.seeds) {
            return Err(bad(format!("`seeds` repeats a seed: {:?}", file.seeds)));
        }
        // The base as a whole config, every default filled in, so that a row can set one key
        // of a table the base file leaves out (`loss.terms` without `loss.kind`).
        let base_config =
            TrainConfig::from_file(&file.base).map_err(|e| bad(format!("base config: {e}")))?;
        let base_value =
            serde_json::to_value(&base_config).map_err(|e| bad(format!("base config: {e}")))?;
        let set = flatten_set(&file.set, "set").map_err(bad)?;
        let mut axes = Vec::new();
        let mut choices: Vec<Vec<Choice>> = Vec::new();
        for (i, axis) in file.axes.iter().enumerate() {
            if axes.contains(&axis.name) {
                return Err(bad(format!("two axes are named `{}`", axis.name)));
            }
            axes.push(axis.name.clone());
            choices.push(
                axis_choices(axis).map_err(|p| bad(format!("axes[{i}] (`{}`): {p}", axis.name)))?,
            );
        }
        let mut rows = vec![GridRow {
            label: String::new(),
            parts: Vec::new(),
            keys: Vec::new(),
        }];
        for axis in &choices {
            let mut next = Vec::with_capacity(rows.len() * axis.len());
            for row in &rows {
                for (label, keys) in axis {
                    let mut parts = row.parts.clone();
                    parts.push(label.clone());
                    let mut k = row.keys.clone();
                    k.extend(keys.iter().cloned());
                    next.push(GridRow {
                        label: parts.join(" / "),
                        parts,
                        keys: k,
                    });
                }
            }
            rows = next;
        }
        if rows.len() == 1 && rows[0].label.is_empty() {
            rows[0].label = "base".into();
        }
        let mut labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
        labels.sort_unstable();
        if let Some(w) = labels.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!(
                "two rows are labelled `{}`: give the axes' values distinct labels",
                w[0]
            )));
        }
        if let Some(more) = &file.more_seeds {
            if more.top == 0 || more.seeds.is_empty() {
                return Err(bad(
                    "`more_seeds` needs `top` >= 1 and at least one seed".into()
                ));
            }
            if let Some(s) = more.seeds.iter().find(|s| file.seeds.contains(s)) {
                return Err(bad(format!(
                    "`more_seeds.seeds` repeats seed {s} of `seeds`"
                )));
            }
            if has_duplicate(&more.seeds) {
                return Err(bad(format!(
                    "`more_seeds.seeds` repeats a seed: {:?}",
                    more.seeds
                )));
            }
        }
        let paper = match file.paper {
            Some(p) => {
                if let Some(unknown) = p
                    .values
                    .keys()
                    .find(|k| !rows.iter().any(|r| &r.label == *k))
                {
                    return Err(bad(format!(
                        "`paper.values` names `{unknown}`, which is no row of this grid (rows: {})",
                        rows.iter()
                            .map(|r| format!("`{}`", r.label))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                Some(PaperValues {
                    measure: p.measure,
                    values: p.values,
                })
            }
            None => None,
        };
        let retrieval = match file.retrieval {
            None | Some(RetrievalFile::Enabled(true)) => Some(PathBuf::from(DEFAULT_RETRIEVAL_SET)),
            Some(RetrievalFile::Enabled(false)) => None,
            Some(RetrievalFile::Dir(d)) => Some(d),
        };
        let name = file.name.unwrap_or_else(|| {
            path.file_stem()
                .map_or("grid".into(), |s| s.to_string_lossy().into_owned())
        });
        let grid = Grid {
            path: path.to_path_buf(),
            name,
            base: file.base,
            output_dir: file.output_dir,
            seeds: file.seeds,
            keep_models: file.keep_models,
            retrieval,
            axes,
            rows,
            more_seeds: file.more_seeds,
            paper,
            base_value,
            set,
        };
        for row in &grid.rows {
            grid.config(row, grid.seeds[0])?;
        }
        Ok(grid)
    }

    /// The training config of `row` with `seed`: the base, the grid's `set`, the row's keys,
    /// the seed. Its `output_dir` is the base's until the runner gives it the run's folder.
    ///
    /// # Errors
    /// [`GridError::Row`] naming the row when a key cannot be set; [`GridError::Config`]
    /// naming the grid file and the row when a key is unknown, a value has the wrong type or the
    /// config is invalid.
    pub fn config(&self, row: &GridRow, seed: u64) -> Result<TrainConfig, GridError> {
        let mut value = self.base_value.clone();
        let row_err = |problem: String| GridError::Row {
            path: self.path.clone(),
            row: row.label.clone(),
            problem,
        };
        for (key, v) in self.set.iter().chain(row.keys.iter()) {
            set_key(&mut value, key, v.clone()).map_err(&row_err)?;
        }
        set_key(&mut value, "seed", Value::from(seed)).map_err(&row_err)?;
        let origin = PathBuf::from(format!(
            "{} (row `{}`, seed {seed})",
            self.path.display(),
            row.label
        ));
        Ok(TrainConfig::from_value(value, &origin)?)
    }

    /// Every seed a row can run with: the grid's `seeds`, then `more_seeds`.
    pub fn all_seeds(&self) -> impl Iterator<Item = u64> + '_ {
        self.seeds
            .iter()
            .chain(self.more_seeds.iter().flat_map(|m| m.seeds.iter()))
            .copied()
    }

    /// The base config with the grid's `set` (what the zero-shot row evaluates).
    ///
    /// # Errors
    /// As [`config`](Self::config).
    pub fn base_config(&self) -> Result<TrainConfig, GridError> {
        let row = GridRow {
            label: "zero-shot".into(),
            parts: Vec::new(),
            keys: Vec::new(),
        };
        self.config(&row, self.seeds[0])
    }
}

fn has_duplicate(seeds: &[u64]) -> bool {
    let mut s = seeds.to_vec();
    s.sort_unstable();
    s.windows(2).any(|w| w[0] == w[1])
}

/// One value of an axis: its label and the dotted keys it sets.
type Choice = (String, Vec<(String, Value)>);

/// The `(label, keys)` choices of an axis.
fn axis_choices(axis: &AxisFile) -> Result<Vec<Choice>, String> {
    if axis.values.is_empty() {
        return Err("`values` is empty".into());
    }
    if let Some(labels) = &axis.labels
        && labels.len() != axis.values.len()
    {
        return Err(format!(
            "{} labels for {} values",
            labels.len(),
            axis.values.len()
        ));
    }
    let mut out = Vec::with_capacity(axis.values.len());
    for (i, v) in axis.values.iter().enumerate() {
        let given = axis.labels.as_ref().map(|l| l[i].clone());
        let (label, keys) = match &axis.key {
            Some(key) => {
                let label = given.unwrap_or_else(|| match v {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
                (label, vec![(key.clone(), to_json(v)?)])
            }
            None => {
                let toml::Value::Table(t) = v else {
                    return Err(format!(
                        "values[{i}] is not a table: without `key`, each value is a table of \
                         keys with a `label`"
                    ));
                };
                let mut t = t.clone();
                let label = match (t.remove("label"), given) {
                    (Some(toml::Value::String(s)), _) | (None, Some(s)) => s,
                    (Some(_), _) => return Err(format!("values[{i}].label is not a string")),
                    (None, None) => {
                        return Err(format!(
                            "values[{i}] has no `label` (and the axis no `labels`)"
                        ));
                    }
                };
                (label, flatten_set(&t, &format!("values[{i}]"))?)
            }
        };
        if label.is_empty() || label.contains(" / ") {
            return Err(format!(
                "values[{i}]'s label `{label}` is empty or contains ` / ` (the rows' separator)"
            ));
        }
        if out.iter().any(|(l, _)| *l == label) {
            return Err(format!("two values are labelled `{label}`"));
        }
        out.push((label, keys));
    }
    Ok(out)
}

/// The keys of a table of settings: `"loss.kind" = ...`, `loss.kind = ...` and `[set.loss]`
/// tables all name the same key (tables are merged key by key by [`set_key`]).
fn flatten_set(table: &toml::Table, what: &str) -> Result<Vec<(String, Value)>, String> {
    let mut out = Vec::new();
    for (k, v) in table {
        if k.is_empty() || k.split('.').any(str::is_empty) {
            return Err(format!("{what}: `{k}` is not a dotted key"));
        }
        out.push((k.clone(), to_json(v)?));
    }
    Ok(out)
}

fn to_json(v: &toml::Value) -> Result<Value, String> {
    serde_json::to_value(v).map_err(|e| e.to_string())
}

/// Sets the dotted `key` of a config value, creating missing tables. A table value is merged key
/// by key into the table it lands on, except that a table whose `type` differs from that
/// table's `type` replaces it (a tagged choice switching variant: `"encoder.interaction" = {
/// type = "cross_attention" }` leaves none of Interaction I's keys behind).
fn set_key(root: &mut Value, key: &str, value: Value) -> Result<(), String> {
    let mut at = root;
    let parts: Vec<&str> = key.split('.').collect();
    let (last, parents) = parts
        .split_last()
        .ok_or_else(|| "an empty key".to_string())?;
    for (i, p) in parents.iter().enumerate() {
        let Value::Object(map) = at else {
            return Err(format!(
                "`{key}`: `{}` is not a table",
                parents[..i].join(".")
            ));
        };
        at = map
            .entry((*p).to_string())
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
    }
    let Value::Object(map) = at else {
        return Err(format!("`{key}`: `{}` is not a table", parents.join(".")));
    };
    merge_into(map, last, value);
    Ok(())
}

fn merge_into(map: &mut serde_json::Map<String, Value>, key: &str, value: Value) {
    match (map.get_mut(key), value) {
        (Some(Value::Object(old)), Value::Object(new))
            if new
                .get("type")
                .is_none_or(|t| old.get("type").is_none_or(|o| o == t)) =>
        {
            for (k, v) in new {
                merge_into(old, &k, v);
            }
        }
        (_, value) => {
            map.insert(key.to_string(), value);
        }
    }
}

fn toml_problem(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            format!("line {line}: {message}")
        }
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_key_merges_tables_and_a_new_type_replaces_its_table() {
        let mut v = serde_json::json!({"encoder": {"pooling": "mean", "interaction": {"type": "self_attention", "template": "{query} {instruction}"}}});
        set_key(&mut v, "loss.kind", Value::from("univariate")).unwrap();
        // A table merges: the keys it does not name stay.
        set_key(&mut v, "encoder", serde_json::json!({"towers": "separate"})).unwrap();
        set_key(
            &mut v,
            "encoder.interaction",
            serde_json::json!({"type": "self_attention", "instruction_negatives": 3}),
        )
        .unwrap();
        assert_eq!(
            v["encoder"],
            serde_json::json!({"pooling": "mean", "towers": "separate", "interaction": {"type": "self_attention", "template": "{query} {instruction}", "instruction_negatives": 3}})
        );
        // Another `type`: the table is replaced.
        set_key(
            &mut v,
            "encoder.interaction",
            serde_json::json!({"type": "cross_attention"}),
        )
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"encoder": {"pooling": "mean", "towers": "separate", "interaction": {"type": "cross_attention"}}, "loss": {"kind": "univariate"}})
        );
        let err = set_key(&mut v, "loss.kind.x", Value::from(1)).unwrap_err();
        assert!(err.contains("`loss.kind` is not a table"), "{err}");
    }
}

#[cfg(test)]
mod file_tests {
    use super::*;

    /// A base config of absolute paths (tests run in the crate's folder).
    fn base(dir: &Path) -> PathBuf {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let text = format!(
            "model = {:?}\noutput_dir = \"unused\"\n[data]\ntrain = {:?}\ndev = {:?}\n\
             [loss]\nkind = \"multivariate\"\nterms = [\"P\", \"I\"]\ntemperature = 0.07\n",
            root.join("crates/infembed-encoder/tests/fixtures/tiny-bert"),
            root.join("examples/data/tiny-train.jsonl"),
            root.join("examples/data/tiny-train.jsonl"),
        );
        let path = dir.join("base.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn grid(dir: &Path, body: &str) -> Result<Grid, GridError> {
        let path = dir.join("grid.toml");
        std::fs::write(
            &path,
            format!(
                "base = {:?}\noutput_dir = {:?}\n{body}",
                base(dir),
                dir.join("out")
            ),
        )
        .unwrap();
        Grid::from_file(&path)
    }

    #[test]
    fn rows_are_the_product_of_the_axes_first_axis_outermost() {
        let dir = tempfile::tempdir().unwrap();
        let g = grid(
            dir.path(),
            r#"seeds = [7, 8]
[set]
"optimizer.lr" = 2e-4
[[axes]]
name = "objective"
[[axes.values]]
label = "uni P"
loss = { kind = "univariate", terms = ["P"] }
[[axes.values]]
label = "multi P+IQ"
"loss.terms" = ["P", "IQ"]
[[axes]]
name = "epochs"
key = "epochs"
values = [1, 2, 3]
"#,
        )
        .unwrap();
        let labels: Vec<&str> = g.rows.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "uni P / 1",
                "uni P / 2",
                "uni P / 3",
                "multi P+IQ / 1",
                "multi P+IQ / 2",
                "multi P+IQ / 3"
            ]
        );
        let c = g.config(&g.rows[5], 8).unwrap();
        assert_eq!(c.seed, 8);
        assert_eq!(c.epochs, 3);
        assert_eq!(c.optimizer.lr, 2e-4);
        // A table merges into the base's: its temperature stays.
        let c0 = g.config(&g.rows[0], 7).unwrap();
        assert_eq!(
            serde_json::to_value(&c0.loss).unwrap()["kind"],
            Value::from("univariate")
        );
        assert_eq!(c0.loss.temperature, 0.07);
        assert_eq!(
            serde_json::to_value(&c.loss).unwrap()["terms"],
            serde_json::json!(["P", "IQ"])
        );
    }

    #[test]
    fn mistakes_name_the_file_and_the_row_or_key() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&str, &[&str]); 6] = [
            (
                "[[axes]]\nname = \"x\"\nkey = \"loss.kind\"\nvalues = [\"bivariate\"]\n",
                &["grid.toml", "row `bivariate`", "bivariate"],
            ),
            (
                "[[axes]]\nname = \"x\"\nkey = \"optimizer.lrr\"\nvalues = [1]\n",
                &["grid.toml", "row `1`", "lrr"],
            ),
            (
                "[[axes]]\nname = \"x\"\nkey = \"epochs\"\nvalues = [0]\n",
                &["grid.toml", "row `0`", "`epochs` must be at least 1"],
            ),
            (
                "[[axes]]\nname = \"x\"\nkey = \"epochs\"\nvalues = [1, 2]\nlabels = [\"a\"]\n",
                &["grid.toml", "`x`", "1 labels for 2 values"],
            ),
            ("seeds = [1, 1]\n", &["grid.toml", "repeats a seed"]),
            (
                "[paper]\nmeasure = \"m\"\nvalues = { nope = 1.0 }\n",
                &["grid.toml", "`nope`", "no row"],
            ),
        ];
        for (body, needles) in cases {
            let err = grid(dir.path(), body).unwrap_err().to_string();
            for n in needles {
                assert!(err.contains(n), "{body:?}: {err:?} lacks {n:?}");
            }
        }
        let err = grid(dir.path(), "seeds = \"x\"\n").unwrap_err().to_string();
        assert!(err.contains("line 3"), "{err}");
    }
}
