//! Porter's stemmer, as Martin Porter's own C implementation applies it (and so as Lucene's
//! `PorterStemFilter`, Pyserini's default, does): the 1980 algorithm with the author's two
//! later departures (`-bli` -> `-ble` and `-logi` -> `-log` in step 2) and words of one or two
//! characters left alone.
//!
//! Written from the algorithm's description (M. F. Porter, "An algorithm for suffix stripping",
//! Program 14(3), 1980). Checked against NLTK's `PorterStemmer(mode=MARTIN_EXTENSIONS)` on every
//! word of the shipped collections (`tests/fixtures/porter.tsv`, made by
//! `tests/fixtures/make_porter.py`).
//!
//! The word is handled as characters: `a e i o u` are vowels, `y` is a vowel after a consonant,
//! everything else (other letters, digits, accented letters) is a consonant, as in the C code.

/// The English stop words of Lucene's `EnglishAnalyzer` (`ENGLISH_STOP_WORDS_SET`), which
/// Pyserini's default analyzer removes.
pub(crate) const LUCENE_ENGLISH_STOPWORDS: [&str; 33] = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these",
    "they", "this", "to", "was", "will", "with",
];

/// The Porter stem of a lower-cased word.
pub fn porter_stem(word: &str) -> String {
    let chars: Vec<char> = word.chars().collect();
    if chars.len() <= 2 {
        return word.to_string();
    }
    let mut w = Word { b: chars, j: 0 };
    w.step1ab();
    if w.b.len() > 1 {
        w.step1c();
        w.step2();
        w.step3();
        w.step4();
        w.step5();
    }
    w.b.into_iter().collect()
}

/// The word being stemmed (`b`, its current end is `b.len()`) and `j`, the length of the stem
/// before the suffix that [`Word::ends`] last matched.
struct Word {
    b: Vec<char>,
    j: usize,
}

impl Word {
    /// Whether `b[i]` is a consonant.
    fn cons(&self, i: usize) -> bool {
        match self.b[i] {
            'a' | 'e' | 'i' | 'o' | 'u' => false,
            'y' => i == 0 || !self.cons(i - 1),
            _ => true,
        }
    }

    /// The measure m of `b[..len]`: the number of vowel-consonant sequences in [C](VC)^m[V].
    fn measure(&self, len: usize) -> usize {
        let mut i = 0;
        // skip the leading consonants
        while i < len && self.cons(i) {
            i += 1;
        }
        let mut m = 0;
        loop {
            // a run of vowels ...
            while i < len && !self.cons(i) {
                i += 1;
            }
            if i >= len {
                return m;
            }
            // ... followed by a run of consonants closes one VC
            while i < len && self.cons(i) {
                i += 1;
            }
            m += 1;
        }
    }

    /// m of the stem before the last matched suffix.
    fn m(&self) -> usize {
        self.measure(self.j)
    }

    /// Whether the stem `b[..j]` holds a vowel.
    fn vowel_in_stem(&self) -> bool {
        (0..self.j).any(|i| !self.cons(i))
    }

    /// Whether `b[..len]` ends in a double consonant.
    fn double_cons(&self, len: usize) -> bool {
        len >= 2 && self.b[len - 1] == self.b[len - 2] && self.cons(len - 1)
    }

    /// Whether `b[..len]` ends consonant-vowel-consonant, the last not `w`, `x` or `y`
    /// (`-cav(e)`, `-lov(e)`, `-hop(e)`, not `-snow`, `-box`, `-tray`).
    fn cvc(&self, len: usize) -> bool {
        if len < 3 || !self.cons(len - 1) || self.cons(len - 2) || !self.cons(len - 3) {
            return false;
        }
        !matches!(self.b[len - 1], 'w' | 'x' | 'y')
    }

    /// Whether the word ends with `suffix` (ASCII, as every suffix of the rules is); if so, `j`
    /// becomes the length before it.
    fn ends(&mut self, suffix: &str) -> bool {
        debug_assert!(suffix.is_ascii());
        let n = suffix.len();
        if n > self.b.len()
            || !self.b[self.b.len() - n..]
                .iter()
                .copied()
                .eq(suffix.chars())
        {
            return false;
        }
        self.j = self.b.len() - n;
        true
    }

    /// Replaces the matched suffix (everything after `j`) with `with`.
    fn set_to(&mut self, with: &str) {
        self.b.truncate(self.j);
        self.b.extend(with.chars());
    }

    /// [`Word::set_to`] when m > 0.
    fn replace_if_m(&mut self, with: &str) {
        if self.m() > 0 {
            self.set_to(with);
        }
    }

    fn last(&self, back: usize) -> Option<char> {
        self.b.len().checked_sub(back + 1).map(|i| self.b[i])
    }

    /// Plurals and -ed / -ing.
    fn step1ab(&mut self) {
        if self.last(0) == Some('s') {
            if self.ends("sses") {
                self.b.truncate(self.b.len() - 2);
            } else if self.ends("ies") {
                self.set_to("i");
            } else if self.last(1) != Some('s') {
                self.b.pop();
            }
        }
        if self.ends("eed") {
            if self.m() > 0 {
                self.b.pop();
            }
        } else if (self.ends("ed") || self.ends("ing")) && self.vowel_in_stem() {
            self.b.truncate(self.j);
            let len = self.b.len();
            if self.ends("at") {
                self.set_to("ate");
            } else if self.ends("bl") {
                self.set_to("ble");
            } else if self.ends("iz") {
                self.set_to("ize");
            } else if self.double_cons(len) {
                if !matches!(self.b[len - 1], 'l' | 's' | 'z') {
                    self.b.pop();
                }
            } else {
                self.j = len;
                if self.m() == 1 && self.cvc(len) {
                    self.b.push('e');
                }
            }
        }
    }

    /// Terminal y -> i when the stem has a vowel.
    fn step1c(&mut self) {
        if self.ends("y") && self.vowel_in_stem() {
            let last = self.b.len() - 1;
            self.b[last] = 'i';
        }
    }

    /// Double suffixes to single ones, when m > 0. The first suffix that matches decides, as
    /// in the C code, whether or not its condition holds.
    fn step2(&mut self) {
        const RULES: &[(char, &[(&str, &str)])] = &[
            ('a', &[("ational", "ate"), ("tional", "tion")]),
            ('c', &[("enci", "ence"), ("anci", "ance")]),
            ('e', &[("izer", "ize")]),
            (
                'l',
                &[
                    ("bli", "ble"),
                    ("alli", "al"),
                    ("entli", "ent"),
                    ("eli", "e"),
                    ("ousli", "ous"),
                ],
            ),
            (
                'o',
                &[("ization", "ize"), ("ation", "ate"), ("ator", "ate")],
            ),
            (
                's',
                &[
                    ("alism", "al"),
                    ("iveness", "ive"),
                    ("fulness", "ful"),
                    ("ousness", "ous"),
                ],
            ),
            ('t', &[("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")]),
            ('g', &[("logi", "log")]),
        ];
        self.apply(self.last(1), RULES);
    }

    /// -ic-, -full, -ness etc., when m > 0.
    fn step3(&mut self) {
        const RULES: &[(char, &[(&str, &str)])] = &[
            ('e', &[("icate", "ic"), ("ative", ""), ("alize", "al")]),
            ('i', &[("iciti", "ic")]),
            ('l', &[("ical", "ic"), ("ful", "")]),
            ('s', &[("ness", "")]),
        ];
        self.apply(self.last(0), RULES);
    }

    /// The rules of the group `key` selects: the first suffix that matches is replaced when
    /// m > 0.
    fn apply(&mut self, key: Option<char>, rules: &[(char, &[(&str, &str)])]) {
        let Some(key) = key else { return };
        let Some((_, group)) = rules.iter().find(|(c, _)| *c == key) else {
            return;
        };
        for (suffix, with) in *group {
            if self.ends(suffix) {
                self.replace_if_m(with);
                return;
            }
        }
    }

    /// -ant, -ence etc. dropped when m > 1.
    fn step4(&mut self) {
        let matched = match self.last(1) {
            Some('a') => self.ends("al"),
            Some('c') => self.ends("ance") || self.ends("ence"),
            Some('e') => self.ends("er"),
            Some('i') => self.ends("ic"),
            Some('l') => self.ends("able") || self.ends("ible"),
            Some('n') => {
                self.ends("ant") || self.ends("ement") || self.ends("ment") || self.ends("ent")
            }
            Some('o') => {
                (self.ends("ion") && self.j >= 1 && matches!(self.b[self.j - 1], 's' | 't'))
                    || self.ends("ou")
            }
            Some('s') => self.ends("ism"),
            Some('t') => self.ends("ate") || self.ends("iti"),
            Some('u') => self.ends("ous"),
            Some('v') => self.ends("ive"),
            Some('z') => self.ends("ize"),
            _ => false,
        };
        if matched && self.m() > 1 {
            self.b.truncate(self.j);
        }
    }

    /// A final -e dropped when m > 1 (or m = 1 and not *o), and -ll -> -l when m > 1.
    fn step5(&mut self) {
        let len = self.b.len();
        self.j = len;
        if self.last(0) == Some('e') {
            let m = self.measure(len - 1);
            if m > 1 || (m == 1 && !self.cvc(len - 1)) {
                self.b.pop();
            }
        }
        let len = self.b.len();
        if self.last(0) == Some('l') && self.double_cons(len) && self.measure(len) > 1 {
            self.b.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples of Porter's paper.
    #[test]
    fn the_papers_examples() {
        for (word, stem) in [
            ("caresses", "caress"),
            ("ponies", "poni"),
            ("ties", "ti"),
            ("caress", "caress"),
            ("cats", "cat"),
            ("feed", "feed"),
            ("agreed", "agre"),
            ("plastered", "plaster"),
            ("bled", "bled"),
            ("motoring", "motor"),
            ("sing", "sing"),
            ("conflated", "conflat"),
            ("troubled", "troubl"),
            ("sized", "size"),
            ("hopping", "hop"),
            ("tanned", "tan"),
            ("falling", "fall"),
            ("hissing", "hiss"),
            ("fizzed", "fizz"),
            ("failing", "fail"),
            ("filing", "file"),
            ("happy", "happi"),
            ("sky", "sky"),
            ("relational", "relat"),
            ("conditional", "condit"),
            ("rational", "ration"),
            ("valenci", "valenc"),
            ("digitizer", "digit"),
            ("vietnamization", "vietnam"),
            ("predication", "predic"),
            ("operator", "oper"),
            ("feudalism", "feudal"),
            ("decisiveness", "decis"),
            ("hopefulness", "hope"),
            ("formaliti", "formal"),
            ("sensitiviti", "sensit"),
            ("sensibiliti", "sensibl"),
            ("triplicate", "triplic"),
            ("formative", "form"),
            ("formalize", "formal"),
            ("electriciti", "electr"),
            ("electrical", "electr"),
            ("hopeful", "hope"),
            ("goodness", "good"),
            ("revival", "reviv"),
            ("allowance", "allow"),
            ("inference", "infer"),
            ("airliner", "airlin"),
            ("adjustable", "adjust"),
            ("defensible", "defens"),
            ("irritant", "irrit"),
            ("replacement", "replac"),
            ("adjustment", "adjust"),
            ("dependent", "depend"),
            ("adoption", "adopt"),
            ("homologou", "homolog"),
            ("communism", "commun"),
            ("activate", "activ"),
            ("angulariti", "angular"),
            ("homologous", "homolog"),
            ("effective", "effect"),
            ("bowdlerize", "bowdler"),
            ("probate", "probat"),
            ("rate", "rate"),
            ("cease", "ceas"),
            ("controll", "control"),
            ("roll", "roll"),
            ("generalizations", "gener"),
            ("oscillators", "oscil"),
        ] {
            assert_eq!(porter_stem(word), stem, "{word}");
        }
    }

    /// Every word of the shipped InF-IR sample, against NLTK's Porter stemmer in Martin
    /// Porter's variant (fixture and generator in tests/fixtures/).
    #[test]
    fn every_word_of_the_sample_stems_as_nltk_does() {
        let fixture = include_str!("../tests/fixtures/porter.tsv");
        let mut checked = 0;
        let mut wrong = Vec::new();
        for line in fixture.lines().filter(|l| !l.starts_with('#')) {
            let (word, stem) = line.split_once('\t').expect("word<TAB>stem");
            let ours = porter_stem(word);
            if ours != stem {
                wrong.push(format!("{word}: nltk {stem}, ours {ours}"));
            }
            checked += 1;
        }
        assert!(checked > 10_000, "{checked} words");
        assert!(
            wrong.is_empty(),
            "{} of {checked} differ: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(20)]
        );
    }

    #[test]
    fn short_words_digits_and_other_letters_are_safe() {
        assert_eq!(porter_stem("as"), "as");
        assert_eq!(porter_stem("is"), "is");
        assert_eq!(porter_stem(""), "");
        assert_eq!(porter_stem("1990s"), "1990");
        assert_eq!(porter_stem("ss"), "ss");
        // y after y is a vowel: "yyy" ends in a consonant y after a vowel y
        assert_eq!(porter_stem("yyy"), "yyi");
    }
}
