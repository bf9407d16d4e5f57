//! TREC SGML / qrels and SMART parsers on small inline inputs.

use infembed_data::Error;
use infembed_data::load::smart::read_smart;
use infembed_data::load::trec::{read_trec_docs, read_trec_qrels, read_trec_topics};

fn tmp(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.txt");
    std::fs::write(&p, text).unwrap();
    (dir, p)
}

#[test]
fn trec_docs_with_fields_and_normalised_text() {
    let (_d, p) = tmp(
        "<DOC>\n<DOCNO> FT-1 </DOCNO>\n<HEADLINE>Big\nNews</HEADLINE>\n<TEXT>\n a  < b\n and more\n</TEXT>\n</DOC>\n\n<doc>\n<docno>2</docno>\nplain text\n</doc>\n",
    );
    let docs = read_trec_docs(&p).unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0].id, "FT-1");
    assert_eq!(docs[0].title, "Big News");
    assert_eq!(docs[0].text, "a < b and more");
    assert_eq!(docs[1].id, "2");
    assert_eq!(docs[1].text, "plain text");
}

#[test]
fn trec_topics_classic_and_doc_shaped() {
    let (_d, p) = tmp(
        "<top>\n<num> Number: 301\n<title> International Organized Crime\n\n<desc> Description:\nIdentify organizations.\n\n<narr> Narrative:\nA relevant document must name the group.\n</top>\n<top>\n<num>7</num><title>\n</title>\n<desc>Description: only a description\n</top>\n<DOC>\n<DOCNO> 3 </DOCNO>\n\n What articles exist?\n</DOC>\n",
    );
    let q = read_trec_topics(&p).unwrap();
    assert_eq!(q.len(), 3);
    assert_eq!(q[0].id, "301");
    assert_eq!(q[0].text, "International Organized Crime");
    assert_eq!(
        q[0].instruction.as_deref(),
        Some("A relevant document must name the group.")
    );
    assert_eq!(q[1].id, "7");
    assert_eq!(q[1].text, "only a description");
    assert_eq!(q[1].instruction, None);
    assert_eq!(q[2].id, "3");
    assert_eq!(q[2].text, "What articles exist?");
}

#[test]
fn malformed_sgml_is_reported_with_lines() {
    let (_d, p) = tmp("<DOC>\n<DOCNO>1</DOCNO>\ntext\n<DOC>\n");
    match read_trec_docs(&p).unwrap_err() {
        Error::Format { line, problem, .. } => {
            assert_eq!(line, 4, "{problem}");
        }
        e => panic!("{e:?}"),
    }
    let (_d, p) = tmp("\n\n<DOC>\n<DOCNO>1</DOCNO>\ntext\n");
    match read_trec_docs(&p).unwrap_err() {
        Error::Format { line, problem, .. } => {
            assert_eq!(line, 3);
            assert!(problem.contains("never closed"), "{problem}");
        }
        e => panic!("{e:?}"),
    }
    let (_d, p) = tmp("junk\n<DOC><DOCNO>1</DOCNO>x</DOC>");
    assert!(matches!(
        read_trec_docs(&p).unwrap_err(),
        Error::Format { line: 1, .. }
    ));
    let (_d, p) = tmp("<DOC><DOCNO>1</DOCNO>x</DOC>\n<DOC><DOCNO>1</DOCNO>y</DOC>\n");
    assert!(matches!(
        read_trec_docs(&p).unwrap_err(),
        Error::DuplicateId { line: 2, .. }
    ));
    let (_d, p) = tmp("<DOC>x</DOC>");
    assert!(matches!(
        read_trec_docs(&p).unwrap_err(),
        Error::Format { .. }
    ));
    let (_d, p) = tmp("<top><num>1</num></top>");
    assert!(matches!(
        read_trec_topics(&p).unwrap_err(),
        Error::Format { .. }
    ));
}

#[test]
fn trec_qrels() {
    let (_d, p) = tmp("1 0 d1 1\n1 0 d2 0\n\n2 Q0 d1 2\n");
    let q = read_trec_qrels(&p).unwrap();
    assert_eq!(q["1"]["d1"], 1);
    assert_eq!(q["1"]["d2"], 0);
    assert_eq!(q["2"]["d1"], 2);
    let (_d, p) = tmp("1 0 d1 1\n1 0 d2\n");
    assert!(matches!(
        read_trec_qrels(&p).unwrap_err(),
        Error::Format { line: 2, .. }
    ));
    let (_d, p) = tmp("1 0 d1 yes\n");
    assert!(matches!(
        read_trec_qrels(&p).unwrap_err(),
        Error::Format { line: 1, .. }
    ));
}

#[test]
fn smart_records_fields_and_repeats() {
    let (_d, p) = tmp(
        ".I 1\r\n.T\r\nA title\r\n.A\r\nSomeone\r\n.W\r\n  body one\r\n.W\r\nbody two\r\n.I 2\n.T \nSecond\n.W\nx .Not a marker\n.X\n1\t5\t1\n",
    );
    let recs = read_smart(&p).unwrap();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].id, "1");
    assert_eq!(recs[0].line, 1);
    assert_eq!(recs[0].field('T'), "A title");
    assert_eq!(recs[0].field('W'), "body one body two");
    assert_eq!(recs[0].field('A'), "Someone");
    assert_eq!(recs[1].field('W'), "x .Not a marker");
    assert_eq!(recs[1].field('X'), "1 5 1");
    assert_eq!(recs[1].field('B'), "");
}

#[test]
fn smart_errors() {
    let (_d, p) = tmp("stray\n.I 1\n.W\nx\n");
    assert!(matches!(
        read_smart(&p).unwrap_err(),
        Error::Format { line: 1, .. }
    ));
    let (_d, p) = tmp(".W\nx\n");
    assert!(matches!(
        read_smart(&p).unwrap_err(),
        Error::Format { line: 1, .. }
    ));
    let (_d, p) = tmp(".I 1\n.W\nx\n.I\n");
    assert!(matches!(
        read_smart(&p).unwrap_err(),
        Error::Format { line: 4, .. }
    ));
    let (_d, p) = tmp(".I 1\n.W\nx\n.I 1\n.W\ny\n");
    assert!(matches!(
        read_smart(&p).unwrap_err(),
        Error::DuplicateId { line: 4, .. }
    ));
    let (_d, p) = tmp("");
    assert!(read_smart(&p).unwrap().is_empty());
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad");
    std::fs::write(&bad, b".I 1\n.W\n\xff\n").unwrap();
    assert!(matches!(
        read_smart(&bad).unwrap_err(),
        Error::Utf8 { line: 3, .. }
    ));
}
