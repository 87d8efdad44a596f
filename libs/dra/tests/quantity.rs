//! Quantities: the cases that matter, properties over generated values, and a
//! differential run against Kubernetes' own implementation
//! (`tools/quantity-oracle`, built from k8s.io/apimachinery v0.36.3).

mod support;

use support::Random;

use proptest::prelude::*;
use switchyard_dra::{Format, ParseError, Quantity};

fn q(s: &str) -> Quantity {
    Quantity::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn exact_values_and_comparisons() {
    assert_eq!(q("1Ki"), q("1024"));
    assert!(q("40Gi") < q("42949672961"));
    assert_eq!(q("40Gi"), q("42949672960"));
    assert_ne!(q("9007199254740993"), q("9007199254740992"));
    assert!(q("9007199254740993") > q("9007199254740992"));
    assert_eq!(q("1.5"), q("1500m"));
    assert_eq!(q("1e3"), q("1k"));
    assert!(q("999m") < q("1"));
    assert!(q("-1") < q("0"));
    // Far beyond i64, still exact.
    assert!(q("123456789012345678901234567890") < q("123456789012345678901234567891"));
}

#[test]
fn canonical_forms() {
    let cases = [
        ("1.5", "1500m", Format::DecimalSI),
        ("1000", "1k", Format::DecimalSI),
        ("1.0", "1", Format::DecimalSI),
        ("2048Ki", "2Mi", Format::BinarySI),
        ("1536Ki", "1536Ki", Format::BinarySI),
        ("1.5Gi", "1536Mi", Format::BinarySI),
        ("512", "512", Format::DecimalSI),
        ("1e3", "1e3", Format::DecimalExponent),
        ("1E3", "1e3", Format::DecimalExponent),
        ("12e-1", "1200e-3", Format::DecimalExponent),
        ("0.1n", "1n", Format::DecimalSI),
        ("-0.1n", "-1n", Format::DecimalSI),
        ("-1.5", "-1500m", Format::DecimalSI),
        ("0.5Ki", "512", Format::BinarySI),
        ("1000E", "1", Format::DecimalSI),
    ];
    for (input, canonical, format) in cases {
        let parsed = q(input);
        assert_eq!(parsed.canonical(), canonical, "{input}");
        assert_eq!(parsed.format(), format, "{input}");
    }
    // The text Kubernetes keeps: the input where its fast path deems it canonical.
    assert_eq!(q("01").to_string(), "01");
    assert_eq!(q("1E3").to_string(), "1E3");
    assert_eq!(q("1000").to_string(), "1k");
    assert_eq!(q("100Mi").to_string(), "100Mi");
    assert_eq!(q("2048Ki").to_string(), "2Mi");
}

#[test]
fn kubernetes_rounding_and_caps() {
    // Finer than a nano rounds up, away from zero.
    assert_eq!(q("1.0000000001"), q("1000000001n"));
    assert_eq!(q("-1.0000000001"), q("-1000000001n"));
    // BinarySI is capped at 2^63-1.
    assert_eq!(q("9223372036854775807Ki"), Quantity::from_i64(i64::MAX));
    assert_eq!(q("16Ei"), Quantity::from_i64(i64::MAX));
    // A BinarySI value between 0 and 1 becomes DecimalSI.
    assert_eq!(q("0.0001Ki").format(), Format::DecimalSI);
}

#[test]
fn bad_quantities_are_refused_in_kubernetes_words() {
    assert_eq!(Quantity::parse(""), Err(ParseError::FormatWrong));
    assert_eq!(Quantity::parse("1x"), Err(ParseError::FormatWrong));
    assert_eq!(Quantity::parse("1 "), Err(ParseError::FormatWrong));
    assert_eq!(Quantity::parse("1Kii"), Err(ParseError::Suffix));
    assert_eq!(Quantity::parse("1e"), Err(ParseError::Suffix));
    assert_eq!(Quantity::parse(".e-10"), Err(ParseError::Numeric));
    assert_eq!(
        ParseError::Suffix.to_string(),
        "unable to parse quantity's suffix"
    );
    // The fast path's reading of a lone point.
    assert!(q(".").is_zero());
}

/// Found by the fuzz target: huge exponents are compared, printed and
/// converted without building 10^exponent.
#[test]
fn huge_exponents_cost_nothing() {
    let huge = q("7E1402002004");
    assert!(huge > q("1e18"));
    assert!(q("-7E1402002004") < q("-1"));
    assert!(q("1e-2000000000") > q("0"), "rounded up to a nano");
    assert_eq!(huge.as_i64(), None);
    assert_eq!(huge.canonical(), "70e1402002003");
    assert_eq!(
        q("1e2000000000").cmp(&q("10e1999999999")),
        std::cmp::Ordering::Equal
    );
    // A sum that would need billions of digits keeps the larger operand.
    assert_eq!(huge.add(&q("1")), huge);
    assert_eq!(q("1").sub(&huge), q("-7E1402002004"));
}

#[test]
fn arithmetic_keeps_the_receivers_format() {
    let sum = q("1Gi").add(&q("512Mi"));
    assert_eq!(sum.to_string(), "1536Mi");
    assert_eq!(sum.format(), Format::BinarySI);
    let zero_plus = Quantity::zero().add(&q("1Ki"));
    assert_eq!(zero_plus.format(), Format::BinarySI);
    assert_eq!(q("1").sub(&q("1500m")).to_string(), "-500m");
    assert_eq!(q("8").sub(&q("8")).to_string(), "0");
    assert_eq!(q("3").as_i64(), Some(3));
    assert_eq!(q("1500m").as_i64(), None);
    assert_eq!(q("1e30").as_i64(), None);
}

fn quantity() -> impl Strategy<Value = Quantity> {
    (
        // Within ±10^18: BinarySI values beyond 2^63-1 are capped when read.
        -1_000_000_000_000i64..1_000_000_000_000,
        -9i32..=6,
        prop_oneof![
            Just(Format::DecimalSI),
            Just(Format::BinarySI),
            Just(Format::DecimalExponent)
        ],
    )
        .prop_map(|(m, e, f)| Quantity::from_parts(m, e, f))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// The canonical text parses back to the same value; read back, its
    /// canonical text is a fixed point (the format may change on the first
    /// reading: a BinarySI value with no binary suffix reads as DecimalSI).
    #[test]
    fn canonical_text_round_trips(a in quantity()) {
        let text = a.canonical();
        let back = Quantity::parse(&text).unwrap();
        prop_assert_eq!(&back, &a, "{}", text);
        let again = Quantity::parse(&back.canonical()).unwrap();
        prop_assert_eq!(again.canonical(), back.canonical());
        if a.format() != Format::BinarySI {
            prop_assert_eq!(back.canonical(), text);
        }
    }

    /// Order and arithmetic are consistent and exact.
    #[test]
    fn order_and_arithmetic_are_exact(a in quantity(), b in quantity()) {
        prop_assert_eq!(a.add(&b).sub(&b), a.clone());
        prop_assert_eq!(a.cmp(&b), a.sub(&b).sign().cmp(&0));
        prop_assert_eq!(a.add(&b), b.add(&a));
        prop_assert_eq!(a.sub(&a).sign(), 0);
    }

    /// Any string: a value or one of the three errors, never a panic.
    #[test]
    fn any_text_parses_or_is_refused(s in "[-+]?[0-9.]{0,25}[eEinumkKMGTP]{0,2}[-+]?[0-9]{0,4}") {
        let _ = Quantity::parse(&s);
    }
}

/// Runs Kubernetes' implementation over `requests` (see tools/quantity-oracle).
fn oracle(requests: &[String]) -> Vec<String> {
    support::run_oracle("quantity-oracle", requests.join("\n") + "\n")
        .lines()
        .map(str::to_string)
        .collect()
}

fn format_name(f: Format) -> &'static str {
    match f {
        Format::DecimalExponent => "DecimalExponent",
        Format::BinarySI => "BinarySI",
        Format::DecimalSI => "DecimalSI",
    }
}

fn ours(request: &str) -> String {
    let f: Vec<&str> = request.split(' ').collect();
    let parse = |s: &str| Quantity::parse(s);
    match f[0] {
        "parse" => match parse(f[1]) {
            Ok(v) => format!("ok {v} {} {}", v.canonical(), format_name(v.format())),
            Err(e) => format!("err {e}"),
        },
        op => match (parse(f[1]), parse(f[2])) {
            (Err(e), _) | (_, Err(e)) => format!("err {e}"),
            (Ok(a), Ok(b)) => match op {
                "cmp" => format!("ok {}", a.cmp(&b) as i8),
                "add" => {
                    let r = a.add(&b);
                    format!("ok {r} {}", format_name(r.format()))
                }
                _ => {
                    let r = a.sub(&b);
                    format!("ok {r} {}", format_name(r.format()))
                }
            },
        },
    }
}

/// A deterministic generator of quantity-like strings, valid and not.
struct Gen(u64);

impl support::Random for Gen {
    fn state(&mut self) -> &mut u64 {
        &mut self.0
    }
}

impl Gen {
    fn digits(&mut self, max: u64) -> String {
        let n = self.next() % (max + 1);
        (0..n)
            .map(|_| char::from(b'0' + (self.next() % 10) as u8))
            .collect()
    }
    fn quantity(&mut self) -> String {
        let sign = self.pick(&["", "", "", "-", "+"]);
        let lead = self.pick(&["", "", "", "0", "00"]);
        let long = self.next().is_multiple_of(4);
        let int = self.digits(if long { 24 } else { 6 });
        let frac = match self.next() % 3 {
            0 => format!(".{}", self.digits(12)),
            _ => String::new(),
        };
        let suffix = match self.next() % 4 {
            0 => self
                .pick(&["", "n", "u", "m", "k", "M", "G", "T", "P", "E"])
                .to_string(),
            1 => self.pick(&["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]).to_string(),
            2 => format!(
                "{}{}{}",
                self.pick(&["e", "E"]),
                self.pick(&["", "-", "+"]),
                self.digits(2)
            ),
            _ => self
                .pick(&["", "", "Kii", "x", "e", "i", "mi", "kk", " "])
                .to_string(),
        };
        format!("{sign}{lead}{int}{frac}{suffix}")
    }
}

#[test]
fn kubernetes_agrees_on_every_generated_case() {
    let mut g = Gen(0x5157_4c4e_4152_4459);
    let mut requests = Vec::new();
    for _ in 0..6000 {
        let a = g.quantity();
        if a.contains(' ') || a.is_empty() {
            continue;
        }
        requests.push(format!("parse {a}"));
        let b = g.quantity();
        if b.contains(' ') || b.is_empty() {
            continue;
        }
        let op = g.pick(&["cmp", "add", "sub"]);
        requests.push(format!("{op} {a} {b}"));
    }
    let theirs = oracle(&requests);
    assert_eq!(theirs.len(), requests.len(), "one answer per request");
    let mut differ = Vec::new();
    for ((request, theirs), ours) in requests
        .iter()
        .zip(&theirs)
        .zip(requests.iter().map(|r| ours(r)))
    {
        if *theirs != ours {
            differ.push(format!(
                "{request}\n  kubernetes: {theirs}\n  ours:       {ours}"
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "{} of {} cases differ:\n{}",
        differ.len(),
        requests.len(),
        differ
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
