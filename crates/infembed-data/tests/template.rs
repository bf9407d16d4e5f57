//! The query template: rules, aliases, serde, and a property test of the parser and the
//! renderer against a naive reference that splits the text at its `{`.

use infembed_data::{Error, QueryTemplate};
use proptest::prelude::*;

#[test]
fn template_rules() {
    assert_eq!(QueryTemplate::default().as_str(), "{query} {instruction}");
    assert_eq!(QueryTemplate::default().render("q", Some("i")), "q i");
    assert_eq!(QueryTemplate::default().render("q", None), "q");
    // An empty instruction still fills the template (the separator stays).
    assert_eq!(QueryTemplate::default().render("q", Some("")), "q ");
    assert_eq!(
        QueryTemplate::new("{Q}").unwrap().render("q", Some("i")),
        "q"
    );
    assert!(!QueryTemplate::new("{query}!").unwrap().has_instruction());
    assert!(QueryTemplate::default().has_instruction());
    assert_eq!(
        QueryTemplate::new("[{I}] -> {Q}!")
            .unwrap()
            .render("{I}", Some("{Q}")),
        "[{Q}] -> {I}!"
    );
    for bad in [
        "{I}",
        "{instruction}",
        "{Q} {Q}",
        "{query} {Q}",
        "{Q} {I} {I}",
        "{query} {instruction} {I}",
        "{q} {I}",
        "{Query} {instruction}",
        "{Q} {",
        "{Q} }",
        "{Q} {X}",
        "plain",
        "",
    ] {
        assert!(
            matches!(QueryTemplate::new(bad), Err(Error::Template { .. })),
            "{bad}"
        );
    }
    let parsed: QueryTemplate = "{I}: {Q}".parse().unwrap();
    assert_eq!(parsed.to_string(), "{I}: {Q}");
}

/// The two spellings render alike, for both orders and the reference's and e5's templates.
#[test]
fn aliases_render_like_the_canonical_placeholders() {
    for (canonical, alias) in [
        ("{query} {instruction}", "{Q} {I}"),
        ("{instruction} {query}", "{I} {Q}"),
        (
            "Instruct: {instruction}\nQuery: {query}",
            "Instruct: {I}\nQuery: {Q}",
        ),
        ("{query} | {instruction}", "{Q} | {instruction}"),
    ] {
        let a = QueryTemplate::new(canonical).unwrap();
        let b = QueryTemplate::new(alias).unwrap();
        for (q, i) in [
            ("what is rust", Some("be brief")),
            ("cats", None),
            ("x", Some("")),
        ] {
            assert_eq!(a.render(q, i), b.render(q, i), "{canonical} vs {alias}");
        }
    }
    assert_eq!(
        QueryTemplate::new("Instruct: {instruction}\nQuery: {query}")
            .unwrap()
            .render("cats", Some("find news")),
        "Instruct: find news\nQuery: cats"
    );
}

#[test]
fn serde_keeps_the_text_and_checks_it() {
    let t = QueryTemplate::new("Instruct: {I}\nQuery: {query}").unwrap();
    let json = serde_json::to_string(&t).unwrap();
    assert_eq!(json, r#""Instruct: {I}\nQuery: {query}""#);
    assert_eq!(serde_json::from_str::<QueryTemplate>(&json).unwrap(), t);
    assert_eq!(
        serde_json::to_string(&QueryTemplate::default()).unwrap(),
        r#""{query} {instruction}""#
    );
    let err = serde_json::from_str::<QueryTemplate>(r#""no slots""#).unwrap_err();
    assert!(err.to_string().contains("{query}"), "{err}");
    assert!(serde_json::from_str::<QueryTemplate>(r#""{query} {x}""#).is_err());
}

/// The naive reading of a template: cut at every `{`; the text before the first must hold no
/// brace, every later part must start with a placeholder name and `}` and hold no other
/// brace. Returns the literals and placeholders (`true` = query) in order, or `None`.
fn naive_parse(t: &str) -> Option<(Vec<String>, Vec<bool>)> {
    let mut parts = t.split('{');
    let first = parts.next().unwrap_or("");
    if first.contains('}') {
        return None;
    }
    let mut literals = vec![first.to_string()];
    let mut slots = Vec::new();
    for part in parts {
        let (is_query, rest) = if let Some(r) = part.strip_prefix("query}") {
            (true, r)
        } else if let Some(r) = part.strip_prefix("Q}") {
            (true, r)
        } else if let Some(r) = part.strip_prefix("instruction}") {
            (false, r)
        } else if let Some(r) = part.strip_prefix("I}") {
            (false, r)
        } else {
            return None;
        };
        if rest.contains('}') {
            return None;
        }
        slots.push(is_query);
        literals.push(rest.to_string());
    }
    let queries = slots.iter().filter(|&&q| q).count();
    (queries == 1 && slots.len() - queries <= 1).then_some((literals, slots))
}

fn naive_render(parsed: &(Vec<String>, Vec<bool>), query: &str, instruction: &str) -> String {
    let (literals, slots) = parsed;
    let mut out = literals[0].clone();
    for (slot, literal) in slots.iter().zip(&literals[1..]) {
        out.push_str(if *slot { query } else { instruction });
        out.push_str(literal);
    }
    out
}

const TOKENS: [&str; 14] = [
    "{",
    "}",
    "{Q}",
    "{I}",
    "{query}",
    "{instruction}",
    "{q}",
    "{Query}",
    "a",
    " ",
    "Q",
    "I",
    "query",
    "\n",
];

proptest! {
    #[test]
    fn parser_and_renderer_match_the_naive_reference(
        tokens in proptest::collection::vec(0usize..TOKENS.len(), 0..8),
        query in "[a-z{}QI ]{0,8}",
        instruction in "[a-z{}QI ]{0,8}",
    ) {
        let text: String = tokens.iter().map(|&t| TOKENS[t]).collect();
        let ours = QueryTemplate::new(&text);
        match naive_parse(&text) {
            None => prop_assert!(ours.is_err(), "{text:?} accepted"),
            Some(parsed) => {
                let t = ours.unwrap();
                prop_assert_eq!(t.as_str(), text.as_str());
                prop_assert_eq!(t.has_instruction(), parsed.1.contains(&false));
                prop_assert_eq!(
                    t.render(&query, Some(&instruction)),
                    naive_render(&parsed, &query, &instruction)
                );
                prop_assert_eq!(t.render(&query, None), query.clone());
            }
        }
    }

    /// Valid templates built from parts: always accepted, rendered as the parts say.
    #[test]
    fn templates_built_from_parts_render_their_parts(
        literals in proptest::collection::vec("[a-zA-Z :|\n]{0,5}", 3),
        query_alias in any::<bool>(),
        instruction in proptest::option::of(any::<bool>()),
        instruction_first in any::<bool>(),
        q in "[a-z{}QI ]{0,8}",
        i in "[a-z{}QI ]{0,8}",
    ) {
        let qs = if query_alias { "{Q}" } else { "{query}" };
        let (text, want) = match instruction {
            None => (
                format!("{}{qs}{}", literals[0], literals[1]),
                format!("{}{q}{}", literals[0], literals[1]),
            ),
            Some(alias) => {
                let is = if alias { "{I}" } else { "{instruction}" };
                let (a, b, va, vb) = if instruction_first {
                    (is, qs, &i, &q)
                } else {
                    (qs, is, &q, &i)
                };
                (
                    format!("{}{a}{}{b}{}", literals[0], literals[1], literals[2]),
                    format!("{}{va}{}{vb}{}", literals[0], literals[1], literals[2]),
                )
            }
        };
        let t = QueryTemplate::new(&text).unwrap();
        prop_assert_eq!(t.render(&q, Some(&i)), want);
        prop_assert_eq!(t.to_string(), text);
    }
}
