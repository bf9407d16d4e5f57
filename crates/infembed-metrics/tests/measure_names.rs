//! Measure names (trec_eval's spelling) and serialisation of results.

use infembed_metrics::{Error, Evaluation, Measure, Qrels, Run, evaluate};

#[test]
fn names_round_trip_and_follow_trec_eval_spelling() {
    let all = Measure::trec_eval_all();
    assert_eq!(all.len(), 46);
    for m in &all {
        assert_eq!(m.to_string().parse::<Measure>().unwrap(), *m);
    }
    let names: Vec<String> = all.iter().map(ToString::to_string).collect();
    for expected in [
        "map",
        "Rprec",
        "recip_rank",
        "P_5",
        "recall_1000",
        "ndcg",
        "ndcg_cut_10",
        "map_cut_100",
        "success_1",
        "num_rel_ret",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected} missing");
    }
    assert_eq!(
        "recip_rank_cut_10".parse::<Measure>().unwrap(),
        Measure::RecipRankCut(10)
    );
}

#[test]
fn bad_names_are_typed_errors() {
    for bad in [
        "MAP",
        "P_",
        "P_x",
        "P_-1",
        "P_+5",
        "ndcg_cut",
        "recall_5.0",
        "gm_map",
        "",
    ] {
        assert!(
            matches!(bad.parse::<Measure>(), Err(Error::UnknownMeasure { .. })),
            "{bad}"
        );
    }
    assert!(matches!(
        "P_0".parse::<Measure>(),
        Err(Error::ZeroCutoff { .. })
    ));
    let qrels = Qrels::from_entries([("q", "d", 1)]).unwrap();
    let run = Run::from_entries([("q", "d", 1.0)]).unwrap();
    assert!(matches!(
        evaluate(&qrels, &run, &[Measure::NdcgCut(0)]),
        Err(Error::ZeroCutoff { .. })
    ));
    assert_eq!(
        Measure::parse_list("map, P_5 map\tndcg_cut_10").unwrap(),
        [Measure::Map, Measure::P(5), Measure::NdcgCut(10)]
    );
}

#[test]
fn evaluation_serialises_with_measure_names() {
    let qrels = Qrels::from_entries([("q", "d", 1)]).unwrap();
    let run = Run::from_entries([("q", "d", 1.0), ("q", "e", 2.0)]).unwrap();
    let eval = evaluate(&qrels, &run, &[Measure::RecipRank, Measure::NumRet]).unwrap();
    let json = serde_json::to_string(&eval).unwrap();
    assert!(
        json.contains("\"recip_rank\"") && json.contains("\"num_ret\""),
        "{json}"
    );
    let back: Evaluation = serde_json::from_str(&json).unwrap();
    assert_eq!(back, eval);
    assert_eq!(back.value("q", Measure::RecipRank), Some(0.5));
}
