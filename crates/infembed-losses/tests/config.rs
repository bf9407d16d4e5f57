//! `LossConfig`: serde form, defaults, the mapping of kind x convention onto objectives, and the
//! typed errors for every invalid combination and bad file.

use std::io::Write;

use infembed_losses::{
    Convention, Error, LossConfig, Objective, ObjectiveKind, PositiveCount, Reduction, Scale,
    Variable, VariableSet,
};

use Variable::*;

#[test]
fn minimal_json_takes_the_defaults() {
    let c =
        LossConfig::from_json_str(r#"{"kind": "univariate", "terms": ["P", "I", "IQ"]}"#).unwrap();
    assert_eq!(c.kind, ObjectiveKind::Univariate);
    assert_eq!(c.terms, vec![P, I, Iq]);
    assert_eq!(c.temperature, 0.05);
    assert_eq!(c.scale, Scale::InverseTemperature);
    assert_eq!(c.convention, Convention::Paper);
    assert_eq!(c.positive, None);
    assert_eq!(c.reduction, Reduction::Mean);
    assert_eq!(c.logit_scale(), 20.0);
}

#[test]
fn full_json_round_trips() {
    let json = r#"{"kind": "multivariate", "terms": ["IQ", "P"], "temperature": 0.02,
        "scale": "reference_code", "convention": "paper", "positive": "once", "reduction": "sum"}"#;
    let c = LossConfig::from_json_str(json).unwrap();
    assert_eq!(c.positive, Some(PositiveCount::Once));
    assert_eq!(c.scale, Scale::ReferenceCode);
    assert_eq!(c.reduction, Reduction::Sum);
    assert!((c.logit_scale() - 1.0 / 0.0201).abs() < 1e-12);
    let back: LossConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
    assert_eq!(
        c.objective().unwrap(),
        Objective::Joint(VariableSet::of(&[P, Iq]), PositiveCount::Once)
    );
}

#[test]
fn kind_and_convention_map_onto_objectives() {
    let all = VariableSet::ALL;
    let cases = [
        (
            ObjectiveKind::Univariate,
            Convention::Paper,
            Objective::SumOfTerms(all),
        ),
        (
            ObjectiveKind::Multivariate,
            Convention::Paper,
            Objective::Joint(all, PositiveCount::PerMarginal),
        ),
        (
            ObjectiveKind::Univariate,
            Convention::ReferenceCode,
            Objective::Joint(all, PositiveCount::Once),
        ),
        (
            ObjectiveKind::Multivariate,
            Convention::ReferenceCode,
            Objective::SumOfTerms(all),
        ),
    ];
    for (kind, convention, want) in cases {
        let c = LossConfig::new(kind, &[P, I, Iq]).with_convention(convention);
        assert_eq!(c.objective().unwrap(), want, "{kind:?} {convention:?}");
        assert_eq!(c.init().unwrap().objective(), want);
    }
    // Reference-code univariate over one variable is the plain InfoNCE (`basic qk`).
    let c =
        LossConfig::new(ObjectiveKind::Univariate, &[P]).with_convention(Convention::ReferenceCode);
    assert_eq!(
        c.objective().unwrap(),
        Objective::Joint(VariableSet::of(&[P]), PositiveCount::Once)
    );
}

#[test]
fn invalid_combinations_are_typed_errors() {
    let empty = LossConfig::new(ObjectiveKind::Univariate, &[]);
    assert!(matches!(empty.init(), Err(Error::EmptyTerms)));

    let dup = LossConfig::new(ObjectiveKind::Univariate, &[P, I, P]);
    assert!(matches!(dup.init(), Err(Error::DuplicateTerm(Variable::P))));

    for convention in [Convention::Paper, Convention::ReferenceCode] {
        let single =
            LossConfig::new(ObjectiveKind::Multivariate, &[Iq]).with_convention(convention);
        let err = single.init().unwrap_err();
        assert!(matches!(
            err,
            Error::SingleVariableMultivariate(Variable::Iq)
        ));
        assert!(err.to_string().contains("`kind`"), "{err}");
    }

    for t in [0.0, -0.05, f64::NAN, f64::INFINITY] {
        let c = LossConfig::new(ObjectiveKind::Univariate, &[P]).with_temperature(t);
        let err = c.init().unwrap_err();
        assert!(matches!(err, Error::InvalidTemperature(_)), "{t}");
        assert!(err.to_string().contains("`temperature`"));
    }

    // `positive` has no meaning for a sum of separate softmaxes.
    let c = LossConfig::new(ObjectiveKind::Univariate, &[P, I]).with_positive(PositiveCount::Once);
    assert!(matches!(c.init(), Err(Error::PositiveNotApplicable { .. })));
    let c = LossConfig::new(ObjectiveKind::Multivariate, &[P, I])
        .with_convention(Convention::ReferenceCode)
        .with_positive(PositiveCount::PerMarginal);
    assert!(matches!(c.init(), Err(Error::PositiveNotApplicable { .. })));
}

#[test]
fn unknown_fields_and_bad_values_are_rejected_with_position() {
    let err = LossConfig::from_json_str(r#"{"kind": "univariate", "terms": ["P"], "temp": 1}"#)
        .unwrap_err();
    assert!(err.to_string().contains("temp"), "{err}");
    let err =
        LossConfig::from_json_str("{\"kind\": \"univariate\",\n \"terms\": [\"Q\"]}").unwrap_err();
    assert_eq!(err.line(), 2, "{err}");
    let err = LossConfig::from_json_str(r#"{"terms": ["P"]}"#).unwrap_err();
    assert!(err.to_string().contains("kind"), "{err}");
}

fn temp_file(name: &str, contents: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("infembed-losses-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(contents.as_bytes())
        .unwrap();
    path
}

#[test]
fn config_files_report_file_line_and_problem() {
    let good = temp_file(
        "good.json",
        r#"{"kind": "multivariate", "terms": ["P", "I"]}"#,
    );
    let c = LossConfig::from_json_file(&good).unwrap();
    assert_eq!(
        c.objective().unwrap(),
        Objective::Joint(VariableSet::of(&[P, I]), PositiveCount::PerMarginal)
    );

    let missing = good.with_file_name("absent.json");
    let err = LossConfig::from_json_file(&missing).unwrap_err();
    assert!(matches!(err, Error::Io { .. }));
    assert!(err.to_string().contains("absent.json"), "{err}");

    let syntax = temp_file(
        "syntax.json",
        "{\n  \"kind\": \"univariate\",\n  \"terms\": [\"P\",]\n}",
    );
    let err = LossConfig::from_json_file(&syntax).unwrap_err();
    match &err {
        Error::Parse { path, line, .. } => {
            assert_eq!(path, &syntax);
            assert_eq!(*line, 3);
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
    assert!(
        err.to_string().contains("syntax.json") && err.to_string().contains("line 3"),
        "{err}"
    );

    let invalid = temp_file(
        "invalid.json",
        r#"{"kind": "multivariate", "terms": ["P"]}"#,
    );
    let err = LossConfig::from_json_file(&invalid).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidFile { source, .. } if matches!(**source, Error::SingleVariableMultivariate(_)))
    );
    assert!(err.to_string().contains("invalid.json"), "{err}");
    assert!(std::error::Error::source(&err).is_some());
}

#[test]
fn burn_config_trait_saves_and_loads() {
    use burn::config::Config;
    let c = LossConfig::new(ObjectiveKind::Multivariate, &[I, Iq]).with_temperature(0.1);
    let path = temp_file("saved.json", "");
    c.save(&path).unwrap();
    let back = LossConfig::load(&path).unwrap();
    assert_eq!(back, c);
}
